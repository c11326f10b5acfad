//! Soundness of the futures, the low-latency mode and `flush`, against the fake driver:
//!
//! - a low-latency completion on a capturing stream is refused, also when the capture begins
//!   between the crate's look and its flag write, and a replayed flag write never resolves a later
//!   future that got the same flag slot;
//! - a waker that panics (woken on a driver thread, or by the low-latency poller) is caught and
//!   reported, the process goes on and the other futures still resolve;
//! - `flush(Duration::MAX)` waits instead of panicking, and `flush` called by the thread that is
//!   releasing records (inside an owner's `Drop`, or the panic handler) returns an error at once;
//! - a context created at a destroyed context's handle never gets the dead context's flag pages.

use std::future::Future;
use std::pin::Pin;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUcontext, CUresult, CUstream, CUstreamCaptureMode};
use cuda_host_launch::{
    CompletionMode, Error, Graph, PanicOrigin, RawStream, Stream, completion, flush, host_launch,
    host_launch_async, set_panic_handler,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{fake, fake_driver_path, fake_primary_context, load_fake_driver};

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// Long enough for anything that should happen to happen (the poller sleeps at most 1 ms).
const PATIENCE: Duration = Duration::from_secs(10);

/// Wakes by unparking a thread, and counts its wakes.
struct ThreadWaker {
    thread: std::thread::Thread,
    wakes: AtomicUsize,
}
impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.thread.unpark();
    }
}

fn thread_waker() -> Waker {
    Waker::from(Arc::new(ThreadWaker {
        thread: std::thread::current(),
        wakes: AtomicUsize::new(0),
    }))
}

/// A waker whose every wake panics.
struct PanickingWaker;
impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        panic!("the waker panicked");
    }
    fn wake_by_ref(self: &Arc<Self>) {
        panic!("the waker panicked");
    }
}

fn poll_with<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

/// Polls until ready, or panics after `PATIENCE`.
fn wait_for<F: Future + Unpin>(future: &mut F, what: &str) -> F::Output {
    let waker = thread_waker();
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Poll::Ready(out) = poll_with(future, &waker) {
            return out;
        }
        assert!(Instant::now() < deadline, "{what} never resolved");
        std::thread::park_timeout(Duration::from_millis(5));
    }
}

/// The panics the tests below provoke on purpose print nothing; others (a failed assertion) print
/// as usual.
fn quiet_expected_panics() {
    cuda_workspace::testing::quiet_expected_panics(|m| {
        matches!(
            m,
            "the waker panicked"
                | "reported"
                | "the waker's clone panicked"
                | "the waker's drop panicked"
        )
    });
}

/// Quiets the expected panics and collects the reports of the crate's panic handler.
fn collect_reports() -> Arc<Mutex<Vec<(PanicOrigin, String)>>> {
    quiet_expected_panics();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&reports);
    set_panic_handler(move |report| {
        sink.lock()
            .unwrap()
            .push((report.origin, report.message.to_string()));
    });
    reports
}

/// Waits until `reports` holds `count` reports of `origin`.
fn wait_for_reports(
    reports: &Mutex<Vec<(PanicOrigin, String)>>,
    origin: PanicOrigin,
    count: usize,
) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let seen = reports
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, m)| *o == origin && m == "the waker panicked")
            .count();
        if seen >= count {
            assert_eq!(seen, count, "each panicking wake reported once");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{count} reports of {origin:?} expected, {seen} seen: {:?}",
            reports.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn begin_capture(stream: CUstream) {
    let driver = load_fake_driver();
    // SAFETY: a live stream of the fake.
    unsafe { driver.cuStreamBeginCapture(stream, RELAXED) }.unwrap();
}

fn end_capture(stream: CUstream) -> Graph {
    let driver = load_fake_driver();
    let mut raw = ptr::null_mut();
    // SAFETY: a live stream whose capture began above; a valid out-pointer.
    unsafe { driver.cuStreamEndCapture(stream, &mut raw) }.unwrap();
    // SAFETY: a graph the driver just made, owned by nobody else.
    unsafe { Graph::from_raw(raw) }
}

// ---- 3: low-latency completions and stream capture ----

#[test]
fn a_low_latency_completion_on_a_capturing_stream_is_refused() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    begin_capture(stream.raw());
    let refused = CompletionMode::LowLatency.completion(&stream);
    assert!(
        matches!(refused, Err(Error::CaptureActive { stream: s, .. }) if s == stream.raw().addr()),
        "expected CaptureActive, got {refused:?}"
    );
    let graph = end_capture(stream.raw());
    assert_eq!(
        graph.nodes().unwrap().len(),
        0,
        "the refused write left a node"
    );
}

