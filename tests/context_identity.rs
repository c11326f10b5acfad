//! Contexts are known by what they are (handle and `cuCtxGetId`), not by their handle alone: a
//! reclaim after a context is gone never touches the work of the context made again at its handle,
//! a sticky error's work is released by the user's last release, and a process exiting never sees
//! a driver call of the crate's threads after the driver's teardown. Each case in a process of its
//! own, against the fake driver (which, like the H200's driver, gives a primary context made again
//! the same handle and a new id).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_host_launch::{
    CompletionMode, Device, Error, PrimaryContext, Stream, flush, host_launch, pending_launches,
    release_after, spawn_after,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    Drops, Hold, PATIENCE, fake, fake_driver_path, load_fake_driver, wait_until,
};

/// What the hook makes in the context made again: kept alive past the hook.
type Made = (Arc<PrimaryContext>, Stream, u64, Arc<Drops>);

/// [`Made`] with the stream's hold itself: should an assertion fail, the hold is released before
/// the stream and the retain are dropped (a last release waits for a held stream).
type MadeHeld = (Arc<PrimaryContext>, Stream, Hold<'static>, Arc<Drops>);

/// Polls `future` until it resolves (a thread waker; bounded by `PATIENCE`).
fn resolve<F: std::future::Future + Unpin>(future: &mut F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let waker = Waker::noop();
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Poll::Ready(v) =
            std::pin::Pin::new(&mut *future).poll(&mut Context::from_waker(waker))
        {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the future never resolved"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

isolated_test! {
    /// The last release of a primary context with a sticky error reclaims its pending launches;
    /// another thread that retains the device just after the release was seen (a hook after the
    /// crate's look at the context's state), makes a stream and launches host-function work, an
    /// event release, an event completion and a low-latency completion there, loses none of it:
    /// the new context's work runs and completes in stream order. (Before: the reclaim went by
    /// handle and took the new context's launch, dropped its owner while its stream was held,
    /// resolved its futures to `ContextLost` and freed its low-latency page with the flag write
    /// pending.)
    fn a_reclaim_after_the_last_release_leaves_the_context_made_again_alone(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        load_fake_driver();
        let device = Device::get(0).unwrap();
        let old = PrimaryContext::retain(device).unwrap();
        let old_stream = Stream::new(&old).unwrap();
        let old_drops = Drops::new();
        let hold = fake().hold_stream(old_stream.raw()).unwrap();
        host_launch(&old_stream, {
            let owner = old_drops.owner();
            move || { let _keep = &owner; }
        })
        .unwrap();
        fake().poison_context(old.raw()).unwrap();
        hold.release();
        drop(old_stream);
        // The other thread's work, made between the release and the reclaim.
        let made: Arc<Mutex<Option<Made>>> = Arc::default();
        let futures: Arc<Mutex<Vec<cuda_host_launch::Completion>>> = Arc::default();
        {
            let made = Arc::clone(&made);
            let futures = Arc::clone(&futures);
            fake().set_hook_after("cuDevicePrimaryCtxGetState", 1, move || {
                let made = Arc::clone(&made);
                let futures = Arc::clone(&futures);
                // Another thread (a hook runs on the releasing thread, which must not see its own
                // work as the other thread's).
                std::thread::spawn(move || {
                    let again = PrimaryContext::retain(device).unwrap();
                    let stream = Stream::new(&again).unwrap();
                    let token = fake().hold_stream(stream.raw()).unwrap().into_token();
                    let drops = Drops::new();
                    host_launch(&stream, {
                        let owner = drops.owner();
                        move || { let _keep = &owner; }
                    })
                    .unwrap();
                    release_after(&stream, drops.owner()).unwrap();
                    let mut futures = futures.lock().unwrap();
                    futures.push(CompletionMode::Event.completion(&stream).unwrap());
                    futures.push(CompletionMode::LowLatency.completion(&stream).unwrap());
                    *made.lock().unwrap() = Some((again, stream, token, drops));
                })
                .join()
                .unwrap();
            });
        }
        drop(old);
        fake().clear_hooks();
        flush(PATIENCE).unwrap();
        old_drops.wait_dropped(1);
        let (again, stream, token, drops) = made.lock().unwrap().take().expect("the hook ran");
        assert_eq!(drops.dropped(), 0, "the new context's owners were reclaimed");
        assert_eq!(pending_launches(Some(again.raw())), 3, "the new context's work is pending");
        fake().release_hold(token);
        stream.synchronize().unwrap();
        for future in futures.lock().unwrap().iter_mut() {
            assert!(resolve(future).is_ok(), "a future of the live context failed");
        }
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 2);
        assert_eq!(pending_launches(None), 0);
    }

    /// `PrimaryContext::reset` after a sticky error reclaims the reset context's launch; another
    /// thread that retains the device once the driver's reset has returned (a hook after
    /// `cuDevicePrimaryCtxReset`, before the crate's reclaim), makes a stream and launches there,
    /// loses nothing: the reclaim knows the reset context by its id and takes only its work.
    /// (Mutation testing: with the reset's id matching every context of the handle, the new
    /// context's launch was reclaimed, its owner dropped while its stream was held.)
    fn a_reset_leaves_the_work_of_the_context_made_again_during_it_alone(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        reset_with_work_made_again_during_it(false);
    }

    /// The same when the reset's look at the old context's id fails (`cuCtxGetId` refused once):
    /// on a driver that has ids, the look after the reset decides alone, and the new context's
    /// launch is still left alone. (Before: a failed id look fell back to "every launch of the
    /// handle", as on drivers without ids: the reset returned 2 and dropped the new context's
    /// owner while its stream was held, and its host function never ran.)
    fn a_reset_whose_id_look_fails_leaves_the_work_of_the_context_made_again_alone(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        reset_with_work_made_again_during_it(true);
    }

    /// Another binding makes the last release of a primary context with a sticky error (the crate
    /// sees no release of its own that is the last) and the device is retained again (the same
    /// handle, a new id): `flush` finds the old context gone by its id and releases its pending
    /// launch, and leaves the new context's launch alone. (Mutation testing: with the id test
    /// inverted, a context whose handle names another one was taken for live and its work never
    /// released.)
    fn flush_releases_the_work_of_a_context_another_binding_released_for_the_last_time(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let driver = load_fake_driver();
        let device = Device::get(0).unwrap();
        let context = PrimaryContext::retain(device).unwrap();
        // The other binding's retain.
        let mut raw = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; a device of the driver.
        unsafe { driver.cuDevicePrimaryCtxRetain(&mut raw, device.raw()).unwrap() };
        assert_eq!(raw, context.raw());
        let stream = Stream::new(&context).unwrap();
        let old_drops = Drops::new();
        let hold = fake().hold_stream(stream.raw()).unwrap();
        host_launch(&stream, {
            let owner = old_drops.owner();
            move || { let _keep = &owner; }
        })
        .unwrap();
        fake().poison_context(context.raw()).unwrap();
        hold.release();
        drop(stream);
        // Not the last release: the other binding still retains the context.
        drop(context);
        flush(PATIENCE).unwrap();
        assert_eq!(old_drops.dropped(), 0, "released while the context was retained");
        // The other binding's last release, unseen by the crate, then a retain again.
        // SAFETY: the retain made above, released once.
        unsafe { driver.cuDevicePrimaryCtxRelease(device.raw()).unwrap() };
        let again = PrimaryContext::retain(device).unwrap();
        assert_eq!(again.raw(), raw, "the handle stays");
        let stream = Stream::new(&again).unwrap();
        let drops = Drops::new();
        let hold = fake().hold_stream(stream.raw()).unwrap();
        host_launch(&stream, {
            let owner = drops.owner();
            move || { let _keep = &owner; }
        })
        .unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(old_drops.dropped(), 1, "the old context's launch was not released");
        assert_eq!(drops.dropped(), 0, "the new context's launch was released");
        assert_eq!(pending_launches(None), 1);
        hold.release();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 1);
        assert_eq!(pending_launches(None), 0);
    }

    /// A sticky error strands a release while an event of its pool waits in the enqueuing
    /// thread's stash (an earlier release's, completed): the round that strands it takes the
    /// stashes back, so the pool gives its retain back then, not at its idle exit (an hour here),
    /// and the user's last release destroys the context and reclaims the release.
    fn a_sticky_error_gives_back_a_pool_whose_event_waits_in_a_stash(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let (context, stream) = with_pools_kept_for_an_hour();
        let drops = Drops::new();
        // Two events out at once, both back in this thread's stash once they completed.
        let hold = fake().hold_stream(stream.raw()).unwrap();
        release_after(&stream, drops.owner()).unwrap();
        release_after(&stream, drops.owner()).unwrap();
        hold.release();
        drops.wait_dropped(2);
        // The round that completed them has ended: their events wait in the stash.
        flush(PATIENCE).unwrap();
        // This release takes one of them; the other stays in the stash.
        let hold = fake().hold_stream(stream.raw()).unwrap();
        release_after(&stream, drops.owner()).unwrap();
        fake().poison_context(context.raw()).unwrap();
        hold.release();
        drop(stream);
        drop(context);
        wait_until("the stranded owner dropped", PATIENCE, || drops.dropped() == 3);
        wait_until("no retain left", PATIENCE, || fake().live_objects("primary_retains") == 0);
        assert_eq!(pending_launches(None), 0);
    }

    /// A sticky error with event work pending (a release, a callback, a future): the event pool
    /// strands the work and gives its retain back, so the user's last release destroys the context
    /// and reclaims everything (before: the pool kept its retain for good, nothing was reclaimed,
    /// the future never resolved).
    fn a_sticky_errors_event_work_is_reclaimed_by_the_users_last_release(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        load_fake_driver();
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let hold = fake().hold_stream(stream.raw()).unwrap();
        release_after(&stream, drops.owner()).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        spawn_after(&stream, {
            let (ran, owner) = (Arc::clone(&ran), drops.owner());
            move || {
                let _owner = owner;
                ran.fetch_add(1, Ordering::SeqCst);
            }
        })
        .unwrap();
        let mut future = CompletionMode::Event.completion(&stream).unwrap();
        fake().poison_context(context.raw()).unwrap();
        hold.release();
        drop(stream);
        let raw = context.raw();
        drop(context);
        // Whether the pool gave its retain back before or after the user's release, the last
        // release reclaims (the pool's, on the poller, or the user's).
        wait_until("the owners dropped", PATIENCE, || drops.dropped() == 2);
        // The poller's query saw the fault first (the future fails with the driver's code), or
        // the release reclaimed the work first (the context is lost).
        assert!(matches!(
            resolve(&mut future),
            Err(Error::DeviceFault { code: 719, .. } | Error::ContextLost)
        ));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "a callback ran after a sticky error");
        assert_eq!(pending_launches(Some(raw)), 0);
        wait_until("no retain left", PATIENCE, || fake().live_objects("primary_retains") == 0);
        // The reclaim forgot the gone context's queues and pool: the poller queries nothing more
        // and, idle, exits. (Mutation testing: with nothing forgotten, it kept the stranded
        // entries for good.)
        let queries = fake().call_count("cuEventQuery");
        wait_until("the idle poller to exit", PATIENCE, || {
            cuda_workspace::testing::threads_named("cuda-hl-watch") == 0
        });
        assert_eq!(fake().call_count("cuEventQuery"), queries, "queries after the reclaim");
    }

    /// A capture another thread begins while `release_after` records its event strands the release
    /// (the capture may hold the event); the pool does not keep the context for it, so the user's
    /// last release destroys the context and drops the owner (before: the pool's retain kept the
    /// context, and the owner, for good).
    fn a_release_stranded_by_a_capture_is_reclaimed_by_the_users_last_release(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        load_fake_driver();
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        // The crate's first look says "not capturing"; its look after the record sees the capture.
        begin_capture(&stream);
        fake().hide_capture(1);
        let refused = release_after(&stream, drops.owner());
        assert!(
            matches!(&refused, Err(e) if matches!(e.error(), Error::CaptureActive { .. })
                && !e.is_handed_back()),
            "{refused:?}"
        );
        end_capture(&stream);
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 0, "released early: the capture may hold the event");
        drop(stream);
        drop(context);
        wait_until("the owner dropped", PATIENCE, || drops.dropped() == 1);
        wait_until("no retain left", PATIENCE, || fake().live_objects("primary_retains") == 0);
    }

    /// A capture another thread begins and ends while `release_after` records its event, unseen
    /// by the call: the poller's query answers `INVALID_VALUE`, and the event, which the capture
    /// may hold, is stranded, not given back to the pool. With no other event out, the pool then
    /// lets its retain go in that same round (the poller never goes idle here: its idle exit,
    /// which gives every pool back, is an hour away), so the user's last release destroys the
    /// context and reclaims the release. (Before, with the event given back: the pool, with
    /// nothing stranded, kept the context retained until the poller's idle exit, never here.)
    fn an_event_a_capture_may_hold_is_stranded_and_its_pool_lets_the_context_go(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let (context, stream) = with_pools_kept_for_an_hour();
        let raw = stream.raw().addr();
        // Inside the record, another thread begins a capture of the stream (so the record goes
        // into it); at the record's end, the capture ends: the call's second look sees nothing.
        fake().set_hook("cuEventRecord", 1, move || {
            std::thread::spawn(move || begin_capture_raw(raw)).join().unwrap();
        });
        fake().set_hook_after("cuEventRecord", 1, move || end_capture_raw(raw));
        let drops = Drops::new();
        release_after(&stream, drops.owner())
            .expect("the call cannot see a capture that began and ended inside it");
        // The poller has queried the event (and stranded it) in a round that this flush saw end.
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 0, "released early: the capture may hold the event");
        assert_eq!(context.pending_launches(), 1);
        assert_eq!(
            fake().live_objects("primary_retains"),
            1,
            "the event pool still retains the context: the event was given back, not stranded"
        );
        drop(stream);
        drop(context);
        drops.wait_dropped(1);
        assert_eq!(fake().live_objects("primary_retains"), 0);
        assert_eq!(pending_launches(None), 0);
    }

    /// The same when the call sees the capture (begun before the call, hidden from its first
    /// look): the event is stranded at once and the pool lets its retain go before the call
    /// returns `CaptureActive` (no poller runs: nothing else would give the pool back).
    fn an_event_a_capture_may_hold_is_stranded_by_the_call_that_sees_the_capture(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        load_fake_driver();
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        begin_capture(&stream);
        fake().hide_capture(1);
        let refused = release_after(&stream, drops.owner());
        assert!(
            matches!(&refused, Err(e) if matches!(e.error(), Error::CaptureActive { .. })
                && !e.is_handed_back()),
            "{refused:?}"
        );
        assert_eq!(
            fake().live_objects("primary_retains"),
            1,
            "the event pool still retains the context: the event was given back, not stranded"
        );
        end_capture(&stream);
        assert_eq!(drops.dropped(), 0, "released early: the capture may hold the event");
        drop(stream);
        drop(context);
        drops.wait_dropped(1);
        assert_eq!(fake().live_objects("primary_retains"), 0);
    }

    /// The fake, as the H200's driver, gives a primary context made again after its last release
    /// the same handle and a new `cuCtxGetId`; a `Stream` carries the ids it was made with.
    fn a_stream_carries_the_ids_of_the_context_it_was_made_in(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        use cuda_host_launch::AsRawStream;
        load_fake_driver();
        let device = Device::get(0).unwrap();
        let first = PrimaryContext::retain(device).unwrap();
        let ids = Stream::new(&first).unwrap().ids_hint().expect("ids on a 13.0 driver");
        let handle = first.raw();
        drop(first);
        let again = PrimaryContext::retain(device).unwrap();
        assert_eq!(again.raw(), handle, "the handle stays");
        let new = Stream::new(&again).unwrap().ids_hint().unwrap();
        assert_ne!(new.context, ids.context, "a new id");
    }

    /// A launch or a release on this crate's `Stream` (or a reference to one, or an `Arc`) takes
    /// the stream's context and ids from the `Stream` (`context_hint`, `ids_hint`): it asks the
    /// driver for neither. (Mutation testing: with `Stream`'s context hint, or the reference's
    /// or the `Arc`'s forwarding, gone, every launch asked `cuStreamGetCtx` and `cuCtxGetId`, and
    /// every test passed.)
    fn a_launch_on_a_crate_stream_asks_the_driver_for_neither_its_context_nor_its_ids(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        load_fake_driver();
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        // The first of each starts the crate's threads and pools, which may ask.
        host_launch(&stream, || {}).unwrap();
        release_after(&stream, drops.owner()).unwrap();
        drops.wait_dropped(1);
        let asked = || {
            (
                fake().call_count("cuStreamGetCtx"),
                fake().call_count("cuCtxGetId"),
            )
        };
        // This thread's calls only (the crate's threads, and a flush, look at contexts).
        fake().focus_calls_on_this_thread(true);
        let before = asked();
        host_launch(&stream, {
            let owner = drops.owner();
            move || {
                let _keep = &owner;
            }
        })
        .unwrap();
        release_after(&stream, drops.owner()).unwrap();
        // Through a reference and an `Arc`, whose impls pass the hints on.
        #[allow(
            clippy::needless_borrows_for_generic_args,
            reason = "through `&Stream`'s impl of `AsRawStream`"
        )]
        release_after(&&stream, drops.owner()).unwrap();
        let shared = Arc::new(stream);
        release_after(&shared, drops.owner()).unwrap();
        let after = asked();
        fake().focus_calls_on_this_thread(false);
        assert_eq!(after, before, "(cuStreamGetCtx, cuCtxGetId) calls");
        drops.wait_dropped(5);
    }

    /// The fake remembers a sticky error past the context's death: `context_poisoned` stays true
    /// for the id the context had, after a reset too, and the context made again (another id)
    /// starts clean. The torture oracle lets a graph's owners go before its replay ran when that
    /// answer is true (the driver drops a poisoned context's launches); the answer turned false at
    /// a reset between the oracle's looks, and the drop was reported as a violation (a CI
    /// rehearsal's ASan torture, seed 1796222836).
    fn a_sticky_error_stays_on_record_for_the_id_of_the_context_it_ended(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        use cuda_host_launch::AsRawStream;
        load_fake_driver();
        let device = Device::get(0).unwrap();
        let context = PrimaryContext::retain(device).unwrap();
        let old = Stream::new(&context).unwrap().ids_hint().unwrap().context;
        assert!(!fake().context_poisoned(old), "poisoned before the error");
        fake().poison_context(context.raw()).unwrap();
        assert!(fake().context_poisoned(old));
        // SAFETY: the test's only stream is dropped, and nothing else uses the context.
        let reclaimed = unsafe { context.reset() };
        assert!(matches!(reclaimed, Ok(0) | Err(_)), "{reclaimed:?}");
        assert!(!fake().context_alive(old), "the reset ended the context");
        assert!(fake().context_poisoned(old), "the error forgotten at the context's reset");
        let new = Stream::new(&context).unwrap().ids_hint().unwrap().context;
        assert_ne!(new, old);
        assert!(fake().context_alive(new));
        assert!(!fake().context_poisoned(new), "the context made again inherits the error");
    }
}

