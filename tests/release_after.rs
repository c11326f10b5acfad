//! Stream-ordered releases and callbacks through events (`release_after`, `spawn_after`,
//! `CompletionMode::Event`), on the fake driver: order against held streams, the thread that drops
//! or runs, CUDA calls inside callbacks, capture (before, during and around the call), sticky
//! errors, contexts that are not primary, and the poller's relaxed capture mode. Each test runs in
//! a process of its own: holds, hooks, faults and resets are process-wide.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUstream, CUstreamCaptureMode};
use cuda_host_launch::{
    AsRawStream, CompletionMode, Error, PanicOrigin, PrimaryContext, RawStream, Stream, flush,
    pending_launches, poller_cpu_time, release_after, set_panic_handler, spawn_after,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    CreatedContext, Drops, Hold, ThreadInfo, fake, fake_driver_path, fake_primary_context,
};

const PATIENCE: Duration = Duration::from_secs(10);
/// The event poller thread's name (its OS name, 15 bytes at most, is the same).
const POLLER: &str = "cuda-hl-watch";

/// Waits until `done` holds, or fails after [`PATIENCE`].
#[track_caller]
fn wait_for(what: &str, done: impl FnMut() -> bool) {
    cuda_workspace::testing::wait_until(what, PATIENCE, done);
}

/// Device 0's event pool, made by a completed release while the poller keeps it (the caller sees
/// to that: a long idle exit, or other work pending), then device 0's primary context reset by another binding (nothing
/// of the crate's in flight). Returns the user's retain and the fake's count of calls on unknown
/// events before the reset.
fn a_pool_then_a_reset_by_another_binding() -> (Arc<PrimaryContext>, u64) {
    use cuda_host_launch::Device;
    let device = Device::get(0).unwrap();
    let context = PrimaryContext::retain(device).unwrap();
    let stream = Stream::new(&context).unwrap();
    let before = fake().live_objects("primary_retains");
    let drops = Drops::new();
    release_after(&stream, drops.owner()).unwrap();
    drops.wait_dropped(1);
    drop(stream);
    assert_eq!(
        fake().live_objects("primary_retains"),
        before + 1,
        "the user's and the pool's"
    );
    let unknown = fake().unknown_event_calls();
    let driver = cuda_dl_sys::driver().unwrap();
    // SAFETY: nothing made in the context is used after the reset (its stream is dropped).
    unsafe { driver.cuDevicePrimaryCtxReset_v2(device.raw()) }.unwrap();
    (context, unknown)
}

/// Installs a configuration with these event poller settings (before the crate's first use: each
/// test has a process of its own).
fn install_poller(settings: cuda_host_launch::PollerSettings) {
    cuda_host_launch::Config::new()
        .event_poller(settings)
        .install()
        .expect("installed before the crate's first use");
}

fn begin_capture(stream: CUstream, mode: CUstreamCaptureMode) {
    let driver = cuda_dl_sys::driver().unwrap();
    // SAFETY: a live stream of the fake driver.
    unsafe { driver.cuStreamBeginCapture(stream, mode) }.unwrap();
}

fn end_capture(stream: CUstream) -> Result<cuda_dl_sys::types::CUgraph, cuda_dl_sys::CallError> {
    let driver = cuda_dl_sys::driver().unwrap();
    let mut graph = std::ptr::null_mut();
    // SAFETY: a live stream; a valid out-pointer.
    unsafe { driver.cuStreamEndCapture(stream, &mut graph) }.map(|()| graph)
}

fn destroy_graph(graph: cuda_dl_sys::types::CUgraph) {
    let driver = cuda_dl_sys::driver().unwrap();
    // SAFETY: a graph a capture made, destroyed once.
    unsafe { driver.cuGraphDestroy(graph) }.unwrap();
}

/// A stream handle that may cross threads (a hook's closure must be `Send`).
#[derive(Clone, Copy)]
struct SendStream(usize);

impl SendStream {
    fn of(stream: &Stream) -> SendStream {
        SendStream(stream.raw().addr())
    }
    fn raw(self) -> CUstream {
        std::ptr::with_exposed_provenance_mut(self.0)
    }
}