isolated_test! {
    /// A capture another thread begins between the crate's look at the stream and its flag write:
    /// the look after the write sees it, the completion is refused, and the flag slot the graph
    /// now writes on every replay is never handed to another future.
    fn a_capture_begun_after_the_look_is_seen_after_the_write_and_its_slot_never_reused(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let (captured, waiting, replay) = (
            Stream::new(&context).unwrap(),
            Stream::new(&context).unwrap(),
            Stream::new(&context).unwrap(),
        );
        begin_capture(captured.raw());
        fake().hide_capture(1);
        let refused = CompletionMode::LowLatency.completion(&captured);
        assert!(
            matches!(refused, Err(Error::CaptureActive { .. })),
            "expected CaptureActive, got {refused:?}"
        );
        let exec = end_capture(captured.raw()).instantiate().unwrap();
        let hold = fake().hold_stream(waiting.raw()).expect("the fake could not hold the stream");
        let mut futures: Vec<_> = (0..8)
            .map(|_| CompletionMode::LowLatency.completion(&waiting).unwrap())
            .collect();
        let waker = thread_waker();
        for _ in 0..3 {
            exec.launch(&replay).unwrap();
            replay.synchronize().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        for f in &mut futures {
            assert!(poll_with(f, &waker).is_pending(), "a replay resolved a future");
        }
        hold.release();
        for f in &mut futures {
            wait_for(f, "a completion after the hold").unwrap();
        }
    }

    /// A capture that begins and ends between the crate's two looks goes unseen, and the future
    /// is returned; its captured flag write then runs on every replay. Once that future resolved
    /// (at the first replay) and its slot went to a later future, later replays must not resolve
    /// that later future.
    fn a_replayed_flag_write_never_resolves_a_later_future_in_the_same_slot(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let (captured, waiting, replay) = (
            Stream::new(&context).unwrap(),
            Stream::new(&context).unwrap(),
            Stream::new(&context).unwrap(),
        );
        begin_capture(captured.raw());
        fake().hide_capture(2);
        let mut unseen = CompletionMode::LowLatency.completion(&captured).unwrap();
        let exec = end_capture(captured.raw()).instantiate().unwrap();
        exec.launch(&replay).unwrap();
        replay.synchronize().unwrap();
        wait_for(&mut unseen, "the captured completion at its replay").unwrap();
        // The poller gives the slot back just after it resolved the future.
        std::thread::sleep(Duration::from_millis(20));
        let hold = fake().hold_stream(waiting.raw()).expect("the fake could not hold the stream");
        let mut futures: Vec<_> = (0..8)
            .map(|_| CompletionMode::LowLatency.completion(&waiting).unwrap())
            .collect();
        let waker = thread_waker();
        for _ in 0..3 {
            exec.launch(&replay).unwrap();
            replay.synchronize().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        for f in &mut futures {
            assert!(
                poll_with(f, &waker).is_pending(),
                "a replay resolved a future whose stream is still held"
            );
        }
        hold.release();
        for f in &mut futures {
            wait_for(f, "a completion after the hold").unwrap();
        }
    }
}

// ---- 4: wakers that panic ----

isolated_test! {
    /// A waker that panics when a host function completes its future (on the driver's thread)
    /// is caught there and reported, as `PanicOrigin::Waker`, by the releasing thread; the process
    /// does not abort and the future still resolves.
    fn a_waker_panicking_on_the_driver_thread_is_reported_not_aborting(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let reports = collect_reports();
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let panicking = Waker::from(Arc::new(PanickingWaker));
        let mut done = completion(&stream).unwrap();
        let mut value = host_launch_async(&stream, || 42).unwrap();
        assert!(poll_with(&mut done, &panicking).is_pending());
        assert!(poll_with(&mut value, &panicking).is_pending());
        hold.release();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        wait_for_reports(&reports, PanicOrigin::Waker, 2);
        wait_for(&mut done, "the completion").unwrap();
        assert_eq!(wait_for(&mut value, "the closure's result").unwrap(), 42);
        // The stream and the cleanup queue go on.
        let mut after = completion(&stream).unwrap();
        wait_for(&mut after, "a later completion").unwrap();
    }

    /// A waker that panics when the low-latency poller wakes it is caught and reported; the
    /// poller goes on, so the other futures still resolve.
    fn a_waker_panicking_on_the_poller_is_reported_and_the_poller_goes_on(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let reports = collect_reports();
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let panicking = Waker::from(Arc::new(PanickingWaker));
        let mut first = CompletionMode::LowLatency.completion(&stream).unwrap();
        let mut second = CompletionMode::LowLatency.completion(&stream).unwrap();
        assert!(poll_with(&mut first, &panicking).is_pending());
        let waker = thread_waker();
        assert!(poll_with(&mut second, &waker).is_pending());
        hold.release();
        wait_for(&mut second, "the future beside the panicking waker").unwrap();
        // The report first: polling `first` again before the poller woke it would replace the
        // panicking waker, and then nothing panics (the poller's wake finds the new waker).
        wait_for_reports(&reports, PanicOrigin::Waker, 1);
        wait_for(&mut first, "the future of the panicking waker").unwrap();
        let mut later = CompletionMode::LowLatency.completion(&stream).unwrap();
        wait_for(&mut later, "a later low-latency completion").unwrap();
    }
}

/// A waker whose `clone` panics (when the future stores it) or whose `drop` panics (when a later
/// poll replaces it): the panic goes on up to the poll, and the slot stays usable: a later poll's
/// waker is stored and woken when the stream gets there, without polling again. (Before: the slot
/// stayed "registering" after the panic, and every later wake-up was lost.)
#[test]
fn a_waker_panicking_in_clone_or_drop_leaves_later_wakeups_working() {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::task::{RawWaker, RawWakerVTable};
    quiet_expected_panics();
    fn clone_panics(_: *const ()) -> RawWaker {
        panic!("the waker's clone panicked")
    }
    fn nothing(_: *const ()) {}
    static CLONE_PANICS: RawWakerVTable =
        RawWakerVTable::new(clone_panics, nothing, nothing, nothing);
    struct DropPanics;
    impl Wake for DropPanics {
        fn wake(self: Arc<Self>) {}
    }
    impl Drop for DropPanics {
        fn drop(&mut self) {
            panic!("the waker's drop panicked");
        }
    }
    /// Counts its wakes.
    #[derive(Default)]
    struct Counting(AtomicUsize);
    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    for mode in [
        CompletionMode::HostFunction,
        CompletionMode::Event,
        CompletionMode::LowLatency,
    ] {
        let hold = fake()
            .hold_stream(stream.raw())
            .expect("the fake could not hold the stream");
        let mut future = mode.completion(&stream).unwrap();
        // SAFETY: the vtable's functions ignore the data pointer; `clone` panics before it would
        // have to make a waker.
        let clone_panics = unsafe { Waker::from_raw(RawWaker::new(ptr::null(), &CLONE_PANICS)) };
        let polled = catch_unwind(AssertUnwindSafe(|| poll_with(&mut future, &clone_panics)));
        assert!(
            polled.is_err(),
            "{mode:?}: the clone's panic reaches the poll"
        );
        // Stored (an Arc clone does not panic); replacing it drops it, which panics.
        let drop_panics = Waker::from(Arc::new(DropPanics));
        assert!(poll_with(&mut future, &drop_panics).is_pending());
        drop(drop_panics);
        let counting = Arc::new(Counting::default());
        let waker = Waker::from(Arc::clone(&counting));
        let polled = catch_unwind(AssertUnwindSafe(|| poll_with(&mut future, &waker)));
        assert!(
            polled.is_err(),
            "{mode:?}: the old waker's drop panic reaches the poll"
        );
        hold.release();
        let deadline = Instant::now() + cuda_workspace::testing::PATIENCE;
        while counting.0.load(Ordering::SeqCst) == 0 {
            assert!(
                Instant::now() < deadline,
                "{mode:?}: the stored waker was never woken"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(matches!(
            poll_with(&mut future, &waker),
            Poll::Ready(Ok(()))
        ));
    }
}

// ---- 5 and 6: flush ----

#[test]
fn flush_with_the_longest_timeout_waits_as_long_as_it_takes() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ran);
    host_launch(&stream, move || {
        counter.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    stream.synchronize().unwrap();
    flush(Duration::MAX).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(
        Arc::strong_count(&ran),
        1,
        "the closure's captures were dropped"
    );
}

/// The timeout of the `flush` calls made on the releasing thread: longer than [`PATIENCE`], so
/// that a `flush` that waited for its own thread is seen by the test's wait running out (or by
/// its result, a timeout), never confused with a slow machine.
const FLUSH_ON_RELEASER: Duration = Duration::from_secs(60);

/// Calls `flush` in its `Drop` and sends what it returned and how long it took.
struct FlushingOwner(mpsc::Sender<(Result<(), Error>, Duration)>);
impl Drop for FlushingOwner {
    fn drop(&mut self) {
        let started = Instant::now();
        let result = flush(FLUSH_ON_RELEASER);
        let _ = self.0.send((result, started.elapsed()));
    }
}

/// `flush` refused on the releasing thread, before its timeout ran out (no wait for itself).
fn assert_refused_at_once(outcome: (Result<(), Error>, Duration)) {
    let (result, took) = outcome;
    assert!(
        took < FLUSH_ON_RELEASER,
        "flush waited {took:?}, its whole timeout, for the thread that called it"
    );
    assert!(
        matches!(result, Err(Error::FlushOnReleasingThread)),
        "expected FlushOnReleasingThread, got {result:?} after {took:?}"
    );
}

isolated_test! {
    /// `flush` inside an owner's `Drop` and inside the panic handler (both run by the reaper)
    /// returns an error at once instead of waiting for itself, and the reaper goes on.
    fn flush_by_the_reaper_returns_an_error_at_once(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        quiet_expected_panics();
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (tx, rx) = mpsc::channel();
        let owner = FlushingOwner(tx.clone());
        host_launch(&stream, move || {
            let _keep = &owner;
        })
        .unwrap();
        let dropped = rx.recv_timeout(PATIENCE);
        assert_refused_at_once(dropped.expect("the owner's drop (its flush) returned"));
        let handler_tx = Mutex::new(tx);
        set_panic_handler(move |_| {
            let started = Instant::now();
            let result = flush(FLUSH_ON_RELEASER);
            let _ = handler_tx.lock().unwrap().send((result, started.elapsed()));
        });
        host_launch(&stream, || panic!("reported")).unwrap();
        let reported = rx.recv_timeout(PATIENCE);
        assert_refused_at_once(reported.expect("the panic handler (its flush) returned"));
        cuda_host_launch::reset_panic_handler();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
    }

    /// In manual mode the thread that drains is the releasing thread: `flush` inside an owner's
    /// `Drop` returns an error at once there too.
    fn flush_by_a_draining_thread_returns_an_error_at_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
        CUDA_HOST_LAUNCH_CLEANUP = "manual"
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (tx, rx) = mpsc::channel();
        let owner = FlushingOwner(tx);
        // Held until the launch returned: else its own drain (manual mode) may find the host
        // function already run and release the owner itself.
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        host_launch(&stream, move || {
            let _keep = &owner;
        })
        .unwrap();
        hold.release();
        stream.synchronize().unwrap();
        assert_eq!(cuda_host_launch::drain(), 1);
        assert_refused_at_once(rx.try_recv().expect("the owner was dropped by the drain"));
        flush(PATIENCE).unwrap();
    }
}

// ---- 8: flag pages and contexts created at a destroyed context's handle ----

/// Creates a context (`cuCtxCreate`) and a stream in it; the context is popped again.
fn new_context_and_stream() -> (CUcontext, CUstream) {
    let driver = load_fake_driver();
    let (mut context, mut stream, mut popped) = (ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
    // SAFETY: valid out-pointers; the new context is pushed by cuCtxCreate and popped here.
    unsafe {
        driver
            .cuCtxCreate(&mut context, ptr::null_mut(), 0, 0)
            .unwrap();
        driver.cuStreamCreate(&mut stream, 0).unwrap();
        driver.cuCtxPopCurrent(&mut popped).unwrap();
    }
    (context, stream)
}

fn destroy_context_and_stream(context: CUcontext, stream: CUstream) {
    let driver = load_fake_driver();
    // SAFETY: handles made by `new_context_and_stream`, used by nothing any more.
    unsafe {
        driver.cuStreamDestroy(stream).unwrap();
        driver.cuCtxDestroy(context).unwrap();
    }
}

isolated_test! {
    /// A context destroyed with `cuCtxDestroy` (no sticky error, no reclaim) and a new one created
    /// at its handle: a low-latency completion in the new one resolves and its context stays
    /// healthy (its flag is written to memory registered in it, not in the dead context).
    fn a_new_context_at_a_destroyed_ones_handle_gets_its_own_flag_page(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let _primary = fake_primary_context();
        fake().reuse_context_handles(true);
        let (first, stream) = new_context_and_stream();
        // SAFETY: the stream lives until destroyed below, after its completion resolved.
        let mut done =
            CompletionMode::LowLatency.completion(unsafe { RawStream::from_raw(stream) })
                .unwrap();
        wait_for(&mut done, "the completion in the first context").unwrap();
        let registered = fake().live_objects("host_registrations");
        destroy_context_and_stream(first, stream);
        assert!(fake().live_objects("host_registrations") < registered, "the fake forgot the page");
        let (second, stream) = new_context_and_stream();
        assert_eq!(second, first, "the fake gave the new context the old handle");
        // SAFETY: as above.
        let mut done =
            CompletionMode::LowLatency.completion(unsafe { RawStream::from_raw(stream) })
                .unwrap();
        let driver = load_fake_driver();
        // SAFETY: a live stream.
        let synced = unsafe { driver.cuStreamSynchronize(stream) };
        assert!(
            synced.is_ok(),
            "the flag write faulted the new context: {:?}",
            synced.err().and_then(|e| e.code()).unwrap_or(CUresult::CUDA_SUCCESS)
        );
        wait_for(&mut done, "the completion in the second context").unwrap();
        destroy_context_and_stream(second, stream);
    }
}