/// The event poller's idle exit an hour away (it never gives its pools back on its own here),
/// then the fake's device 0's primary context, retained, and a stream of it.
fn with_pools_kept_for_an_hour() -> (Arc<PrimaryContext>, Stream) {
    cuda_host_launch::Config::new()
        .event_poller(cuda_host_launch::PollerSettings {
            idle_exit: Duration::from_secs(3600),
            ..cuda_host_launch::PollerSettings::DEFAULT
        })
        .install()
        .unwrap();
    load_fake_driver();
    let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
    let stream = Stream::new(&context).unwrap();
    (context, stream)
}

fn begin_capture(stream: &Stream) {
    let driver = load_fake_driver();
    // SAFETY: a live stream.
    unsafe {
        driver
            .cuStreamBeginCapture_v2(
                stream.raw(),
                cuda_dl_sys::types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
            .unwrap();
    }
}

fn end_capture(stream: &Stream) {
    let driver = load_fake_driver();
    let mut graph = std::ptr::null_mut();
    // SAFETY: the stream's own capture; the graph is destroyed once.
    unsafe {
        driver.cuStreamEndCapture(stream.raw(), &mut graph).unwrap();
        driver.cuGraphDestroy(graph).unwrap();
    }
}

/// [`begin_capture`] of a stream known by its address (a hook's closure must be `Send`).
fn begin_capture_raw(stream: usize) {
    let driver = load_fake_driver();
    // SAFETY: a live stream of the test.
    unsafe {
        driver
            .cuStreamBeginCapture_v2(
                std::ptr::with_exposed_provenance_mut(stream),
                cuda_dl_sys::types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
            .unwrap();
    }
}

/// [`end_capture`] of a stream known by its address.
fn end_capture_raw(stream: usize) {
    let driver = load_fake_driver();
    let mut graph = std::ptr::null_mut();
    // SAFETY: the stream's own capture; the graph is destroyed once.
    unsafe {
        driver
            .cuStreamEndCapture(std::ptr::with_exposed_provenance_mut(stream), &mut graph)
            .unwrap();
        driver.cuGraphDestroy(graph).unwrap();
    }
}

/// `PrimaryContext::reset` of a context with a sticky error and a pending launch, while another
/// thread retains the device once the driver's reset has returned and launches there; with
/// `fail_id_look`, the reset's first `cuCtxGetId` (its look at the old context's id) is refused.
/// Only the reset context's launch is reclaimed.
fn reset_with_work_made_again_during_it(fail_id_look: bool) {
    load_fake_driver();
    let device = Device::get(0).unwrap();
    let context = PrimaryContext::retain(device).unwrap();
    let stream = Stream::new(&context).unwrap();
    let old_drops = Drops::new();
    let hold = fake().hold_stream(stream.raw()).unwrap();
    host_launch(&stream, {
        let owner = old_drops.owner();
        move || {
            let _keep = &owner;
        }
    })
    .unwrap();
    fake().poison_context(context.raw()).unwrap();
    hold.release();
    drop(stream);
    let made: Arc<Mutex<Option<MadeHeld>>> = Arc::default();
    {
        let made = Arc::clone(&made);
        fake().set_hook_after("cuDevicePrimaryCtxReset", 1, move || {
            let made = Arc::clone(&made);
            std::thread::spawn(move || {
                let again = PrimaryContext::retain(device).unwrap();
                let stream = Stream::new(&again).unwrap();
                let hold = fake().hold_stream(stream.raw()).unwrap();
                let drops = Drops::new();
                host_launch(&stream, {
                    let owner = drops.owner();
                    move || {
                        let _keep = &owner;
                    }
                })
                .unwrap();
                *made.lock().unwrap() = Some((again, stream, hold, drops));
            })
            .join()
            .unwrap();
        });
    }
    if fail_id_look {
        fake().set_fault("cuCtxGetId", 1, 999);
    }
    // SAFETY: the context's only stream is dropped; nothing made in it is used after the reset
    // (the other thread's stream is made in the context made again).
    let reclaimed = unsafe { context.reset() }.unwrap();
    fake().clear_hooks();
    let (again, stream, hold, drops) = made.lock().unwrap().take().expect("the hook ran");
    assert_eq!(again.raw(), context.raw(), "the handle stays");
    assert_eq!(reclaimed, 1, "only the reset context's launch is reclaimed");
    flush(PATIENCE).unwrap();
    old_drops.wait_dropped(1);
    assert_eq!(drops.dropped(), 0, "the new context's owner was reclaimed");
    assert_eq!(
        pending_launches(Some(again.raw())),
        1,
        "the new context's launch is pending"
    );
    hold.release();
    stream.synchronize().unwrap();
    flush(PATIENCE).unwrap();
    assert_eq!(drops.dropped(), 1);
    assert_eq!(pending_launches(None), 0);
}