isolated_test! {
    /// A reset while a release waits in the poller's queues (its stream held until the reset
    /// begins, so the reset runs it and destroys its event): the poller forgets the entry under
    /// the reset's lock and never queries the dead event (on the real driver its handle may
    /// name another event by then); the reset's reclaim drops the owner once. (Mutation testing:
    /// with nothing forgotten, the poller's next round queried the destroyed event.)
    fn a_reset_leaves_the_poller_no_dead_event_to_query(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let token = fake()
            .hold_stream(stream.raw())
            .expect("the fake could not hold the stream")
            .into_token();
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        let queries = fake().call_count("cuEventQuery");
        wait_for("the poller to query the release's event", || {
            fake().call_count("cuEventQuery") >= queries + 3
        });
        fake().set_hook("cuDevicePrimaryCtxReset", 1, move || fake().release_hold(token));
        drop(stream);
        let unknown = fake().unknown_event_calls();
        // SAFETY: the context's only stream is dropped; nothing made in it is used afterwards.
        let reclaimed = unsafe { context.reset() }.unwrap();
        cuda_workspace::testing::assert_reset_released(&context, reclaimed, 1);
        drops.wait_dropped(1);
        // A poller round that began after the reset has ended.
        flush(PATIENCE).unwrap();
        assert_eq!(fake().unknown_event_calls(), unknown, "calls on a destroyed event");
    }

    /// A reset while a release waits in its thread's slot of the hand-over, not yet taken by
    /// the watcher (which pauses a second between rounds, its shortest pause, so it asked no
    /// enqueue to wake it): the reset forgets the entry there too, and the watcher never queries
    /// its dead event. (If the watcher took the entry before the reset, the queues' forgetting
    /// covers it and the test shows nothing; it cannot fail for that.)
    fn a_reset_forgets_a_release_still_in_its_threads_slot(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        install_poller(cuda_host_launch::PollerSettings {
            spin: Duration::ZERO,
            interval: Duration::from_secs(1),
            max_interval: Duration::from_secs(1),
            learned_spin: false,
            ..cuda_host_launch::PollerSettings::DEFAULT
        });
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let (first, second) = (Stream::new(&context).unwrap(), Stream::new(&context).unwrap());
        let tokens: Vec<_> = [&first, &second]
            .iter()
            .map(|stream| {
                fake()
                    .hold_stream(stream.raw())
                    .expect("the fake could not hold the stream")
                    .into_token()
            })
            .collect();
        let drops = Drops::new();
        release_after(&first, drops.owner()).unwrap();
        let queries = fake().call_count("cuEventQuery");
        wait_for("the watcher to query the first release's event", || {
            fake().call_count("cuEventQuery") > queries
        });
        // The watcher now pauses a second: this one waits in the slot.
        release_after(&second, drops.owner()).unwrap();
        fake().set_hook("cuDevicePrimaryCtxReset", 1, move || {
            for &token in &tokens {
                fake().release_hold(token);
            }
        });
        drop((first, second));
        let unknown = fake().unknown_event_calls();
        // SAFETY: the context's streams are dropped; nothing made in it is used afterwards.
        let reclaimed = unsafe { context.reset() }.unwrap();
        cuda_workspace::testing::assert_reset_released(&context, reclaimed, 2);
        drops.wait_dropped(2);
        // A watcher round that began after the reset has ended.
        flush(PATIENCE).unwrap();
        assert_eq!(fake().unknown_event_calls(), unknown, "calls on a destroyed event");
    }

    /// Another binding resets the primary context (as `cudaDeviceReset` does, with nothing of
    /// this crate's in flight) while the event pool keeps free events of it. The reset destroyed
    /// them, so when the poller goes idle and gives the pool back, it releases the pool's retain
    /// and destroys none of them: on the real driver their handles may name other bindings'
    /// events by then. (Found by the torture harness's unknown-event oracle, seed 13066: the idle
    /// poller destroyed the 32 dead events.) The poller is kept from giving the pool back before
    /// the reset by a release pending on another device (a held stream), then goes idle once
    /// that completes, and exits 5 ms later.
    fn a_reset_by_another_binding_leaves_the_pools_dead_events_alone(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        FAKE_CUDA_DEVICES = "2"
    ) {
        use cuda_host_launch::{Device, PollerSettings};
        install_poller(PollerSettings {
            idle_exit: Duration::from_millis(5),
            ..PollerSettings::DEFAULT
        });
        let other = PrimaryContext::retain(Device::get(1).unwrap()).unwrap();
        let stream = Stream::new(&other).unwrap();
        // The users' retains: device 1's now, device 0's once the pool is made.
        let users = fake().live_objects("primary_retains") + 1;
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let woken = Drops::new();
        release_after(&stream, woken.owner()).unwrap();
        let (_context, unknown) = a_pool_then_a_reset_by_another_binding();
        hold.release();
        // No flush until the poller has given the pools back (a flush forgets the pools of
        // contexts that are gone).
        wait_for("the release on device 1", || woken.dropped() == 1);
        drop(stream);
        wait_for("the poller to give back the pools", || {
            fake().live_objects("primary_retains") == users
        });
        assert_eq!(fake().unknown_event_calls(), unknown, "calls on a destroyed event");
    }

    /// After another binding's reset of the primary context, a `flush` forgets the event pool of
    /// the context that is gone and releases its retain at once, without touching its events
    /// (the poller, kept by a long idle exit, would only give it back when idle). (Mutation
    /// testing: with the event transport's `forget_gone` emptied, or the pools' handles not
    /// listed for the flush's look, the retain stayed until the poller's idle exit.)
    fn a_flush_forgets_the_pool_of_a_context_another_binding_reset(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        install_poller(cuda_host_launch::PollerSettings {
            idle_exit: Duration::from_secs(3600),
            ..cuda_host_launch::PollerSettings::DEFAULT
        });
        let (_context, unknown) = a_pool_then_a_reset_by_another_binding();
        flush(PATIENCE).unwrap();
        assert_eq!(fake().live_objects("primary_retains"), 1, "the pool's retain kept");
        assert_eq!(fake().unknown_event_calls(), unknown, "calls on a destroyed event");
    }

    /// A release whose event record the driver refuses gives its event back to the pool: the
    /// pool has nothing out, so the poller still goes idle and gives the pool (and its retain of
    /// the context) back. (Mutation testing: with the refused event kept out, the poller never
    /// went idle and the context stayed retained, and every test passed.)
    fn a_refused_record_gives_its_event_back(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        use cuda_host_launch::PollerSettings;
        install_poller(PollerSettings {
            idle_exit: Duration::from_millis(5),
            ..PollerSettings::DEFAULT
        });
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        drops.wait_dropped(1);
        fake().set_fault("cuEventRecord", 1, 999);
        assert!(release_after(&stream, drops.owner()).is_err());
        drops.wait_dropped(2);
        wait_for("the poller to give the pool back", || {
            fake().live_objects("primary_retains") == 1
        });
        drop(stream);
    }

    /// A context's first release whose events cannot be created (`cuEventCreate` fails: out of
    /// memory) hands its owner back and leaves no pool behind: the pool it made held the
    /// context retained, and with no watcher running nothing would ever give it back, so the
    /// user's last release would not destroy the context (nor reclaim its pending work).
    /// (Before: `primary_retains` stayed 1 after the user's last release.)
    fn a_pool_whose_first_events_fail_is_given_back(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        fake().set_fault("cuEventCreate", 1, 2);
        let refused = release_after(&stream, drops.owner()).expect_err("no event");
        assert!(refused.into_inner().is_some(), "the owner is handed back");
        drops.wait_dropped(1);
        drop(stream);
        drop(context);
        assert_eq!(fake().live_objects("primary_retains"), 0);
    }

    /// A context's first release whose batch of events is only partly made (the second
    /// `cuEventCreate` fails: out of memory) is accepted with the event made, and the pool counts
    /// out only that one: once the release completed and the poller idled, the pool gives its
    /// retain back. (Mutation testing: with the unmade part of the reservation kept out, the pool
    /// held its context for good.)
    fn a_pool_whose_batch_is_partly_made_counts_out_only_what_was_made(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        install_poller(cuda_host_launch::PollerSettings {
            idle_exit: Duration::from_millis(5),
            ..cuda_host_launch::PollerSettings::DEFAULT
        });
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let retains = fake().live_objects("primary_retains");
        let drops = Drops::new();
        fake().set_fault("cuEventCreate", 2, 2);
        release_after(&stream, drops.owner()).expect("one event was made");
        drops.wait_dropped(1);
        wait_for("the pool to give its retain back", || {
            fake().live_objects("primary_retains") == retains
        });
        assert_eq!(fake().live_objects("events"), 0, "the one event destroyed");
    }

    /// A dry pool's events are made with the pools' lock free: another context's first release
    /// goes through while a thread makes a batch of events (here it waits, in its first
    /// `cuEventCreate`, for that release to return). (Before: the batch was made under the
    /// process-wide lock, and the other release waited for it.)
    fn another_contexts_release_goes_through_while_a_pools_events_are_made(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        FAKE_CUDA_DEVICES = "2"
    ) {
        use cuda_host_launch::Device;
        use std::sync::mpsc;
        let zero = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let one = PrimaryContext::retain(Device::get(1).unwrap()).unwrap();
        let (first, second) = (Stream::new(&zero).unwrap(), Stream::new(&one).unwrap());
        let drops = Drops::new();
        let (go, started) = mpsc::channel::<()>();
        let (returned, done) = mpsc::channel::<()>();
        let seen = Arc::new(AtomicUsize::new(0));
        let other = std::thread::spawn({
            let drops = Arc::clone(&drops);
            move || {
                if started.recv().is_ok() {
                    release_after(&second, drops.owner()).unwrap();
                    let _ = returned.send(());
                }
            }
        });
        let done = Mutex::new(done);
        fake().set_hook("cuEventCreate", 1, {
            let seen = Arc::clone(&seen);
            move || {
                let _ = go.send(());
                let done = done.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if done.recv_timeout(PATIENCE).is_ok() {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        release_after(&first, drops.owner()).unwrap();
        other.join().unwrap();
        assert_eq!(
            seen.load(Ordering::SeqCst),
            1,
            "the other release returned while this one made its events"
        );
        drops.wait_dropped(2);
    }

    /// An event taken for a release is out of its pool from the take: a poller going idle
    /// meanwhile (before the release reaches it) keeps the pool, and with it that event and the
    /// context's retain. Here the release's `cuEventRecord` waits (in a hook) for up to half a
    /// second for the poller to exit; it must not, and the record names a live event. (Mutation
    /// testing: with the take not counted out, the idle poller gave the pool back, destroying
    /// the event about to be recorded.)
    fn an_idle_poller_keeps_the_pool_of_an_event_being_recorded(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        use cuda_host_launch::PollerSettings;
        install_poller(PollerSettings {
            idle_exit: Duration::from_millis(5),
            ..PollerSettings::DEFAULT
        });
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        drops.wait_dropped(1);
        let unknown = fake().unknown_event_calls();
        let exited = Arc::new(AtomicUsize::new(0));
        fake().set_hook("cuEventRecord", 1, {
            let exited = Arc::clone(&exited);
            move || {
                let deadline = Instant::now() + Duration::from_millis(500);
                while Instant::now() < deadline {
                    if cuda_workspace::testing::threads_named("cuda-hl-watch") == 0 {
                        exited.store(1, Ordering::SeqCst);
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        release_after(&stream, drops.owner()).unwrap();
        drops.wait_dropped(2);
        assert_eq!(exited.load(Ordering::SeqCst), 0, "the poller exited with an event out");
        assert_eq!(fake().unknown_event_calls(), unknown, "calls on a destroyed event");
    }

    /// A release stranded by a capture (begun during its record) gives back only the pools with
    /// nothing out and an event stranded: neither its own context's pool while another of its
    /// events is out, nor another context's idle pool. (Mutation testing: with the pick's `&&` as
    /// `||`, the pool went with an event out, its context's retain released under the poller;
    /// with `stranded >= 0`, every idle pool went.)
    fn a_stranded_release_gives_back_no_pool_with_an_event_out_and_no_idle_one(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        FAKE_CUDA_DEVICES = "2"
    ) {
        use cuda_host_launch::{Device, PollerSettings};
        install_poller(PollerSettings {
            idle_exit: Duration::from_secs(3600),
            ..PollerSettings::DEFAULT
        });
        let zero = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let one = PrimaryContext::retain(Device::get(1).unwrap()).unwrap();
        // Device 1: an idle pool (its release completed).
        let idle = Stream::new(&one).unwrap();
        let done = Drops::new();
        release_after(&idle, done.owner()).unwrap();
        done.wait_dropped(1);
        // Device 0: a release waiting behind a hold (its event out), then one stranded.
        let held = Stream::new(&zero).unwrap();
        let hold = fake().hold_stream(held.raw()).expect("the fake could not hold the stream");
        let waiting = Drops::new();
        release_after(&held, waiting.owner()).unwrap();
        let captured = Stream::new(&zero).unwrap();
        let raw = SendStream::of(&captured);
        fake().set_hook("cuEventRecord", 1, move || {
            std::thread::spawn(move || {
                begin_capture(
                    raw.raw(),
                    CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                )
            })
            .join()
            .unwrap();
        });
        let destroys = fake().call_count("cuEventDestroy");
        let stranded = Drops::new();
        let result = release_after(&captured, stranded.owner());
        assert!(
            matches!(&result, Err(e) if matches!(e.error(), Error::CaptureActive { .. })
                && !e.is_handed_back()),
            "{result:?}"
        );
        drop(result);
        assert_eq!(
            fake().call_count("cuEventDestroy"),
            destroys,
            "a pool was given back"
        );
        assert_eq!(
            fake().live_objects("primary_retains"),
            2,
            "device 0's pool let go with an event out"
        );
        destroy_graph(end_capture(captured.raw()).unwrap());
        hold.release();
        waiting.wait_dropped(1);
    }

    /// The process's first release, refused by the driver at its record: no poller runs to give
    /// the pool back later, so the refusal gives it back at once, with its retain of the context.
    /// (Mutation testing: with that give-back answering "not idle", the pool kept the context
    /// retained for good.)
    fn a_refused_first_release_gives_its_pool_back_at_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        fake().set_fault("cuEventRecord", 1, 999);
        let drops = Drops::new();
        assert!(release_after(&stream, drops.owner()).is_err());
        assert_eq!(drops.dropped(), 1);
        assert_eq!(fake().live_objects("primary_retains"), 1, "the pool kept its retain");
    }

    /// A refused release gives its pool back only if no other event of it is out: here the
    /// refusal comes while another thread's release, the first of the process (no poller yet),
    /// is inside its record. (Mutation testing: with the test reversed, the pool went with the
    /// other event out, and its context's retain with it.)
    fn a_refused_release_keeps_the_pool_of_another_threads_event_out(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let raw = SendStream::of(&stream);
        let retains_meanwhile = Arc::new(std::sync::atomic::AtomicU64::new(0));
        // The other thread's record, counted first (the hook runs before the first release's
        // call is counted), is refused.
        fake().set_fault("cuEventRecord", 1, 999);
        fake().set_hook("cuEventRecord", 1, {
            let retains_meanwhile = Arc::clone(&retains_meanwhile);
            move || {
                std::thread::spawn(move || {
                    // SAFETY: the stream lives until the first release returns, after this.
                    let stream = unsafe { cuda_host_launch::RawStream::from_raw(raw.raw()) };
                    let refused = release_after(stream, ());
                    assert!(refused.is_err(), "{refused:?}");
                })
                .join()
                .unwrap();
                retains_meanwhile.store(fake().live_objects("primary_retains"), Ordering::SeqCst);
            }
        });
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        drops.wait_dropped(1);
        assert_eq!(
            retains_meanwhile.load(Ordering::SeqCst),
            2,
            "the pool let go while the first release's event was out"
        );
    }

    /// `config` reads back the event poller settings installed.
    fn the_poller_settings_read_back_as_set(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        use cuda_host_launch::PollerSettings;
        let odd = PollerSettings {
            spin: Duration::from_micros(7),
            interval: Duration::from_micros(11),
            max_interval: Duration::from_micros(13),
            idle_exit: Duration::from_millis(17),
            query_gap: Duration::from_nanos(19),
            learned_spin: false,
        };
        install_poller(odd);
        assert_eq!(cuda_host_launch::config().unwrap().event_poller_settings(), odd);
    }

    /// A release whose event a capture took (begun and ended during its record: the poller's
    /// query answers `INVALID_VALUE`) is stranded alone: an earlier release of the same stream
    /// still completes in stream order. (Mutation testing: with that answer taken for a sticky
    /// error, the whole stream's queue was stranded, the earlier owner with it.)
    fn a_captured_release_strands_only_itself(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let raw = SendStream::of(&stream);
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let earlier = Drops::new();
        release_after(&stream, earlier.owner()).unwrap();
        let graph: Arc<Mutex<Option<usize>>> = Arc::default();
        fake().set_hook("cuEventRecord", 1, move || {
            std::thread::spawn(move || {
                begin_capture(raw.raw(), CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            })
            .join()
            .unwrap();
        });
        let out = Arc::clone(&graph);
        fake().set_hook_after("cuEventRecord", 1, move || {
            *out.lock().unwrap() = Some(end_capture(raw.raw()).unwrap().addr());
        });
        let captured = Drops::new();
        release_after(&stream, captured.owner())
            .expect("the call cannot see a capture that began and ended inside it");
        // The poller's rounds from here query the captured release's event (the newest).
        let queries = fake().call_count("cuEventQuery");
        wait_for("the poller to query the newest event", || {
            fake().call_count("cuEventQuery") >= queries + 3
        });
        assert_eq!(earlier.dropped(), 0, "never early");
        hold.release();
        earlier.wait_dropped(1);
        flush(PATIENCE).unwrap();
        assert_eq!(captured.dropped(), 0, "the captured release waits for its context");
        if let Some(g) = graph.lock().unwrap().take() {
            destroy_graph(std::ptr::with_exposed_provenance_mut(g));
        }
        drop(stream);
        // SAFETY: the context's only stream is dropped; nothing made in it is used afterwards.
        let reclaimed = unsafe { context.reset() }.unwrap();
        cuda_workspace::testing::assert_reset_released(&context, reclaimed, 1);
        captured.wait_dropped(1);
    }

    /// The lane makes a callback's context current before it runs it; a passing failure is tried
    /// again (the callbacks still run, in stream order). When it keeps failing (the context
    /// reset, say), the callback is dropped unrun, its captures with it, and the poller, which
    /// holds nothing of it, exits once idle.
    fn a_callback_whose_context_cannot_be_made_current_is_tried_again_or_dropped_unrun(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let device = |n| cuda_host_launch::Device::get(n).unwrap();
        // A passing failure: the callback runs all the same.
        let context = PrimaryContext::retain(device(0)).unwrap();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let ran = Arc::new(AtomicUsize::new(0));
        let order: Arc<Mutex<Vec<usize>>> = Arc::default();
        for i in 0..2 {
            let (counter, order) = (Arc::clone(&ran), Arc::clone(&order));
            spawn_after(&stream, move || {
                order.lock().unwrap().push(i);
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        }
        let before = fake().call_count("cuCtxSetCurrent");
        fake().set_fault("cuCtxSetCurrent", 1, 201);
        hold.release();
        wait_for("the callbacks to run after the failed cuCtxSetCurrent", || {
            ran.load(Ordering::SeqCst) == 2
        });
        assert_eq!(*order.lock().unwrap(), [0, 1]);
        assert!(fake().call_count("cuCtxSetCurrent") >= before + 2, "the failure was seen, then a retry");
        flush(PATIENCE).unwrap();
        // A failed look at what is current before runs the callback all the same. (Found by the
        // torture harness, seed 37184: the callback was dropped unrun, its context alive.)
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let counter = Arc::clone(&ran);
        spawn_after(&stream, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let looks = fake().call_count("cuCtxGetCurrent");
        fake().set_fault("cuCtxGetCurrent", 1, 201);
        hold.release();
        wait_for("the callback after the failed cuCtxGetCurrent", || {
            ran.load(Ordering::SeqCst) == 3
        });
        assert!(fake().call_count("cuCtxGetCurrent") > looks, "the look was made");
        fake().clear_faults();
        flush(PATIENCE).unwrap();
        // A lasting failure on device 1's context: the callback is dropped unrun (its captures
        // with it), and the poller is not held by it.
        let other = PrimaryContext::retain(device(1)).unwrap();
        let stream = Stream::new(&other).unwrap();
        let drops = Drops::new();
        let owner = drops.owner();
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        let unrun = cuda_host_launch::cleanup_stats().callbacks_dropped_unrun;
        fake().set_fault("cuCtxSetCurrent", 0, 201);
        spawn_after(&stream, move || {
            let _keep = &owner;
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let records = drops.wait_dropped(1);
        fake().clear_faults();
        assert_eq!(ran.load(Ordering::SeqCst), 0, "run without its context current");
        assert!(records[0].thread.is_reaper(), "{records:?}");
        assert_eq!(cuda_host_launch::cleanup_stats().callbacks_dropped_unrun, unrun + 1);
        drop(stream);
        drop(other);
        wait_for("the poller to exit", || cuda_workspace::testing::threads_named(POLLER) == 0);
    }

    /// While a `spawn_after` callback blocks the event poller's round, `flush` cannot see that
    /// round end: it times out (`FlushTimedOut`), though the cleanup queue is empty; once the
    /// callback returns, a flush succeeds. (Mutation testing: with the pollers' barrier reporting
    /// "done" when either poller was, the flush returned `Ok` during the round.)
    fn flush_times_out_while_a_callback_holds_the_pollers_round(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (started_tx, started) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        spawn_after(&stream, move || {
            started_tx.send(()).unwrap();
            go_rx.recv().unwrap();
        })
        .unwrap();
        started.recv_timeout(PATIENCE).expect("the callback never started");
        let result = flush(Duration::from_millis(50));
        assert!(
            matches!(result, Err(Error::FlushTimedOut { .. })),
            "a flush during the callback: {result:?}"
        );
        go.send(()).unwrap();
        flush(PATIENCE).unwrap();
    }

    /// Owners released after the stream's earlier work: kept while the stream is held, counted as
    /// pending, then dropped exactly once on the reaper (the poller, which watches completions,
    /// runs no user code), never by the caller or a driver thread.
    fn release_after_keeps_owners_until_the_earlier_work_completed(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        for _ in 0..100 {
            release_after(&stream, drops.owner()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 0, "nothing dropped while the stream is held");
        assert_eq!(context.pending_launches(), 100);
        hold.release();
        let records = drops.wait_dropped(100);
        assert!(
            records.iter().all(|r| r.thread.is_reaper()),
            "{records:?}"
        );
        assert_eq!(drops.live(), 0);
        assert_eq!(context.pending_launches(), 0);
        assert_eq!(fake().pending_host_functions(std::ptr::null_mut()), 0, "no host function");
    }

    /// Callbacks run in stream order, each stream's in its own order, on the reaper (never on
    /// the poller, which watches completions), after the work before them; four streams at once.
    fn spawn_after_runs_callbacks_in_stream_order_on_the_reaper(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let streams: Vec<Stream> = (0..4).map(|_| Stream::new(&context).unwrap()).collect();
        let holds: Vec<Hold> = streams
            .iter()
            .map(|s| fake().hold_stream(s.raw()).expect("the fake could not hold the stream"))
            .collect();
        let seen: Arc<Mutex<Vec<(usize, usize, ThreadInfo)>>> = Arc::default();
        for i in 0..250 {
            for (s, stream) in streams.iter().enumerate() {
                let seen = Arc::clone(&seen);
                spawn_after(stream, move || {
                    seen.lock().unwrap().push((s, i, ThreadInfo::current()));
                })
                .unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(seen.lock().unwrap().is_empty(), "nothing ran while the streams are held");
        for hold in holds {
            hold.release();
        }
        wait_for("1,000 callbacks", || seen.lock().unwrap().len() == 1000);
        let seen = seen.lock().unwrap();
        for s in 0..4 {
            let order: Vec<usize> = seen.iter().filter(|e| e.0 == s).map(|e| e.1).collect();
            assert_eq!(order, (0..250).collect::<Vec<_>>(), "stream {s} in order");
        }
        assert!(seen.iter().all(|e| e.2.is_reaper()));
    }

    /// A callback may call CUDA: it enqueues a host launch and a release on its stream and
    /// synchronizes another stream, none refused as "inside a host function".
    fn a_callback_may_call_cuda(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let context = fake_primary_context();
        let stream = Arc::new(Stream::new(&context).unwrap());
        let other = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let results: Arc<Mutex<Vec<String>>> = Arc::default();
        let (inner, out, owner) = (Arc::clone(&stream), Arc::clone(&results), drops.owner());
        spawn_after(&*stream, move || {
            let mut out = out.lock().unwrap();
            out.push(format!("{:?}", cuda_host_launch::host_launch(&*inner, || {})));
            out.push(format!("{:?}", release_after(&*inner, owner)));
            out.push(format!("{:?}", other.synchronize()));
            out.push(format!("{}", cuda_host_launch::in_host_function()));
        })
        .unwrap();
        wait_for("the callback", || results.lock().unwrap().len() == 4);
        assert_eq!(*results.lock().unwrap(), ["Ok(())", "Ok(())", "Ok(())", "false"]);
        stream.synchronize().unwrap();
        drops.wait_dropped(1);
    }

    /// A panicking callback is reported as a callback's panic; the poller goes on.
    fn a_panicking_callback_is_reported_and_the_poller_goes_on(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let reports: Arc<Mutex<Vec<(PanicOrigin, String)>>> = Arc::default();
        let out = Arc::clone(&reports);
        set_panic_handler(move |r| out.lock().unwrap().push((r.origin, r.message.to_string())));
        std::panic::set_hook(Box::new(|_| {})); // a quiet test
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        spawn_after(&stream, || panic!("on purpose")).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        spawn_after(&stream, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        wait_for("the second callback", || ran.load(Ordering::SeqCst) == 1);
        assert_eq!(
            *reports.lock().unwrap(),
            [(PanicOrigin::Callback, "on purpose".to_string())]
        );
    }

    /// On a capturing stream a release is refused (`ReleaseDuringCapture`: work enqueued before
    /// the capture began is not in the graph, and nothing tells when it completes; tied to the
    /// graph, as it was before, its owners were dropped when the graph was destroyed, while that
    /// work still ran) and a callback is refused too; both are handed back in the error, unrun:
    /// the owner stays alive while the earlier work (a hold) has not completed, until the caller
    /// drops it. (Before, the crate dropped it on the caller's thread before the error returned,
    /// while the held work still ran.) The capture is unharmed.
    fn on_a_capturing_stream_releases_and_callbacks_are_refused_and_handed_back(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        // Earlier work, still running while the capture begins and ends.
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        begin_capture(stream.raw(), CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
        let refused = release_after(&stream, drops.owner());
        let refused = refused.expect_err("a release on a capturing stream");
        assert!(
            matches!(refused.error(), Error::ReleaseDuringCapture { .. }),
            "{refused:?}"
        );
        // The earlier work is held (its completion is looked at once the capture ended): what it
        // may use must be alive.
        assert_eq!(drops.dropped(), 0, "dropped while the earlier work still runs");
        assert!(refused.is_handed_back(), "{refused:?}");
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        let refused_call = spawn_after(&stream, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let refused_call = refused_call.expect_err("a callback on a capturing stream");
        assert!(
            matches!(refused_call.error(), Error::CaptureActive { .. }),
            "{refused_call:?}"
        );
        let graph = end_capture(stream.raw()).expect("the capture survived");
        destroy_graph(graph);
        flush(PATIENCE).unwrap();
        // The earlier work is still held: the owner it may use is alive, in the caller's hands.
        assert!(!stream.is_idle().unwrap(), "the held work completed early");
        assert_eq!(drops.dropped(), 0, "dropped while the earlier work still runs");
        let owner = refused.into_inner().expect("handed back");
        hold.release();
        stream.synchronize().unwrap();
        // The caller drops it once the earlier work is done: here, on its thread.
        drop(owner);
        assert_eq!(drops.dropped(), 1);
        assert!(drops.records()[0].thread.same_as(&ThreadInfo::current()));
        // The callback, handed back unrun, can be called or dropped by the caller.
        let callback = refused_call.into_inner().expect("handed back");
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        callback();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        flush(PATIENCE).unwrap();
        assert_eq!(context.pending_launches(), 0);
    }

    /// Another thread begins a capture of the stream while the event is recorded (a hook inside
    /// `cuEventRecord`): the event may be the capture's, so it is never queried (the capture
    /// survives), the call says so, and the owner stays pending until the context's reset, which
    /// drops it once.
    fn a_capture_begun_during_the_record_strands_the_release_until_the_reset(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_race(false);
    }

    /// The same, with the capture also ended before the call looks again (invisible to it): the
    /// poller's query says the event was captured (`CUDA_ERROR_INVALID_VALUE`), and the owner
    /// stays pending until the reset. Never early.
    fn a_capture_begun_and_ended_during_the_record_strands_the_release_until_the_reset(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_race(true);
    }

    /// A sticky error: the events never complete. The future resolves at once to `DeviceFault`
    /// with the driver's code (before: it stayed pending until the user reset the context); a
    /// callback is dropped unrun at once, on the lane, its captures with it, and counted
    /// (before: kept until the reset); the owners stay pending until the reset (earlier work may
    /// still use them), then are dropped once.
    fn after_a_sticky_error_futures_fail_and_releases_wait_for_the_reset(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        release_after(&stream, drops.owner()).unwrap();
        let unrun = cuda_host_launch::cleanup_stats().callbacks_dropped_unrun;
        let captures = Drops::new();
        let ran = Arc::new(AtomicUsize::new(0));
        spawn_after(&stream, {
            let (ran, capture) = (Arc::clone(&ran), captures.owner());
            move || {
                let _keep = &capture;
                ran.fetch_add(1, Ordering::SeqCst);
            }
        })
        .unwrap();
        let future = CompletionMode::Event.completion(&stream).unwrap();
        assert_eq!(fake().poison_context(context.raw()), Ok(()));
        hold.release();
        let result = block_on(future);
        assert!(
            matches!(
                result,
                Err(Error::DeviceFault {
                    code: 719,
                    name: "CUDA_ERROR_LAUNCH_FAILED"
                })
            ),
            "{result:?}"
        );
        let dropped = captures.wait_dropped(1);
        assert!(dropped.iter().all(|d| d.thread.is_reaper()), "{dropped:?}");
        assert_eq!(ran.load(Ordering::SeqCst), 0, "a callback never runs after a sticky error");
        assert_eq!(cuda_host_launch::cleanup_stats().callbacks_dropped_unrun, unrun + 1);
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 0);
        // The release's and the future's records.
        assert_eq!(context.pending_launches(), 2);
        drop(stream);
        // SAFETY: the context's only stream is dropped; nothing made in it is used afterwards.
        let reclaimed = unsafe { context.reset() }.unwrap();
        cuda_workspace::testing::assert_reset_released(&context, reclaimed, 2);
        drops.wait_dropped(1);
        assert_eq!(pending_launches(None), 0);
    }

    /// The special handles (legacy and per-thread default streams, the null stream) work as other
    /// streams: a release waits for the held stream, and a default completion resolves.
    fn the_special_stream_handles_work_as_other_streams(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let context = fake_primary_context();
        context.set_current().unwrap();
        for stream in [RawStream::LEGACY, RawStream::PER_THREAD, RawStream::DEFAULT] {
            let drops = Drops::new();
            let hold = fake()
                .hold_stream(stream.as_raw_stream())
                .expect("the fake could not hold the stream");
            release_after(stream, drops.owner()).unwrap();
            std::thread::sleep(Duration::from_millis(5));
            assert_eq!(drops.dropped(), 0, "{stream:?}: released while the stream is held");
            hold.release();
            drops.wait_dropped(1);
            block_on(cuda_host_launch::completion(stream).unwrap()).unwrap();
        }
    }

    /// A stream of a context made with `cuCtxCreate` is refused (the crate could not keep it alive
    /// for its poller); the owners are handed back, and dropped when the caller drops them.
    fn a_stream_of_a_created_context_is_refused(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        fake_primary_context();
        let created = CreatedContext::new();
        let drops = Drops::new();
        // SAFETY: used while `created` lives.
        let refused = release_after(unsafe { created.raw_stream() }, drops.owner());
        assert!(
            matches!(&refused, Err(e) if matches!(e.error(), Error::NotPrimaryContext { .. })),
            "{refused:?}"
        );
        assert_eq!(drops.dropped(), 0, "the crate dropped what it refused");
        drop(refused);
        let records = drops.records();
        assert_eq!(records.len(), 1);
        assert!(records[0].thread.same_as(&ThreadInfo::current()));
    }

    /// With no primary context on the device, a created context's stream is refused without a
    /// retain of the primary context, which would create one (a context's worth of device memory)
    /// only to destroy it again.
    fn no_primary_context_is_made_to_refuse_a_created_contexts_stream(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        cuda_workspace::testing::load_fake_driver();
        let created = CreatedContext::new();
        // SAFETY: used while `created` lives.
        let refused = spawn_after(unsafe { created.raw_stream() }, || {});
        assert!(
            matches!(&refused, Err(e) if matches!(e.error(), Error::NotPrimaryContext { .. })),
            "{refused:?}"
        );
        assert_eq!(fake().call_count("cuDevicePrimaryCtxRetain"), 0);
    }

    /// While work waits long, the poller's pauses grow with the wait (up to `max_interval`,
    /// 250 µs): 300 ms of waiting cost about a thousand queries, not one per 20 µs; and the
    /// release still comes once the stream gets there. (How soon is a figure, printed here and
    /// measured on the GPU by the benchmark, `completion_latency_long_wait_us`: a bound in
    /// milliseconds is one CPU load can break.)
    fn a_long_wait_costs_few_queries(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        release_after(&stream, drops.owner()).unwrap();
        let before = fake().call_count("cuEventQuery");
        let queries = fake().call_count("cuEventQuery") - before;
        let released = Instant::now();
        hold.release();
        drops.wait_dropped(1);
        let late = released.elapsed();
        println!("{queries} queries in 300 ms of waiting; released {late:?} after the stream got there");
        // Spinning for 20 µs, about 16 pauses of 20 µs, about 40 growing ones to 4 ms, then one
        // per 250 µs: about 1,240 rounds and the spinning's queries (one per 20 µs: 15,000). Load
        // only makes them fewer.
        assert!(queries < 3_000, "{queries} queries in 300 ms of waiting");
    }

    /// Work enqueued while the poller waits long for other work is seen soon: its enqueue wakes
    /// the poller parked for a grown pause, and its own wait starts the pauses over. (Before, a
    /// callback behind nothing waited out the pause that another stream's long wait had grown.)
    ///
    /// The clock is that pause, not a budget of milliseconds that load could use up: after 4.8 s
    /// of waiting, each of the poller's pauses is at least 300 ms (a sixteenth of its wait, with
    /// `max_interval` at 1 s). The callback is enqueued just after a round (seen by the query count
    /// moving), so a poller that is not woken sees it only once that round's whole pause is over;
    /// woken, it sees it well before. The only bound on load: the enqueue and the wake-up must
    /// take less than that pause (hundreds of ms; 34 ms was the worst seen under load).
    fn work_enqueued_during_a_long_pause_is_seen_soon(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        const GROW: Duration = Duration::from_millis(4_800);
        install_poller(cuda_host_launch::PollerSettings {
            max_interval: Duration::from_secs(1),
            ..cuda_host_launch::PollerSettings::DEFAULT
        });
        let context = fake_primary_context();
        let held = Stream::new(&context).unwrap();
        let free = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(held.raw()).expect("the fake could not hold the stream");
        let drops = Drops::new();
        // Only the poller queries events.
        let queries = || fake().call_count("cuEventQuery");
        let before = queries();
        release_after(&held, drops.owner()).unwrap();
        // The round that took the release in (two queries) started the wait the pauses grow with,
        // before the next round's first query: so before this moment.
        wait_for("the poller's second round", || queries() > before + 2);
        let waiting_since = Instant::now();
        std::thread::sleep(GROW);
        // Just after a round (one that began after `quiet`), the poller parks for at least a
        // sixteenth of the wait so far.
        let mut quiet = Instant::now();
        let seen = queries();
        loop {
            let now = Instant::now();
            if queries() != seen {
                break;
            }
            quiet = now;
            std::thread::sleep(Duration::from_micros(100));
        }
        let (sent, ran) = std::sync::mpsc::channel();
        spawn_after(&free, move || {
            let _ = sent.send(Instant::now());
        })
        .unwrap();
        let enqueued = quiet.elapsed();
        let pause = ((quiet - waiting_since) / 16).min(Duration::from_secs(1));
        let ran = ran.recv_timeout(PATIENCE).expect("the callback ran");
        let late = ran.saturating_duration_since(quiet);
        hold.release();
        drops.wait_dropped(1);
        println!(
            "enqueued {enqueued:?} after the round, seen {late:?} after it; the pause that round \
             began: at least {pause:?}"
        );
        assert!(
            late < pause,
            "the callback ran {late:?} after the round before its enqueue ({enqueued:?} after \
             it): not before the {pause:?} pause that round began was over"
        );
    }

    /// While another thread captures in global mode, the poller's queries (and the releases they
    /// complete) leave that capture intact: the poller is in relaxed mode.
    fn the_poller_never_breaks_another_threads_global_capture(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let captured = Stream::new(&context).unwrap();
        let work = Stream::new(&context).unwrap();
        let drops = Drops::new();
        begin_capture(captured.raw(), CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL);
        for _ in 0..10 {
            release_after(&work, drops.owner()).unwrap();
        }
        drops.wait_dropped(10);
        let graph = end_capture(captured.raw()).expect("the global capture survived the poller");
        destroy_graph(graph);
    }

    /// An `Event`-mode future resolves once the stream got there; the poller's CPU time is counted,
    /// and once idle it exits and gives its events back.
    fn event_completions_resolve_and_the_idle_poller_gives_its_events_back(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        install_poller(cuda_host_launch::PollerSettings {
            idle_exit: Duration::from_millis(20),
            ..cuda_host_launch::PollerSettings::DEFAULT
        });
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let future = CompletionMode::Event.completion(&stream).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        hold.release();
        block_on(future).unwrap();
        // The poller counts a round's CPU time after the round, whose wake-up may come first.
        wait_for("the poller's CPU time", || poller_cpu_time() > Duration::ZERO);
        let retains = fake().live_objects("primary_retains");
        wait_for("the poller to exit", || {
            cuda_workspace::testing::threads_named(POLLER) == 0
        });
        assert_eq!(fake().live_objects("events"), 0, "the pool's events destroyed");
        assert_eq!(fake().live_objects("primary_retains"), retains - 1, "its retain let go");
    }

    /// `quiesce` right after the work: the poller's events and its retain are given back and the
    /// fake's live objects are where they were, with no sleep, though its idle exit is an hour
    /// away (`flush` alone keeps them); again each round, the poller started anew by the next
    /// release.
    fn quiesce_gives_the_pollers_events_and_retain_back_at_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        use cuda_host_launch::{PollerSettings, quiesce};
        use fake_cuda::fixture::LiveObjects;
        install_poller(PollerSettings {
            idle_exit: Duration::from_secs(3600),
            ..PollerSettings::DEFAULT
        });
        let context = fake_primary_context();
        let before = LiveObjects::of(fake());
        for round in 0..3 {
            let stream = Stream::new(&context).unwrap();
            let drops = Drops::new();
            release_after(&stream, drops.owner()).unwrap();
            spawn_after(&stream, || ()).unwrap();
            CompletionMode::Event.completion(&stream).unwrap().wait().unwrap();
            stream.synchronize().unwrap();
            drop(stream);
            // Twice: the second's round begins once the first's callbacks ran, so an idle poller
            // that gave its pool back at once would have done it by then.
            flush(PATIENCE).unwrap();
            flush(PATIENCE).unwrap();
            assert_eq!(drops.live(), 0);
            assert!(fake().live_objects("events") > 0, "round {round}: flush gave the pool back");
            quiesce(PATIENCE).unwrap();
            let now = LiveObjects::of(fake());
            assert_eq!(now.grown_since(&before), [], "round {round}: left {now}");
        }
    }

    /// `quiesce` waits for the poller's events that are out, and gives up at its timeout while
    /// a stream holds one back; once the stream goes on, it returns.
    fn quiesce_times_out_while_an_event_is_out(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        use cuda_host_launch::quiesce;
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        release_after(&stream, ()).unwrap();
        let result = quiesce(Duration::from_millis(50));
        assert!(matches!(result, Err(Error::QuiesceTimedOut { .. })), "{result:?}");
        hold.release();
        stream.synchronize().unwrap();
        quiesce(PATIENCE).unwrap();
        assert_eq!(fake().live_objects("events"), 0);
    }

    /// A release runs no users' code on the poller, which then makes no context call for it: per
    /// release, `cuCtxGetCurrent` is called once (by the reaper, after the owner's drop), not
    /// twice.
    fn the_poller_makes_no_context_call_for_a_release(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        const N: u64 = 200;
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap(); // starts the poller and the reaper
        wait_for("the first release", || pending_launches(None) == 0);
        flush(PATIENCE).unwrap();
        let before = fake().call_count("cuCtxGetCurrent");
        let hold = fake().hold_stream(stream.raw()).unwrap();
        for _ in 0..N {
            release_after(&stream, drops.owner()).unwrap();
        }
        hold.release();
        wait_for("the releases", || pending_launches(None) == 0);
        flush(PATIENCE).unwrap();
        let calls = fake().call_count("cuCtxGetCurrent") - before;
        assert_eq!(drops.dropped(), N as usize + 1);
        assert!(calls <= N + 5, "{calls} cuCtxGetCurrent calls for {N} releases");
    }

    /// An enqueue wakes a poller that parks with nothing pending, whether it parked with nothing
    /// to do or just completed everything: no release waits out the idle park (an hour here, so
    /// that a release it would wait for never comes within `PATIENCE`: no bound in milliseconds
    /// that load could break). (An enqueue while work is pending wakes it only from a pause longer
    /// than its shortest.)
    fn an_enqueue_wakes_the_poller_parked_with_nothing_pending(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        install_poller(cuda_host_launch::PollerSettings {
            idle_exit: Duration::from_secs(3_600),
            ..cuda_host_launch::PollerSettings::DEFAULT
        });
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let mut slowest = Duration::ZERO;
        for i in 0..200u32 {
            let start = Instant::now();
            release_after(&stream, drops.owner()).unwrap();
            if i % 2 == 0 {
                // Right away too: the poller may be between its last completion and its park.
                release_after(&stream, drops.owner()).unwrap();
            }
            while pending_launches(None) != 0 {
                assert!(start.elapsed() < PATIENCE, "release {i} waited for the idle park");
                std::hint::spin_loop();
            }
            slowest = slowest.max(start.elapsed());
            // Let the poller park (or not yet), differently each time.
            std::thread::sleep(Duration::from_micros(u64::from(i % 7) * 100));
        }
        flush(PATIENCE).unwrap();
        println!("slowest release: {slowest:?}");
        assert_eq!(drops.dropped(), 300);
    }
}

isolated_test! {
    /// Threads that release and exit: one whose last release is made from a thread-local's
    /// destructor, which runs while its thread exits (after the crate's own thread-local, the
    /// thread's slot of the hand-over, was registered, so before or after it is torn down), and
    /// ones whose completed events wait in their slots' stashes when they are gone. Every owner is
    /// dropped once its stream reached it, and once the poller idles, every event and the pool's
    /// retain are given back: a gone thread's slot leaves nothing behind.
    fn releases_of_exiting_threads_complete_and_their_stashed_events_go_back(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        install_poller(cuda_host_launch::PollerSettings {
            idle_exit: Duration::from_millis(20),
            ..cuda_host_launch::PollerSettings::DEFAULT
        });
        struct AtExit(Option<(Arc<Stream>, Arc<Drops>)>);
        impl Drop for AtExit {
            fn drop(&mut self) {
                if let Some((stream, drops)) = self.0.take() {
                    release_after(&*stream, drops.owner()).unwrap();
                }
            }
        }
        thread_local! {
            static AT_EXIT: std::cell::RefCell<AtExit> = const { std::cell::RefCell::new(AtExit(None)) };
        }
        let context = fake_primary_context();
        let stream = Arc::new(Stream::new(&context).unwrap());
        let retains = fake().live_objects("primary_retains");
        let drops = Drops::new();
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let (stream, drops) = (Arc::clone(&stream), Arc::clone(&drops));
                std::thread::spawn(move || {
                    if i == 0 {
                        // Registered before the crate's thread-local: torn down after it.
                        AT_EXIT.with(|at| {
                            at.borrow_mut().0 = Some((Arc::clone(&stream), Arc::clone(&drops)))
                        });
                    }
                    for _ in 0..3 {
                        release_after(&*stream, drops.owner()).unwrap();
                    }
                    stream.synchronize().unwrap();
                    flush(PATIENCE).unwrap();
                    // One more, whose event comes from this thread's stash.
                    release_after(&*stream, drops.owner()).unwrap();
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        drops.wait_dropped(4 * 4 + 1);
        wait_for("the poller to exit", || {
            cuda_workspace::testing::threads_named(POLLER) == 0
        });
        assert_eq!(fake().live_objects("events"), 0, "every event destroyed, stashed ones too");
        assert_eq!(fake().live_objects("primary_retains"), retains, "the pool's retain let go");
        assert_eq!(fake().unknown_event_calls(), 0);
        assert_eq!(context.pending_launches(), 0);
    }
}

isolated_test! {
    /// Two threads release on one stream, and the second records its event (behind a hold) and
    /// hands it to the poller before the first hands over its own, older one: the older event's
    /// completion must not complete the newer release (queues are per enqueuing thread, whose
    /// records are in stream order).
    fn another_threads_later_release_on_the_same_stream_is_not_completed_early(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Arc::new(Stream::new(&context).unwrap());
        let (first, second) = (Drops::new(), Drops::new());
        let hold: Arc<Mutex<Option<Hold>>> = Arc::default();
        let (inner, late, held) = (Arc::clone(&stream), Arc::clone(&second), Arc::clone(&hold));
        fake().set_hook_after("cuEventRecord", 1, move || {
            // After the first thread's record, before it hands the event over: another thread
            // holds the stream, then releases behind the hold.
            let (inner, late, held) = (Arc::clone(&inner), Arc::clone(&late), Arc::clone(&held));
            let queries = fake().call_count("cuEventQuery");
            std::thread::spawn(move || {
                *held.lock().unwrap() = fake().hold_stream(inner.raw());
                release_after(&*inner, late.owner()).unwrap();
            })
            .join()
            .unwrap();
            // The watcher has taken the newer release (it queries its event) before the older
            // one is handed over: the two would share a queue if threads were not told apart.
            wait_for("the watcher to query the newer release's event", || {
                fake().call_count("cuEventQuery") > queries
            });
        });
        release_after(&*stream, first.owner()).unwrap();
        first.wait_dropped(1);
        std::thread::sleep(Duration::from_millis(50));
        flush(PATIENCE).unwrap();
        assert_eq!(second.dropped(), 0, "released before the hold in front of it was let go");
        hold.lock().unwrap().take().expect("the hook held the stream").release();
        second.wait_dropped(1);
    }
}

isolated_test! {
    /// One thread's release, then a hold, then another release and a callback, on one stream,
    /// all handed to the poller at once when the oldest event has already completed and the newer
    /// ones have not. The poller must complete the oldest entry alone: the newer owner stays, the
    /// newer callback does not run, both still pending, until the hold goes. (Catches a scan that
    /// releases the whole queue once its oldest event completed, and one that queries the oldest
    /// event and takes its answer for the newest's. The poller is kept inside a callback while
    /// the three are enqueued, so that it finds them together, the oldest done: no query can see
    /// the oldest event before it completed.)
    fn the_oldest_release_completing_leaves_the_newer_ones_of_its_queue_pending(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (oldest, newer) = (Drops::new(), Drops::new());
        let ran = Arc::new(AtomicUsize::new(0));
        // A callback that keeps the poller until told to go (it has taken every entry handed
        // over so far; what comes meanwhile waits for its next round).
        let (entered, in_callback) = std::sync::mpsc::channel();
        let (go, wait_for_go) = std::sync::mpsc::channel::<()>();
        spawn_after(&stream, move || {
            let _ = entered.send(());
            let _ = wait_for_go.recv_timeout(PATIENCE);
        })
        .unwrap();
        in_callback.recv_timeout(PATIENCE).expect("the poller ran the first callback");
        release_after(&stream, oldest.owner()).unwrap();
        stream.synchronize().unwrap(); // the oldest event has completed
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        release_after(&stream, newer.owner()).unwrap();
        let counter = Arc::clone(&ran);
        spawn_after(&stream, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        go.send(()).unwrap();
        oldest.wait_dropped(1);
        // The round that completed the oldest is over, and whatever it queued is released.
        flush(PATIENCE).unwrap();
        assert_eq!(
            (newer.dropped(), ran.load(Ordering::SeqCst)),
            (0, 0),
            "the newer release or callback completed while its event had not: only the oldest \
             event of the queue completed"
        );
        assert_eq!(context.pending_launches(), 2);
        hold.release();
        newer.wait_dropped(1);
        wait_for("the callback", || ran.load(Ordering::SeqCst) == 1);
        assert_eq!(context.pending_launches(), 0);
    }
}

isolated_test! {
    /// A reset that fails leaves the context as it was: its pending releases still complete
    /// once their stream gets there.
    fn a_failed_reset_leaves_pending_releases_to_complete(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        fake().set_fault("cuDevicePrimaryCtxReset", 1, 999);
        // SAFETY: nothing else uses the context while the reset runs (which fails anyway).
        let reset = unsafe { context.reset() };
        fake().clear_faults();
        assert!(reset.is_err(), "{reset:?}");
        hold.release();
        stream.synchronize().unwrap();
        drops.wait_dropped(1);
        assert_eq!(context.pending_launches(), 0);
    }

    /// At exit, once the driver is torn down, the event poller makes no driver call: a callback
    /// is pending (its stream held, the poller spinning) when `main` returns, and an exit handler
    /// registered before the driver's asks the fake how many calls came after its teardown.
    fn the_poller_makes_no_driver_call_after_the_drivers_teardown_at_exit(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        // SAFETY: a plain `extern "C"` handler; handlers run in reverse order, so this one runs
        // after the driver's teardown (registered later, by the driver's load).
        unsafe { libc::atexit(calls_after_teardown_at_exit) };
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        install_poller(cuda_host_launch::PollerSettings::LOW_LATENCY);
        // Held until the process exits: the guard is given up, the hold kept.
        let _hold = fake()
            .hold_stream(stream.raw())
            .expect("the fake could not hold the stream")
            .into_token();
        spawn_after(&stream, || {}).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        std::mem::forget(stream);
    }

    /// A crate thread whose first round comes after the driver's teardown (the process began to
    /// exit meanwhile) makes no driver call: the exit gate is armed before the thread starts,
    /// not by its first round. Here the event poller, started by a release before the exit, is
    /// held in its start hook until an exit handler that runs after the teardown lets it go.
    /// Manual cleanup: no reaper arms the gate instead. (Found by the torture harness, seed 4:
    /// the poller armed the gate in its first round, after the teardown, so the gate's handler
    /// ran after the teardown, and the poller queried its events and released its pools.)
    fn a_crate_thread_first_running_after_the_teardown_makes_no_driver_call(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        CUDA_HOST_LAUNCH_CLEANUP = "manual"
    ) {
        // SAFETY: a plain `extern "C"` handler; handlers run in reverse order, so this one runs
        // after the driver's teardown (registered later, by the driver's load).
        unsafe { libc::atexit(release_the_poller_after_the_teardown) };
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        cuda_host_launch::Config::new()
            .threads(cuda_host_launch::ThreadSettings::new().on_start(|which| {
                if which == cuda_host_launch::CrateThread::Watcher {
                    while !POLLER_MAY_START.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }))
            .install()
            .unwrap();
        // Held until the process exits: the poller has an event to query.
        let _hold = fake()
            .hold_stream(stream.raw())
            .expect("the fake could not hold the stream")
            .into_token();
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        wait_for("the poller's thread", || {
            cuda_workspace::testing::threads_named(POLLER) == 1
        });
        std::mem::forget(stream);
        std::mem::forget(context);
        std::mem::forget(drops);
    }
}

/// Lets the event poller of the test above start its first round.
static POLLER_MAY_START: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The exit check of the test above, after the driver's teardown: lets the poller go, gives it
/// time to call the driver (which it does at once when it may: its first round queries the
/// event), and fails the process (exit status 3) if a crate thread did.
extern "C" fn release_the_poller_after_the_teardown() {
    if std::env::var_os(cuda_workspace::testing::ISOLATED_TEST_ENV).is_none() {
        return;
    }
    POLLER_MAY_START.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_millis(300);
    while fake().calls_after_teardown_by("cuda-h") == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    if fake().calls_after_teardown_by("cuda-h") != 0 {
        eprintln!(
            "driver calls after the teardown:\n{}",
            fake().after_teardown_report()
        );
        // SAFETY: ends the process at once, as the failing verdict.
        unsafe { libc::_exit(3) };
    }
}

/// The exit check of `the_poller_makes_no_driver_call_after_the_drivers_teardown_at_exit`: fails
/// the process (exit status 3) if the fake saw a call after its teardown.
extern "C" fn calls_after_teardown_at_exit() {
    if std::env::var_os(cuda_workspace::testing::ISOLATED_TEST_ENV).is_none() {
        return;
    }
    std::thread::sleep(Duration::from_millis(100));
    if fake().calls_after_teardown() != 0 {
        eprintln!(
            "{} driver calls after the teardown",
            fake().calls_after_teardown()
        );
        // SAFETY: ends the process at once, as the failing verdict.
        unsafe { libc::_exit(3) };
    }
}

/// See the two tests above: a capture begun by another thread inside `cuEventRecord`, and with
/// `end_inside`, ended right after it.
fn capture_race(end_inside: bool) {
    let context = PrimaryContext::retain(cuda_host_launch::Device::get(0).unwrap()).unwrap();
    let stream = Stream::new(&context).unwrap();
    let raw = SendStream::of(&stream);
    let graph: Arc<Mutex<Option<usize>>> = Arc::default();
    fake().set_hook("cuEventRecord", 1, move || {
        std::thread::spawn(move || {
            begin_capture(
                raw.raw(),
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        })
        .join()
        .unwrap();
    });
    if end_inside {
        let out = Arc::clone(&graph);
        fake().set_hook_after("cuEventRecord", 1, move || {
            let g = end_capture(raw.raw()).unwrap();
            *out.lock().unwrap() = Some(g.addr());
        });
    }
    let drops = Drops::new();
    let result = release_after(&stream, drops.owner());
    if end_inside {
        result.expect("the call cannot see a capture that began and ended inside it");
    } else {
        assert!(
            matches!(&result, Err(e) if matches!(e.error(), Error::CaptureActive { .. })
                && !e.is_handed_back()),
            "{result:?}"
        );
        drop(result);
        let g =
            end_capture(stream.raw()).expect("the capture survived: its event was never queried");
        *graph.lock().unwrap() = Some(g.addr());
    }
    std::thread::sleep(Duration::from_millis(50));
    flush(PATIENCE).unwrap();
    assert_eq!(drops.dropped(), 0, "never early");
    assert_eq!(context.pending_launches(), 1);
    if let Some(g) = graph.lock().unwrap().take() {
        destroy_graph(std::ptr::with_exposed_provenance_mut(g));
    }
    drop(stream);
    // SAFETY: the context's only stream is dropped; nothing made in it is used afterwards.
    let reclaimed = unsafe { context.reset() }.unwrap();
    cuda_workspace::testing::assert_reset_released(&context, reclaimed, 1);
    drops.wait_dropped(1);
    assert_eq!(pending_launches(None), 0);
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        assert!(Instant::now() < deadline, "a future never resolved");
        std::thread::park_timeout(Duration::from_millis(5));
    }
}

/// A value whose `Drop` runs a closure: user code in an owner's `Drop`.
struct OnDrop(Option<Box<dyn FnOnce() + Send>>);

impl OnDrop {
    fn new(f: impl FnOnce() + Send + 'static) -> OnDrop {
        OnDrop(Some(Box::new(f)))
    }
}

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// When `exit` was called (nanoseconds since `EXIT_EPOCH`), for the exit checks below.
static EXIT_CALLED_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static EXIT_EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Calls `exit(0)` from the calling thread (an owner's `Drop` or a callback), noting when.
fn exit_now() -> ! {
    let epoch = *EXIT_EPOCH.get_or_init(Instant::now);
    EXIT_CALLED_NS.store(epoch.elapsed().as_nanos() as u64 + 1, Ordering::SeqCst);
    std::process::exit(0)
}

/// The exit check of the user-lane exit tests: registered before the crate's first launch, so it
/// runs after the crate's exit handler; fails the process (exit status 3) if that handler waited
/// for the exiting thread itself (its one-second bound) instead of returning at once.
extern "C" fn exit_was_not_held_up() {
    if std::env::var_os(cuda_workspace::testing::ISOLATED_TEST_ENV).is_none() {
        return;
    }
    let called = EXIT_CALLED_NS.load(Ordering::SeqCst);
    let Some(epoch) = EXIT_EPOCH.get() else {
        return;
    };
    let waited = epoch.elapsed().saturating_sub(Duration::from_nanos(called));
    if called == 0 || waited >= Duration::from_millis(500) {
        eprintln!(
            "exit called: {}; the exit waited {waited:?} for the exiting thread",
            called != 0
        );
        // SAFETY: ends the process at once, as the failing verdict.
        unsafe { libc::_exit(3) };
    }
    // The test ended inside its body (the exit): the verdict libtest would have printed.
    println!("\ntest result: ok. 1 passed; 0 failed (the process exited inside the test)");
}

isolated_test! {
    /// The user lane: an owner whose `Drop` awaits a future of another stream (the default
    /// completion mode) while that stream is still held. Its `Drop` runs on the reaper, never on
    /// the poller, so the poller still sees the other stream's event and wakes the future, and
    /// the `Drop` returns. (Before: the poller dropped the owner itself and waited for its own
    /// thread: the future never resolved, and no completion of any stream came again.)
    fn an_owner_whose_drop_awaits_another_streams_completion_stalls_no_completion(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let first = Stream::new(&context).unwrap();
        let second = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(second.raw()).expect("the fake could not hold the stream");
        let future = cuda_host_launch::completion(&second).unwrap();
        let (started_tx, started) = std::sync::mpsc::channel();
        let (result_tx, result) = std::sync::mpsc::channel();
        release_after(
            &first,
            OnDrop::new(move || {
                started_tx.send(ThreadInfo::current()).unwrap();
                result_tx.send(block_on(future)).unwrap();
            }),
        )
        .unwrap();
        let dropping = started.recv_timeout(PATIENCE).expect("the owner was never dropped");
        hold.release();
        let awaited = result
            .recv_timeout(PATIENCE)
            .expect("the future awaited in the owner's Drop never resolved");
        assert!(awaited.is_ok(), "{awaited:?}");
        assert!(dropping.is_reaper(), "{dropping:?}");
        flush(PATIENCE).unwrap();
    }

    /// A callback waiting for the lane (the reaper is busy in an earlier owner's `Drop`) keeps its
    /// pool, and so the pool's retain of the context, though the poller has nothing left to query
    /// and its idle time to exit is long over: the callback then runs in a live context. (Mutation
    /// testing: with a pool's callbacks not counted, the idle poller gave the pool back with the
    /// callback still queued.)
    fn a_callback_waiting_for_the_lane_keeps_its_pools_retain(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        install_poller(cuda_host_launch::PollerSettings {
            idle_exit: Duration::from_millis(1),
            ..cuda_host_launch::PollerSettings::DEFAULT
        });
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (in_drop_tx, in_drop) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        release_after(
            &stream,
            OnDrop::new(move || {
                in_drop_tx.send(()).unwrap();
                let _ = go_rx.recv_timeout(PATIENCE);
            }),
        )
        .unwrap();
        in_drop.recv_timeout(PATIENCE).expect("the owner was never dropped");
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        spawn_after(&stream, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        stream.synchronize().unwrap();
        // A hundred idle exits' worth: the callback is queued behind the blocked Drop.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(
            fake().live_objects("primary_retains"),
            2,
            "the user's retain and the pool's, while its callback waits"
        );
        go.send(()).unwrap();
        wait_for("the callback", || ran.load(Ordering::SeqCst) == 1);
        flush(PATIENCE).unwrap();
    }

    /// `flush` inside a `release_after` owner's `Drop` returns `FlushOnReleasingThread` at once,
    /// as inside any owner's `Drop` (the owner is dropped on the cleanup queue's thread, which the
    /// flush would wait for); a `spawn_after` callback's flush says the same.
    fn flush_inside_an_owners_drop_or_a_callback_refuses_at_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (tx, results) = std::sync::mpsc::channel();
        let in_drop = tx.clone();
        release_after(
            &stream,
            OnDrop::new(move || in_drop.send(format!("{:?}", flush(PATIENCE))).unwrap()),
        )
        .unwrap();
        spawn_after(&stream, move || tx.send(format!("{:?}", flush(PATIENCE))).unwrap()).unwrap();
        for _ in 0..2 {
            let result = results.recv_timeout(PATIENCE).expect("the flush never returned");
            assert_eq!(result, "Err(FlushOnReleasingThread)");
        }
        flush(PATIENCE).unwrap();
    }

    /// `flush` waits for the round of the poller that runs now, not of one that is exiting: a
    /// poller (A) decided to exit (idle) and is held just after (in its reclaim's look at the
    /// context, a hook); a release then starts another poller (B), whose first round is slow (a
    /// hook in its query); a `flush` asks B for a round, and A, let go meanwhile, finishes its
    /// exit. The flush returns only once B's round completed the release: its owner is dropped.
    /// (Before: the exiting poller marked every request served, B's included, and the flush
    /// returned `Ok` with the completed release's owner alive.)
    fn flush_is_answered_by_the_poller_that_runs_not_by_one_that_exits(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        use std::sync::atomic::AtomicBool;
        install_poller(cuda_host_launch::PollerSettings {
            idle_exit: Duration::from_millis(20),
            ..cuda_host_launch::PollerSettings::DEFAULT
        });
        let context = fake_primary_context();
        let first = Stream::new(&context).unwrap();
        let second = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let on_poller = || std::thread::current().name() == Some(POLLER);
        // A, exiting: held in its reclaim's look at the context's state until `go`, with no lock
        // of the crate held (its second look: the first, giving its pool back, is under the
        // hand-over's and the pools' locks).
        let (exiting_tx, exiting) = std::sync::mpsc::channel::<()>();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (exiting_tx, go_rx) = (Mutex::new(exiting_tx), Mutex::new(go_rx));
        let looks = Arc::new(AtomicUsize::new(0));
        {
            let looks = Arc::clone(&looks);
            fake().set_hook("cuDevicePrimaryCtxGetState", 0, move || {
                if on_poller() && looks.fetch_add(1, Ordering::SeqCst) == 1 {
                    let _ = exiting_tx.lock().unwrap().send(());
                    let _ = go_rx.lock().unwrap().recv_timeout(PATIENCE);
                }
            });
        }
        // A launch pending in the context, so that A's reclaim at its exit looks at the context.
        let third = Stream::new(&context).unwrap();
        let pending = fake().hold_stream(third.raw()).expect("the fake could not hold the stream");
        cuda_host_launch::host_launch(&third, || {}).unwrap();
        release_after(&first, drops.owner()).unwrap();
        drops.wait_dropped(1);
        exiting.recv_timeout(PATIENCE).expect("the idle poller never exited");
        // B's first query is slow: the flush's request outlives A's exit.
        let slow = Arc::new(AtomicBool::new(false));
        {
            let slow = Arc::clone(&slow);
            fake().set_hook("cuEventQuery", 0, move || {
                if on_poller() && !slow.swap(true, Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(300));
                }
            });
        }
        let began = Instant::now();
        release_after(&second, drops.owner()).unwrap();
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "the release waited for the exiting poller: it was held under a lock"
        );
        second.synchronize().unwrap();
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            go.send(()).unwrap();
        });
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 2, "flush returned with a completed release's owner alive");
        letting_go.join().unwrap();
        fake().clear_hooks();
        pending.release();
        third.synchronize().unwrap();
    }

    /// `exit` from a `release_after` owner's `Drop`: the crate's exit handler does not wait for
    /// the exiting thread itself (the reaper, where the owner is dropped), so the process ends at
    /// once. (Before: the event poller dropped the owner, and the exit waited its full second for
    /// the poller's own round.)
    fn exit_from_an_owners_drop_is_not_held_up(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        // SAFETY: a plain `extern "C"` handler; registered before the crate's, so it runs after.
        assert_eq!(unsafe { libc::atexit(exit_was_not_held_up) }, 0);
        EXIT_EPOCH.get_or_init(Instant::now);
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        release_after(&stream, OnDrop::new(|| exit_now())).unwrap();
        std::thread::sleep(PATIENCE);
        panic!("the owner's Drop never exited the process");
    }

    /// `exit` from a waker that the event poller calls: the exit handler does not wait for the
    /// poller's own round (the exiting thread), but does wait for the reaper's owner `Drop` in
    /// progress, whose driver call then comes before the driver's teardown. (Mutation testing:
    /// with the poller's driver work not counted as its own, the exit waited its full second;
    /// with it never uncounted, the exit stopped waiting for the reaper, whose call came after
    /// the teardown.)
    fn exit_from_a_waker_waits_for_the_reaper_not_for_itself(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        // SAFETY: plain `extern "C"` handlers; registered before the crate's, so they run after
        // it (and after the fake driver's teardown, registered at its load).
        assert_eq!(unsafe { libc::atexit(exit_was_not_held_up) }, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::atexit(the_reapers_call_came_before_the_teardown) }, 0);
        EXIT_EPOCH.get_or_init(Instant::now);
        let context = fake_primary_context();
        let first = Stream::new(&context).unwrap();
        let second = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(second.raw()).expect("the fake could not hold the stream");
        let (in_drop_tx, in_drop) = std::sync::mpsc::channel();
        release_after(
            &first,
            OnDrop::new(move || {
                in_drop_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(200));
                let mut current = std::ptr::null_mut();
                // SAFETY: a valid out-pointer (a driver call: after the teardown, counted).
                let _ = unsafe { cuda_dl_sys::driver().unwrap().cuCtxGetCurrent(&mut current) };
                REAPERS_DROP_DONE.store(true, Ordering::SeqCst);
            }),
        )
        .unwrap();
        in_drop.recv_timeout(PATIENCE).expect("the owner was never dropped");
        struct ExitOnWake;
        impl std::task::Wake for ExitOnWake {
            fn wake(self: Arc<Self>) {
                exit_now();
            }
        }
        let mut future = Box::pin(CompletionMode::Event.completion(&second).unwrap());
        let waker = std::task::Waker::from(Arc::new(ExitOnWake));
        let polled = future
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker));
        assert!(polled.is_pending());
        hold.release();
        std::thread::sleep(PATIENCE);
        panic!("the waker never exited the process");
    }

    /// The same from a `spawn_after` callback, which runs on the reaper too.
    fn exit_from_a_callback_is_not_held_up(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        // SAFETY: a plain `extern "C"` handler; registered before the crate's, so it runs after.
        assert_eq!(unsafe { libc::atexit(exit_was_not_held_up) }, 0);
        EXIT_EPOCH.get_or_init(Instant::now);
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        spawn_after(&stream, || exit_now()).unwrap();
        std::thread::sleep(PATIENCE);
        panic!("the callback never exited the process");
    }

    /// `flush` after the crate's exit handler ran (an exit handler of the test's, registered
    /// before the crate's first launch, so it runs after the crate's), with event work done just
    /// before the exit (the poller still registered): it returns `ProcessExiting` at once.
    /// (Before: it waited for a round of the poller, which had stopped for good: `FlushTimedOut`
    /// after its whole timeout, and for ever with `Duration::MAX`.)
    fn flush_after_the_exit_handler_returns_at_once(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        // SAFETY: a plain `extern "C"` handler; registered before the crate's, so it runs after.
        assert_eq!(unsafe { libc::atexit(flush_at_exit) }, 0);
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        release_after(&stream, drops.owner()).unwrap();
        drops.wait_dropped(1);
        std::mem::forget(stream);
        std::mem::forget(context);
    }
}

/// Set when the reaper's slow owner `Drop` of `exit_from_a_waker_waits_for_the_reaper_not_for_itself`
/// is done.
static REAPERS_DROP_DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The exit check of `exit_from_a_waker_waits_for_the_reaper_not_for_itself`, after the driver's
/// teardown: lets the reaper's `Drop` finish (a second at most), then fails the process (exit
/// status 3) if its driver call came after the teardown (the crate's handler did not wait for it).
extern "C" fn the_reapers_call_came_before_the_teardown() {
    if std::env::var_os(cuda_workspace::testing::ISOLATED_TEST_ENV).is_none() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while !REAPERS_DROP_DONE.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    if fake().calls_after_teardown() != 0 {
        eprintln!(
            "{} driver calls after the teardown:\n{}",
            fake().calls_after_teardown(),
            fake().after_teardown_report()
        );
        // SAFETY: ends the process at once, as the failing verdict.
        unsafe { libc::_exit(3) };
    }
}

/// The exit check of `flush_after_the_exit_handler_returns_at_once`: a flush after the crate's
/// exit handler must say so at once.
extern "C" fn flush_at_exit() {
    if std::env::var_os(cuda_workspace::testing::ISOLATED_TEST_ENV).is_none() {
        return;
    }
    let began = Instant::now();
    let result = flush(Duration::from_secs(3));
    if !matches!(result, Err(Error::ProcessExiting)) || began.elapsed() > Duration::from_millis(500)
    {
        eprintln!("a flush at exit: {result:?} after {:?}", began.elapsed());
        // SAFETY: ends the process at once, as the failing verdict.
        unsafe { libc::_exit(3) };
    }
}
