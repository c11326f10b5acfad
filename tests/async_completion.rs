//! Futures of stream work (`completion`, `host_launch_async`), in every completion mode, against
//! the fake driver: under a minimal executor (below) and under tokio.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use cuda_host_launch::{
    CompletionMode, Error, Stream, completion, flush, host_launch, host_launch_async,
    launch_host_function_with_bytes, pending_launches,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::owners::{PATIENCE, ThreadInfo, fake_primary_context};
use cuda_workspace::testing::{
    CreatedContext, address_bytes, bump_from_bytes, fake, fake_driver_path, resolves_within,
};

const MODES: [CompletionMode; 4] = [
    CompletionMode::Auto,
    CompletionMode::Event,
    CompletionMode::HostFunction,
    CompletionMode::LowLatency,
];

/// Counts its drop.
struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The smallest executor: park the thread until woken.
struct ThreadWaker(std::thread::Thread);
impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a future never resolved"
        );
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    std::pin::Pin::new(future).poll(&mut Context::from_waker(&waker))
}

#[test]
fn completions_resolve_in_stream_order_in_every_mode() {
    let context = fake_primary_context();
    for mode in MODES {
        let stream = Stream::new(&context).unwrap();
        let hold = fake()
            .hold_stream(stream.raw())
            .expect("the fake could not hold the stream");
        let ran = Arc::new(AtomicUsize::new(0));
        let mut futures = Vec::new();
        for i in 0..5 {
            let counter = Arc::clone(&ran);
            host_launch(&stream, move || {
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
            futures.push((i + 1, mode.completion(&stream).unwrap()));
        }
        for (_, f) in futures.iter_mut() {
            assert!(
                poll_once(f).is_pending(),
                "{mode:?}: nothing ran while the stream is held"
            );
        }
        hold.release();
        for (before, f) in futures {
            block_on(f).unwrap();
            assert!(
                ran.load(Ordering::SeqCst) >= before,
                "{mode:?}: resolved after its work"
            );
        }
    }
}

#[test]
fn wait_blocks_until_the_stream_got_there_in_every_mode() {
    let context = fake_primary_context();
    for mode in MODES {
        let stream = Stream::new(&context).unwrap();
        let hold = fake()
            .hold_stream(stream.raw())
            .expect("the fake could not hold the stream");
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        host_launch(&stream, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let done = mode.completion(&stream).unwrap();
        let seen = std::thread::scope(|scope| {
            let ran = &ran;
            let waiter = scope.spawn(move || {
                done.wait().unwrap();
                ran.load(Ordering::SeqCst)
            });
            hold.release();
            waiter.join().unwrap()
        });
        assert_eq!(
            seen, 1,
            "{mode:?}: wait returned before the stream's work ran"
        );
    }
    let stream = Stream::new(&context).unwrap();
    assert_eq!(
        host_launch_async(&stream, || 6 * 7)
            .unwrap()
            .wait()
            .unwrap(),
        42
    );
    // Inside a host function, waiting for the stream would wait for the driver's thread itself.
    let mut inner = Some(completion(&stream).unwrap());
    let refused = host_launch_async(&stream, move || inner.take().map(|c| c.wait())).unwrap();
    match refused.wait() {
        Ok(Some(Err(Error::InsideHostFunction { operation }))) => {
            assert_eq!(operation, "Completion::wait");
        }
        other => panic!("expected InsideHostFunction, got {other:?}"),
    }
}

#[test]
fn host_launch_async_returns_the_closures_result_and_reports_its_panic() {
    // The panic provoked below prints nothing; others (a failed assertion) print as usual.
    cuda_workspace::testing::quiet_expected_panics(|m| m == "no answer");
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let answer = host_launch_async(&stream, || 6 * 7).unwrap();
    let panicked = host_launch_async(&stream, || -> u32 { panic!("no answer") }).unwrap();
    let after = host_launch_async(&stream, || "still running").unwrap();
    assert_eq!(block_on(answer).unwrap(), 42);
    match block_on(panicked) {
        Err(Error::HostFunctionPanicked { message }) => assert_eq!(message, "no answer"),
        other => panic!("expected a panic report, got {other:?}"),
    }
    assert_eq!(block_on(after).unwrap(), "still running");
}

/// `host_launch_async` refused (a capturing stream: `CaptureActive`) hands its closure back,
/// unrun, with what it captured alive while the stream's earlier work (a hold) still runs; the
/// caller may call it or drop it.
#[test]
fn a_refused_host_launch_async_hands_its_closure_back() {
    let context = fake_primary_context();
    let stream = Stream::new_non_blocking(&context).unwrap();
    let driver = cuda_workspace::testing::load_fake_driver();
    let hold = fake()
        .hold_stream(stream.raw())
        .expect("the fake could not hold the stream");
    let relaxed = cuda_dl_sys::types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a live stream.
    unsafe { driver.cuStreamBeginCapture(stream.raw(), relaxed) }.unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    let captured = Counted(Arc::clone(&dropped));
    let refused = host_launch_async(&stream, move || {
        let _keep = &captured;
        6 * 7
    });
    let refused = refused.expect_err("a run-once launch on a capturing stream");
    assert!(
        matches!(refused.error(), Error::CaptureActive { .. }),
        "{refused:?}"
    );
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        0,
        "dropped while the earlier work runs"
    );
    let mut f = refused.into_inner().expect("handed back");
    let mut graph = std::ptr::null_mut();
    // SAFETY: a live stream; a valid out-pointer.
    unsafe { driver.cuStreamEndCapture(stream.raw(), &mut graph) }.unwrap();
    // SAFETY: the graph the capture made, destroyed once.
    unsafe { driver.cuGraphDestroy(graph) }.unwrap();
    assert_eq!(dropped.load(Ordering::SeqCst), 0);
    hold.release();
    stream.synchronize().unwrap();
    assert_eq!(f(), 42, "the closure handed back is the caller's own");
    drop(f);
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
}

#[test]
fn ten_thousand_concurrent_futures_over_8_streams_all_resolve() {
    let context = fake_primary_context();
    for mode in MODES {
        let streams: Vec<Stream> = (0..8).map(|_| Stream::new(&context).unwrap()).collect();
        let futures: Vec<_> = (0..10_000)
            .map(|i| mode.completion(&streams[i % 8]).unwrap())
            .collect();
        let resolved = futures
            .into_iter()
            .map(block_on)
            .filter(Result::is_ok)
            .count();
        assert_eq!(resolved, 10_000, "{mode:?}");
    }
    let idle_cpu = cuda_host_launch::poller_cpu_time();
    println!("low-latency poller CPU time so far: {idle_cpu:?}");
}

/// Counts of waker drops: all of them, and those on a driver thread (never allowed).
#[derive(Default)]
struct WakerDrops {
    all: AtomicUsize,
    on_driver_thread: AtomicUsize,
}

/// A waker that counts where it is dropped.
struct RecordingWaker {
    thread: std::thread::Thread,
    drops: Arc<WakerDrops>,
}
impl Wake for RecordingWaker {
    fn wake(self: Arc<Self>) {
        self.thread.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.thread.unpark();
    }
}
impl Drop for RecordingWaker {
    fn drop(&mut self) {
        self.drops.all.fetch_add(1, Ordering::SeqCst);
        if ThreadInfo::current().os_name.starts_with("fake-cuda-drive") {
            self.drops.on_driver_thread.fetch_add(1, Ordering::SeqCst);
        }
    }
}

isolated_test! {
    /// Futures dropped before the stream gets there leak nothing, and no waker is dropped on a
    /// driver thread. "Nothing" is counted where the mechanisms bound it, not in heap bytes (which
    /// CPU load moves): every waker (so every future's shared state) is dropped once, every record
    /// is released (no launch pending, the cleanup queue's counts equal), and the tickets, event
    /// pools and low-latency pages stop growing after the first rounds.
    fn futures_dropped_early_leak_nothing_and_wakers_are_never_dropped_on_a_driver_thread(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let waker_drops = Arc::new(WakerDrops::default());
        let mut settled = None;
        for round in 0..42 {
            let hold = fake()
                .hold_stream(stream.raw())
                .expect("the fake could not hold the stream");
            for mode in MODES {
                let count = if round == 0 { 1_000 } else { 200 };
                for _ in 0..count {
                    let mut f = mode.completion(&stream).unwrap();
                    let waker = Waker::from(Arc::new(RecordingWaker {
                        thread: std::thread::current(),
                        drops: Arc::clone(&waker_drops),
                    }));
                    let polled = std::pin::Pin::new(&mut f).poll(&mut Context::from_waker(&waker));
                    assert!(polled.is_pending());
                    drop(waker);
                    drop(f); // dropped before the stream gets there
                }
                drop(host_launch_async(&stream, || vec![0u8; 64]).unwrap());
            }
            hold.release();
            stream.synchronize().unwrap();
            let made = (1_000 + round * 200) * MODES.len();
            // The waker goes with the future's shared state, which the record (or the low-latency
            // poller's entry) holds until the stream got there.
            cuda_workspace::testing::wait_until("every waker dropped", cuda_workspace::testing::PATIENCE, || {
                waker_drops.all.load(Ordering::SeqCst) == made
            });
            flush(Duration::from_secs(5)).unwrap();
            assert_eq!(cuda_host_launch::pending_launches(None), 0, "round {round}");
            let stats = cuda_host_launch::cleanup_stats();
            assert_eq!(stats.queued, stats.released, "round {round}: records never released");
            // What the crate keeps between rounds is bounded by the most work pending at once
            // (round 0's 1,000 per mode): tickets never shrink and stop growing after round 0;
            // the event pools hold at most the events of the two event modes' 1,000 each (plus a
            // batch); the low-latency flags fit two pages of 512 slots.
            let tickets = cuda_host_launch::launch_ticket_bytes();
            let first = *settled.get_or_insert(tickets);
            assert_eq!(tickets, first, "round {round}: the tickets grew");
            let events = fake().live_objects("events");
            assert!(events <= 2 * 1_000 + 32, "round {round}: {events} events kept");
            let pages = fake().live_objects("host_registrations");
            assert!(pages <= 2, "round {round}: {pages} flag pages kept");
        }
        assert_eq!(
            waker_drops.all.load(Ordering::SeqCst),
            (1_000 + 41 * 200) * MODES.len(),
            "each waker dropped once"
        );
        assert_eq!(
            waker_drops.on_driver_thread.load(Ordering::SeqCst),
            0,
            "a waker was dropped on a driver thread"
        );
    }

    /// A sticky error: pending futures of every mode resolve to an error (`DeviceFault` if the
    /// watcher saw the fault first, else `ContextLost` at the reset), and every pending launch
    /// is reclaimed, pooled and boxed records alike.
    fn pending_futures_resolve_to_an_error_after_the_context_reset(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let host = completion(&stream).unwrap();
        let low = CompletionMode::LowLatency.completion(&stream).unwrap();
        let value = host_launch_async(&stream, || 1).unwrap();
        // A closure too big for a pool slot: a boxed record, with a counted owner.
        let (big, dropped) = ([3_u8; 256], Arc::new(AtomicUsize::new(0)));
        let owner = Counted(Arc::clone(&dropped));
        let f = move || {
            let _keep = &owner;
            usize::from(big[0]) + usize::from(big[255])
        };
        assert!(size_of_val(&f) > 128);
        let big_value = host_launch_async(&stream, f).unwrap();
        // A bytes launch (boxed too) beside the futures.
        let ran = Arc::new(AtomicUsize::new(0));
        // SAFETY: `bump_from_bytes` gets the address of `ran`, alive until the end of the test.
        unsafe {
            launch_host_function_with_bytes(&stream, Some(bump_from_bytes), &address_bytes::<200>(&ran))
        }
        .unwrap();
        fake()
            .poison_context(context.raw())
            .expect("the fake could not poison the context");
        hold.release();
        drop(stream);
        // SAFETY: every stream of the context is dropped, and nothing made in it is used after the reset.
        let reclaimed = unsafe { context.reset() }.unwrap();
        // The completion's launch, the two closures' (pooled and boxed), the bytes launch; the
        // poller (the low-latency future's) may release some of them itself.
        cuda_workspace::testing::assert_reset_released(&context, reclaimed, 4);
        // The watcher may have seen the fault before the reset (its query of the default mode's
        // event; its look every 2 ms for the others): `DeviceFault` then, else `ContextLost`.
        // (Under load the look came first once: `ContextLost` alone was asserted then.)
        assert!(lost_or_faulted(&block_on(host)));
        assert!(lost_or_faulted(&block_on(low)));
        assert!(lost_or_faulted(&block_on(value)));
        assert!(lost_or_faulted(&block_on(big_value)));
        flush(Duration::from_secs(5)).unwrap();
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "the boxed closure's owner");
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(pending_launches(None), 0);
    }
}

/// Polls `future` until it is ready (a no-op waker; bounded by `PATIENCE`).
fn ready<F: Future + ?Sized>(mut future: std::pin::Pin<&mut F>) -> F::Output {
    let deadline = std::time::Instant::now() + cuda_workspace::testing::PATIENCE;
    loop {
        if let Poll::Ready(out) = future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            return out;
        }
        assert!(std::time::Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A waker that counts its wake-ups.
#[derive(Default)]
struct CountingWaker(AtomicUsize);
impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

isolated_test! {
    /// A `LowLatency` future of a context that another binding resets after a sticky error (its
    /// flag will never be written) waits in the watcher while a completion in the context made
    /// again at the handle drops the gone context's pages; the next flush still resolves it
    /// (`ContextLost`), since the watcher lists the contexts of what it holds. The watcher's fault
    /// look is kept out from the poisoning to the reset (its `cuStreamQuery` waits at a gate), so
    /// it cannot resolve the future first. (Mutation testing: with new contexts never added to
    /// that list, the future waited for ever.)
    fn a_lost_low_latency_future_fails_after_its_contexts_pages_went(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        use cuda_host_launch::{Device, PrimaryContext};
        let device = Device::get(0).unwrap();
        let context = PrimaryContext::retain(device).unwrap();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let mut lost = Box::pin(CompletionMode::LowLatency.completion(&stream).unwrap());
        let waker = Waker::from(Arc::new(CountingWaker::default()));
        assert!(lost.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        // A poller round: the future is the poller's now.
        flush(cuda_workspace::testing::PATIENCE).unwrap();
        // The watcher's fault look (`support::sticky_error::probe`: a `cuStreamQuery` of the
        // context's legacy stream) waits at this gate while it is closed; closing it waits until
        // no such query is under way.
        static GATE: AtomicBool = AtomicBool::new(false);
        static IN_QUERY: AtomicUsize = AtomicUsize::new(0);
        thread_local! {
            /// This thread's query passed the gate and was counted in `IN_QUERY`. (A query begun
            /// before the hooks were set runs only the hook at its end: counting that one down
            /// wrapped `IN_QUERY` and the wait below never ended, once in a rehearsal under ASan.)
            static COUNTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        let on_watcher = || std::thread::current().name() == Some("cuda-hl-watch");
        fake().set_hook("cuStreamQuery", 0, move || {
            if on_watcher() {
                loop {
                    IN_QUERY.fetch_add(1, Ordering::SeqCst);
                    if !GATE.load(Ordering::SeqCst) {
                        COUNTED.with(|counted| counted.set(true));
                        break;
                    }
                    IN_QUERY.fetch_sub(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        });
        fake().set_hook_after("cuStreamQuery", 0, move || {
            if on_watcher() && COUNTED.with(|counted| counted.replace(false)) {
                IN_QUERY.fetch_sub(1, Ordering::SeqCst);
            }
        });
        // A round begun after the hooks: a query begun before them has ended.
        flush(cuda_workspace::testing::PATIENCE).unwrap();
        GATE.store(true, Ordering::SeqCst);
        while IN_QUERY.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        fake().poison_context(context.raw()).expect("the fake could not poison the context");
        hold.release();
        drop(stream);
        let driver = cuda_dl_sys::driver().unwrap();
        // SAFETY: the context's only stream is dropped; nothing made in it is used afterwards.
        unsafe { driver.cuDevicePrimaryCtxReset_v2(device.raw()) }.unwrap();
        // The other binding's next call retains the device again (on the real driver the context
        // stays destroyed until then), kept to the process's end.
        let mut again = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { driver.cuDevicePrimaryCtxRetain(&mut again, device.raw()) }.unwrap();
        // From here the fault look finds the context made again (another id): no fault.
        GATE.store(false, Ordering::SeqCst);
        // No flush before this completion: it finds the gone context's pages and drops them.
        let stream = Stream::new(&context).unwrap();
        let mut fresh = pin!(CompletionMode::LowLatency.completion(&stream).unwrap());
        let result = ready(fresh.as_mut());
        assert!(result.is_ok(), "{result:?}");
        flush(cuda_workspace::testing::PATIENCE).unwrap();
        let result = ready(lost.as_mut());
        assert!(matches!(result, Err(Error::ContextLost)), "{result:?}");
    }

    /// A fault-watch registration (a `HostFunction` future) that comes while the watcher's flag
    /// side is looking (so it does not wake the watcher) in the very round that then goes idle is
    /// taken at once all the same: the round rechecks the registry as it goes idle. Here it comes
    /// inside that round's fault look (a fake hook on the watcher's `cuStreamQuery`), which also
    /// finds the only other future's context faulted, so the round ends with nothing else to
    /// watch; the new future's context faults later, and only the watcher can tell it. (Mutation
    /// testing: with the recheck skipped, or looking at the wrong list, the watcher parked with
    /// the registration untaken, and the future never resolved.)
    fn a_fault_watch_registered_during_the_round_that_goes_idle_is_taken_at_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        FAKE_CUDA_DEVICES = "2"
    ) {
        use cuda_host_launch::{Device, PrimaryContext};
        use std::sync::Mutex;
        let first = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let held = Stream::new(&first).unwrap();
        let hold = fake().hold_stream(held.raw()).expect("the fake could not hold the stream");
        // A host-function future: the flag side looks for faults in its context every 2 ms.
        let mut doomed = Box::pin(CompletionMode::HostFunction.completion(&held).unwrap());
        assert!(
            doomed
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending()
        );
        let second = PrimaryContext::retain(Device::get(1).unwrap()).unwrap();
        let other = Arc::new(Stream::new(&second).unwrap());
        let later = fake().hold_stream(other.raw()).expect("the fake could not hold the stream");
        let late: Arc<Mutex<Option<cuda_host_launch::Completion>>> = Arc::default();
        static FIRED: AtomicBool = AtomicBool::new(false);
        let (context, stream, out) = (first.raw().addr(), Arc::clone(&other), Arc::clone(&late));
        fake().set_hook("cuStreamQuery", 0, move || {
            if std::thread::current().name() != Some("cuda-hl-watch")
                || FIRED.swap(true, Ordering::SeqCst)
            {
                return;
            }
            // The fault look in progress will find the first context faulted...
            fake()
                .poison_context(std::ptr::with_exposed_provenance_mut(context))
                .expect("the fake could not poison the context");
            // ...and a registration comes meanwhile, from another thread.
            let stream = Arc::clone(&stream);
            let registered = std::thread::spawn(move || {
                CompletionMode::HostFunction.completion(&*stream).unwrap()
            })
            .join()
            .unwrap();
            *out.lock().unwrap() = Some(registered);
        });
        let faulted = ready(doomed.as_mut());
        assert!(
            matches!(faulted, Err(Error::DeviceFault { code: 719, .. })),
            "{faulted:?}"
        );
        assert!(FIRED.load(Ordering::SeqCst), "the hook never ran");
        let mut registered = Box::pin(late.lock().unwrap().take().expect("the registration"));
        // Its host function will never run: only the watcher's fault look can resolve it.
        fake().poison_context(second.raw()).expect("the fake could not poison the context");
        let result = ready(registered.as_mut());
        assert!(
            matches!(result, Err(Error::DeviceFault { code: 719, .. })),
            "{result:?}"
        );
        hold.release();
        later.release();
    }

    /// `flush` waits for the low-latency poller's round: a `LowLatency` future whose flag the
    /// stream wrote before the flush (the stream synchronized) has been woken when `flush`
    /// returns. (Mutation testing: with the wait for that poller answering "done" at once, the
    /// flush returned before the poller's next look, and every test passed.)
    fn flush_waits_for_the_low_latency_pollers_round(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let stream = Stream::new(&fake_primary_context()).unwrap();
        for round in 0..20 {
            let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
            let mut future = Box::pin(CompletionMode::LowLatency.completion(&stream).unwrap());
            let counter = Arc::new(CountingWaker::default());
            let waker = Waker::from(Arc::clone(&counter));
            assert!(future.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
            hold.release();
            stream.synchronize().unwrap();
            flush(cuda_workspace::testing::PATIENCE).unwrap();
            assert!(
                counter.0.load(Ordering::SeqCst) > 0,
                "round {round}: not woken when the flush returned"
            );
            assert!(future.as_mut().poll(&mut Context::from_waker(&waker)).is_ready());
        }
    }

    /// A future that a context loss resolves to `ContextLost` wakes its task: each future (a
    /// completion in each mode that can wait, and a `host_launch_async`) is polled once, pending,
    /// with a waker that counts; after the sticky error and the reset, every waker is woken
    /// without anyone polling (an executor polls only what was woken), and the futures then
    /// resolve to `ContextLost`.
    fn a_future_failed_by_a_context_loss_wakes_its_task(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        type Boxed = std::pin::Pin<Box<dyn Future<Output = Result<(), Error>>>>;
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let mut futures: Vec<(String, Boxed, Arc<CountingWaker>)> = Vec::new();
        let modes = [
            CompletionMode::HostFunction,
            CompletionMode::Event,
            CompletionMode::LowLatency,
        ];
        for mode in modes {
            let future = mode.completion(&stream).unwrap();
            futures.push((format!("{mode:?}"), Box::pin(future), Arc::default()));
        }
        let future = host_launch_async(&stream, || ()).unwrap();
        futures.push(("host_launch_async".into(), Box::pin(future), Arc::default()));
        for (name, future, counter) in &mut futures {
            let waker = Waker::from(Arc::clone(counter));
            let poll = future.as_mut().poll(&mut Context::from_waker(&waker));
            assert!(poll.is_pending(), "{name}: {poll:?} while the stream is held");
        }
        fake().poison_context(context.raw()).expect("the fake could not poison the context");
        hold.release();
        drop(stream);
        // SAFETY: the context's only stream is dropped, and nothing made in it is used after.
        let reclaimed = unsafe { context.reset() }.unwrap();
        // The host function's, the event's and the closure's launches; the poller may release some
        // of them itself.
        cuda_workspace::testing::assert_reset_released(&context, reclaimed, 3);
        for (name, _, counter) in &futures {
            cuda_workspace::testing::wait_until(
                &format!("the {name} future's waker to be woken"),
                cuda_workspace::testing::PATIENCE,
                || counter.0.load(Ordering::SeqCst) > 0,
            );
        }
        for (name, future, counter) in &mut futures {
            let waker = Waker::from(Arc::clone(counter));
            let poll = future.as_mut().poll(&mut Context::from_waker(&waker));
            // An event future may have seen the fault before the reset (`DeviceFault`).
            let resolved = matches!(&poll, Poll::Ready(result) if lost_or_faulted(result));
            assert!(resolved, "{name}: {poll:?}");
        }
    }
}

#[test]
fn completions_work_under_tokio() {
    let context = fake_primary_context();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let stream = Stream::new(&context).unwrap();
        let mut handles = Vec::new();
        for i in 0..100u32 {
            let value = host_launch_async(&stream, move || i * 2).unwrap();
            let done = (MODES[(i % 4) as usize]).completion(&stream).unwrap();
            handles.push(tokio::spawn(async move {
                let v = value.await.unwrap();
                done.await.unwrap();
                v
            }));
        }
        let mut sum = 0;
        for h in handles {
            sum += h.await.unwrap();
        }
        assert_eq!(sum, (0..100).map(|i| i * 2).sum::<u32>());
        let timed =
            tokio::time::timeout(Duration::from_secs(5), completion(&stream).unwrap()).await;
        assert!(matches!(timed, Ok(Ok(()))));
    });
}

/// How many events and host functions the fake driver was given so far.
fn enqueued() -> (u64, u64) {
    (
        fake().call_count("cuEventRecord"),
        fake().call_count("cuLaunchHostFunc"),
    )
}

isolated_test! {
    /// A host-function future alone (no flag waits beside it) is watched for faults too: it
    /// resolves to `DeviceFault` before any reset. (Mutation testing: with the fault look made only
    /// while flags and host-function futures both waited, it waited for the reset.)
    fn a_host_function_future_alone_fails_on_a_device_fault(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let host = CompletionMode::HostFunction.completion(&stream).unwrap();
        fake().poison_context(context.raw()).expect("the fake could not poison the context");
        let result = block_on(host);
        assert!(
            matches!(result, Err(Error::DeviceFault { code: 719, .. })),
            "{result:?}"
        );
        hold.release();
        drop(stream);
        // SAFETY: the context's only stream is dropped, and nothing made in it is used after.
        unsafe { context.reset() }.unwrap();
    }

    /// A host-function future registered while the watcher runs for other work (an event
    /// release, held) but its flag side looks at nothing wakes it to watch the new future: the
    /// future fails on the fault. (Mutation testing: with a running watcher taken for a looking
    /// one, the registration rang nothing and the future waited for the reset.)
    fn a_host_function_future_wakes_a_watcher_busy_with_events_only(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let events = Stream::new(&context).unwrap();
        let hold_events =
            fake().hold_stream(events.raw()).expect("the fake could not hold the stream");
        cuda_host_launch::release_after(&events, ()).unwrap();
        // The watcher runs, for the release's event.
        flush(cuda_workspace::testing::PATIENCE).unwrap();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let host = CompletionMode::HostFunction.completion(&stream).unwrap();
        fake().poison_context(context.raw()).expect("the fake could not poison the context");
        let result = block_on(host);
        assert!(matches!(result, Err(Error::DeviceFault { code: 719, .. })), "{result:?}");
        hold.release();
        hold_events.release();
        drop((stream, events));
        // SAFETY: the context's streams are dropped, and nothing made in it is used after.
        unsafe { context.reset() }.unwrap();
    }

    /// Host-function futures registered while the watcher already looks for faults in their
    /// context (a `flush` makes sure it took the first) do not wake it each (it looks every 2 ms
    /// anyway), and are watched all the same: every one fails on the fault.
    fn host_function_futures_added_to_a_running_fault_watch_fail_on_a_fault(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let first = CompletionMode::HostFunction.completion(&stream).unwrap();
        flush(cuda_workspace::testing::PATIENCE).unwrap();
        let later: Vec<_> = (0..3)
            .map(|_| CompletionMode::HostFunction.completion(&stream).unwrap())
            .collect();
        fake().poison_context(context.raw()).expect("the fake could not poison the context");
        for future in std::iter::once(first).chain(later) {
            let result = block_on(future);
            assert!(matches!(result, Err(Error::DeviceFault { code: 719, .. })), "{result:?}");
        }
        hold.release();
        drop(stream);
        // SAFETY: the context's only stream is dropped, and nothing made in it is used after.
        unsafe { context.reset() }.unwrap();
    }

    /// A host-function future that resolved is no longer watched for faults: once it did, the
    /// low-latency poller (which watched it) has nothing left and exits when idle. (Mutation
    /// testing: with every watched future taken for waiting, the poller looked every 2 ms for good.)
    fn a_resolved_host_function_future_leaves_the_fault_watch(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {

        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        block_on(CompletionMode::HostFunction.completion(&stream).unwrap()).unwrap();
        block_on(host_launch_async(&stream, || 7).unwrap()).unwrap();
        // (A thread takes its name as it starts: looked for, not asserted at once.)
        cuda_workspace::testing::wait_until(
            "the low-latency poller to watch the futures",
            cuda_workspace::testing::PATIENCE,
            || cuda_workspace::testing::threads_named(cuda_host_launch::CrateThread::Watcher.default_name()) == 1,
        );
        cuda_workspace::testing::wait_until(
            "the low-latency poller to exit, idle",
            cuda_workspace::testing::PATIENCE,
            || cuda_workspace::testing::threads_named(cuda_host_launch::CrateThread::Watcher.default_name()) == 0,
        );
    }

    /// A device fault fails the futures that wait on no event without waiting for a reset: a
    /// `LowLatency` future (its flag never comes), a `HostFunction` one and `host_launch_async`'s
    /// (the driver never runs their host functions). The low-latency poller looks for the
    /// context's sticky error every few milliseconds while they wait and resolves them to
    /// `DeviceFault` with the driver's code (before: they stayed pending until the user reset the
    /// context). The closure's owner is kept until the reset, which drops it once.
    fn futures_without_an_event_fail_on_a_device_fault_before_any_reset(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let low = CompletionMode::LowLatency.completion(&stream).unwrap();
        let host = CompletionMode::HostFunction.completion(&stream).unwrap();
        let dropped = Arc::new(AtomicUsize::new(0));
        let owner = Counted(Arc::clone(&dropped));
        let value = host_launch_async(&stream, move || {
            let _keep = &owner;
            7
        })
        .unwrap();
        fake().poison_context(context.raw()).expect("the fake could not poison the context");
        let faulted = |error: Option<&Error>| {
            matches!(
                error,
                Some(Error::DeviceFault {
                    code: 719,
                    name: "CUDA_ERROR_LAUNCH_FAILED"
                })
            )
        };
        let results = (block_on(low), block_on(host), block_on(value));
        assert!(faulted(results.0.as_ref().err()), "{results:?}");
        assert!(faulted(results.1.as_ref().err()), "{results:?}");
        assert!(faulted(results.2.as_ref().err()), "{results:?}");
        assert_eq!(dropped.load(Ordering::SeqCst), 0, "the closure's owner before the reset");
        hold.release();
        drop(stream);
        // SAFETY: the context's only stream is dropped, and nothing made in it is used after.
        unsafe { context.reset() }.unwrap();
        flush(Duration::from_secs(5)).unwrap();
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "the closure's owner after the reset");
    }

    /// `completion` (`Auto`) records an event on a stream of a primary context, enqueues a host
    /// function on a stream of a created context, and refuses a capturing stream as every mode
    /// does.
    fn auto_uses_an_event_where_it_can_and_a_host_function_elsewhere(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        assert_eq!(CompletionMode::default(), CompletionMode::Auto);
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (events, host_functions) = enqueued();
        block_on(completion(&stream).unwrap()).unwrap();
        assert_eq!(enqueued(), (events + 1, host_functions), "one event, no host function");

        // A created context: a host function. The refused event attempt leaves nothing behind
        // (no event, no retain), and the next completion there asks nothing more to refuse it.
        let created = CreatedContext::new();
        let objects = || (fake().live_objects("events"), fake().live_objects("primary_retains"));
        let before = objects();
        // SAFETY: used while `created` lives.
        block_on(completion(unsafe { created.raw_stream() }).unwrap()).unwrap();
        assert_eq!(enqueued(), (events + 1, host_functions + 1), "a host function");
        assert_eq!(objects(), before, "events and primary retains");
        let asked = fake().call_count("cuDevicePrimaryCtxGetState");
        // SAFETY: as above.
        block_on(completion(unsafe { created.raw_stream() }).unwrap()).unwrap();
        assert_eq!(enqueued(), (events + 1, host_functions + 2));
        assert_eq!(fake().call_count("cuDevicePrimaryCtxGetState"), asked, "asked again");
        drop(created);

        let driver = cuda_dl_sys::driver().unwrap();
        // SAFETY: a live stream.
        unsafe {
            driver.cuStreamBeginCapture(
                stream.raw(),
                cuda_dl_sys::types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
        .unwrap();
        let refused = completion(&stream);
        assert!(matches!(refused, Err(Error::CaptureActive { .. })), "{refused:?}");
        let mut graph = std::ptr::null_mut();
        // SAFETY: the capture begun above; a valid out-pointer.
        unsafe { driver.cuStreamEndCapture(stream.raw(), &mut graph) }.unwrap();
        // SAFETY: the capture's graph, destroyed once.
        unsafe { driver.cuGraphDestroy(graph) }.unwrap();
        assert_eq!(pending_launches(None), 0);
    }

    /// Before CUDA 12.0 (no `cuStreamGetId`) `completion` uses a host function.
    fn auto_uses_a_host_function_before_cuda_12(
        FAKE_CUDA_VERSION = "11080",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (events, host_functions) = enqueued();
        block_on(completion(&stream).unwrap()).unwrap();
        assert_eq!(enqueued(), (events, host_functions + 1));
        let refused = CompletionMode::Event.completion(&stream);
        assert!(
            matches!(refused, Err(Error::NeedsNewerDriver { function: "cuStreamGetId", .. })),
            "{refused:?}"
        );
        // Each event operation says that it needs CUDA 12.0, under its own name.
        let refusals: [(&str, Result<(), Error>); 3] = [
            (
                "release_after",
                cuda_host_launch::release_after(&stream, ()).map_err(Error::from),
            ),
            (
                "spawn_after",
                cuda_host_launch::spawn_after(&stream, || ()).map_err(Error::from),
            ),
            ("an event completion", refused.map(drop)),
        ];
        for (name, refused) in refusals {
            let message = refused.expect_err(name).to_string();
            assert!(
                message.starts_with(name) && message.contains("needs CUDA 12.0"),
                "{message}"
            );
        }
    }
}

isolated_test! {
    /// A query of the watcher that fails for a reason that is neither a device fault nor a lost
    /// context (here `CUDA_ERROR_OUT_OF_MEMORY`, injected into the first `cuEventQuery` after the
    /// enqueues) says nothing about the work: the event's future, release and callback complete
    /// when the stream gets there. (Before: the failure stranded the stream's whole queue until
    /// the context's reset; the torture harness's user code awaiting such a future on the
    /// reaper waited 20 s, seed 1796570842.)
    fn a_failed_event_query_is_asked_again_not_taken_for_a_loss(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let dropped = Arc::new(AtomicUsize::new(0));
        cuda_host_launch::release_after(&stream, Counted(Arc::clone(&dropped))).unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let ran_there = Arc::clone(&ran);
        cuda_host_launch::spawn_after(&stream, move || ran_there.store(true, Ordering::SeqCst))
            .unwrap();
        let event = CompletionMode::Event.completion(&stream).unwrap();
        let auto = CompletionMode::Auto.completion(&stream).unwrap();
        let queries = fake().call_count("cuEventQuery");
        fake().set_fault("cuEventQuery", 1, 2);
        // The watcher's next query fails, while the stream is held.
        cuda_workspace::testing::wait_until("the watcher's failed query", PATIENCE, || {
            fake().call_count("cuEventQuery") > queries
        });
        hold.release();
        let results = (
            resolves_within(event, PATIENCE),
            resolves_within(auto, PATIENCE),
        );
        assert!(
            matches!(results, (Some(Ok(())), Some(Ok(())))),
            "{results:?}"
        );
        flush(PATIENCE).unwrap();
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "the release's owner");
        assert!(ran.load(Ordering::SeqCst), "the callback");
        assert_eq!(pending_launches(None), 0);
    }
}

isolated_test! {
    /// A query of the watcher that answers that the event's context is gone
    /// (`CUDA_ERROR_CONTEXT_IS_DESTROYED`, injected into every `cuEventQuery`) strands the
    /// stream's work instead of asking again for ever: the pool gives its retain of the context
    /// back, so the user's last release destroys the context and its reclaim fails the future
    /// (`ContextLost`). (Mutation testing: with no code taken for a gone context, the watcher
    /// kept asking, the pool kept the context, and the future waited for ever.)
    fn a_query_that_answers_a_context_gone_strands_the_streams_work_for_the_reclaim(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        use cuda_host_launch::{Device, PrimaryContext};
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let future = CompletionMode::Event.completion(&stream).unwrap();
        let queries = fake().call_count("cuEventQuery");
        fake().set_fault("cuEventQuery", 0, 709);
        cuda_workspace::testing::wait_until("the watcher's query", PATIENCE, || {
            fake().call_count("cuEventQuery") > queries
        });
        hold.release();
        drop(stream);
        // The last release: the context is destroyed, and its work reclaimed.
        drop(context);
        let result = resolves_within(future, PATIENCE);
        fake().clear_faults();
        assert!(matches!(result, Some(Err(Error::ContextLost))), "{result:?}");
        flush(PATIENCE).unwrap();
        assert_eq!(pending_launches(None), 0);
    }
}

isolated_test! {
    /// A device-side assert (`CUDA_ERROR_ASSERT`, 710, injected into every `cuEventQuery`) is a
    /// sticky error: the stream's event future fails at once with its code. (Before: 710 was not
    /// in the crate's list of sticky codes, and the watcher asked again for ever.)
    fn a_device_assert_fails_the_streams_event_futures_at_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let future = CompletionMode::Event.completion(&stream).unwrap();
        fake().set_fault("cuEventQuery", 0, 710);
        let result = resolves_within(future, PATIENCE);
        fake().clear_faults();
        assert!(
            matches!(
                result,
                Some(Err(Error::DeviceFault {
                    code: 710,
                    name: "CUDA_ERROR_ASSERT"
                }))
            ),
            "{result:?}"
        );
        hold.release();
        drop(stream);
        // SAFETY: the context's only stream is dropped, and nothing made in it is used after.
        unsafe { context.reset() }.unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(pending_launches(None), 0);
    }
}

/// An owner whose `Drop` (on the reaper) awaits two futures, keeping what they resolved to (`None`:
/// not within `PATIENCE`).
struct AwaitsInDrop {
    futures: Option<(
        cuda_host_launch::Completion,
        cuda_host_launch::HostLaunchFuture<i32>,
    )>,
    started: Arc<AtomicBool>,
    results: Arc<std::sync::Mutex<Option<AwaitedResults>>>,
}

type AwaitedResults = (Option<Result<(), Error>>, Option<Result<i32, Error>>);

impl Drop for AwaitsInDrop {
    fn drop(&mut self) {
        self.started.store(true, Ordering::SeqCst);
        if let Some((host, value)) = self.futures.take() {
            let results = (
                resolves_within(host, PATIENCE),
                resolves_within(value, PATIENCE),
            );
            *self.results.lock().unwrap() = Some(results);
        }
    }
}

isolated_test! {
    /// User code on the reaper (an owner's `Drop`) that awaits futures whose context is lost
    /// sees them fail at the reclaim: the reclaim fails them where it takes their records, on its
    /// own thread. (Before: they failed only when their records were released, on the reaper,
    /// which the awaiting code held: an await without a limit there waited for ever.) A created
    /// context with a sticky error: the fault watch covers only primary contexts, so the reclaim
    /// is what ends these futures.
    fn futures_awaited_on_the_reaper_fail_at_their_contexts_reclaim(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let created = CreatedContext::new();
        let hold = fake().hold_stream(created.stream).expect("the fake could not hold the stream");
        // SAFETY: used while `created` lives.
        let host = CompletionMode::HostFunction.completion(unsafe { created.raw_stream() });
        // SAFETY: as above.
        let value = host_launch_async(unsafe { created.raw_stream() }, || 7);
        let futures = (host.unwrap(), value.map_err(|e| e.error().to_string()).unwrap());
        fake().poison_context(created.context).expect("the fake could not poison the context");
        hold.release();
        let started = Arc::new(AtomicBool::new(false));
        let results = Arc::new(std::sync::Mutex::new(None));
        let stream = Stream::new(&context).unwrap();
        let owner = AwaitsInDrop {
            futures: Some(futures),
            started: Arc::clone(&started),
            results: Arc::clone(&results),
        };
        cuda_host_launch::release_after(&stream, owner).unwrap();
        cuda_workspace::testing::wait_until("the owner's drop", PATIENCE, || {
            started.load(Ordering::SeqCst)
        });
        let handle = created.context;
        drop(created);
        // SAFETY: the context was destroyed just above.
        assert_eq!(unsafe { cuda_host_launch::reclaim_pending(handle) }, 2);
        flush(PATIENCE * 3).unwrap();
        let results = results.lock().unwrap().take();
        assert!(
            matches!(
                results,
                Some((Some(Err(Error::ContextLost)), Some(Err(Error::ContextLost))))
            ),
            "{results:?}"
        );
        assert_eq!(pending_launches(None), 0);
    }
}

/// Whether a future of a context that had a sticky error and was then reset resolved as it may:
/// `ContextLost` (the reset's reclaim came first) or `DeviceFault` with the fault's code (the
/// event poller saw the fault first).
fn lost_or_faulted<T>(result: &Result<T, Error>) -> bool {
    matches!(
        result,
        Err(Error::ContextLost | Error::DeviceFault { code: 719, .. })
    )
}
