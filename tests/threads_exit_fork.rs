//! The crate's own threads against the rest of the process, on the fake driver:
//!
//! - **Other threads' graph captures.** While one thread captures a stream in
//!   `CU_STREAM_CAPTURE_MODE_GLOBAL`, a "potentially unsafe" driver call (`cuMemFree`,
//!   `cuEventQuery`, ...) from any thread whose own interaction mode is the default fails and
//!   invalidates that capture (the fake models the rule: `tests/fake-cuda/src/capture_mode.rs`).
//!   The reaper and the low-latency poller run users' code (owners' `Drop`, wakers), so they put
//!   themselves in relaxed mode.
//! - **`fork`.** A child forked after the parent used the crate has neither the parent's reaper
//!   nor a usable CUDA: every launch there fails with a clear error, and drops its owners.
//! - **Exit.** Once the process exits, the reaper starts no more drops: the drop in progress
//!   finishes (before the driver is torn down), the rest stay unreleased.
//!
//! Each test has a process of its own: a capture in global mode affects every thread of the
//! process, and fork and exit are the process's.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUdeviceptr, CUgraph, CUgraphExec, CUresult, CUstreamCaptureMode};
use cuda_host_launch::{CompletionMode, Error, Stream, drain, flush, host_launch};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{PATIENCE, fake, fake_primary_context};

const RELAXED: u32 = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED.0;

/// Device memory whose `Drop` frees it with `cuMemFree` and reports the result code (as an
/// owner holding a device buffer of another library does).
struct DeviceBuffer {
    ptr: CUdeviceptr,
    free: unsafe extern "C" fn(CUdeviceptr) -> CUresult,
    freed: mpsc::Sender<CUresult>,
}

impl DeviceBuffer {
    fn new(freed: &mpsc::Sender<CUresult>) -> DeviceBuffer {
        let driver = cuda_dl_sys::driver().unwrap();
        let mut ptr = 0;
        // SAFETY: a valid out-pointer; a context is current.
        unsafe { driver.cuMemAlloc(&mut ptr, 256) }.unwrap();
        DeviceBuffer {
            ptr,
            free: driver.raw().cuMemFree().unwrap(),
            freed: freed.clone(),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: memory from cuMemAlloc, freed once.
        let code = unsafe { (self.free)(self.ptr) };
        let _ = self.freed.send(code);
    }
}

/// Begins a capture of a new stream in `mode` on a thread of its own, which then waits for `go`
/// before it ends the capture and instantiates the graph; returns the end's and the
/// instantiation's result codes.
fn capture_on_another_thread(
    mode: CUstreamCaptureMode,
    began: mpsc::Sender<()>,
    go: mpsc::Receiver<()>,
) -> std::thread::JoinHandle<(CUresult, CUresult)> {
    let context = fake_primary_context();
    std::thread::spawn(move || {
        context.set_current().unwrap();
        let stream = Stream::new(&context).unwrap();
        let driver = cuda_dl_sys::driver().unwrap();
        let raw = driver.raw();
        // SAFETY: a live stream of ours.
        let code = unsafe { raw.cuStreamBeginCapture().unwrap()(stream.raw(), mode) };
        assert_eq!(code, CUresult::CUDA_SUCCESS);
        began.send(()).unwrap();
        go.recv_timeout(PATIENCE).unwrap();
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: the stream captures; a valid out-pointer.
        let ended = unsafe { raw.cuStreamEndCapture().unwrap()(stream.raw(), &mut graph) };
        let mut exec: CUgraphExec = std::ptr::null_mut();
        let instantiated = if ended == CUresult::CUDA_SUCCESS {
            // SAFETY: a graph the capture made; a valid out-pointer. Both are destroyed below.
            unsafe {
                let code = raw.cuGraphInstantiateWithFlags().unwrap()(&mut exec, graph, 0);
                if code == CUresult::CUDA_SUCCESS {
                    raw.cuGraphExecDestroy().unwrap()(exec);
                }
                raw.cuGraphDestroy().unwrap()(graph);
                code
            }
        } else {
            ended
        };
        (ended, instantiated)
    })
}

isolated_test! {
    /// An owner whose `Drop` frees device memory, released by the reaper while another thread
    /// captures in global mode: the free succeeds and the capture ends and instantiates.
    fn reaper_frees_device_memory_without_breaking_another_threads_global_capture() {
        let context = fake_primary_context();
        context.set_current().unwrap();
        let stream = Stream::new(&context).unwrap();
        let (freed_tx, freed) = mpsc::channel();
        // Allocated before the capture begins (cuMemAlloc is potentially unsafe too).
        let buffer = DeviceBuffer::new(&freed_tx);
        let (began_tx, began) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let capture = capture_on_another_thread(
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            began_tx,
            go_rx,
        );
        began.recv_timeout(PATIENCE).unwrap();
        // No driver call of this thread may be potentially unsafe while the capture runs: wait for
        // the owner's drop by its report, not by synchronizing.
        host_launch(&stream, move || {
            let _keep = &buffer;
        })
        .unwrap();
        let code = freed.recv_timeout(PATIENCE).unwrap();
        go.send(()).unwrap();
        let (ended, instantiated) = capture.join().unwrap();
        assert_eq!(code, CUresult::CUDA_SUCCESS, "cuMemFree in the owner's Drop");
        assert_eq!(ended, CUresult::CUDA_SUCCESS, "cuStreamEndCapture");
        assert_eq!(instantiated, CUresult::CUDA_SUCCESS, "cuGraphInstantiateWithFlags");
    }

    /// The reaper runs owners' `Drop` in relaxed capture-interaction mode.
    fn reaper_runs_owners_drop_in_relaxed_capture_mode() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (mode_tx, mode) = mpsc::channel();
        let owner = OnDrop(Some(Box::new(move || {
            let _ = mode_tx.send(fake().capture_interaction_mode());
        })));
        host_launch(&stream, move || {
            let _keep = &owner;
        })
        .unwrap();
        assert_eq!(mode.recv_timeout(PATIENCE).unwrap(), RELAXED);
    }

    /// The low-latency poller wakes futures (users' wakers) in relaxed capture-interaction mode.
    fn low_latency_poller_wakes_in_relaxed_capture_mode() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let future = CompletionMode::LowLatency.completion(&stream).unwrap();
        let waker = Arc::new(ModeRecorder::default());
        let mut future = pin!(future);
        let task_waker = Waker::from(Arc::clone(&waker));
        assert!(future.as_mut().poll(&mut Context::from_waker(&task_waker)).is_pending());
        hold.release();
        let deadline = Instant::now() + PATIENCE;
        while !waker.woken.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the future was never woken");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(waker.mode.load(Ordering::SeqCst), RELAXED);
    }

    /// On a driver older than 10.1 (no `cuThreadExchangeStreamCaptureMode`) the reaper still
    /// releases owners.
    fn reaper_works_on_a_driver_without_capture_interaction_modes(FAKE_CUDA_VERSION = "10000") {
        reaper_releases_an_owner();
    }

    /// If `cuThreadExchangeStreamCaptureMode` fails, the reaper still releases owners.
    fn reaper_works_when_entering_relaxed_mode_fails(
        FAKE_CUDA_FAIL = "cuThreadExchangeStreamCaptureMode=999"
    ) {
        reaper_releases_an_owner();
    }

    /// A child forked after the parent launched: its launches fail with `ForkedChild` and drop
    /// their owners at once, on the calling thread; `flush` fails the same way; `drain` releases
    /// nothing (the queue holds copies of the parent's records).
    fn a_forked_child_refuses_launches_and_drops_their_owners() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        reaper_releases_an_owner();
        // SAFETY: the child only runs `in_forked_child`, then `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = match in_forked_child(&stream) {
                Ok(()) => 0,
                Err(message) => {
                    eprintln!("forked child: {message}");
                    1
                }
            };
            // SAFETY: ends the child without running the parent's exit handlers or unwinding.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: our own child; a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the forked child died: status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "the forked child failed (its stderr says why)");
        // The parent is untouched.
        reaper_releases_an_owner();
    }

    /// Children forked while other threads of the parent launch and release without pause: a
    /// child's first launch, from a thread that never launched (no record segment, no hand-over
    /// slot of its own), is refused with `ForkedChild` and never blocks on a lock that a thread of
    /// the parent held at the fork (the record pool's, the hand-over's registry): that thread
    /// does not exist in the child, and the lock would never be let go. Each child gets
    /// `PATIENCE`; one that hangs fails the test.
    fn a_forked_childs_first_launch_takes_no_lock_the_parent_may_have_held() {
        let context = fake_primary_context();
        let stream = Arc::new(Stream::new(&context).unwrap());
        // The first launch, before any fork: a child forked before it is not the crate's
        // forked child (nothing of the crate ran), and its launch is no refusal.
        reaper_releases_an_owner();
        let stop = Arc::new(AtomicBool::new(false));
        // Launching threads: every 31st record takes the record pool's lock for a new segment,
        // and short-lived threads register hand-over slots under the registry's lock.
        let busy: Vec<_> = (0..2)
            .map(|i| {
                let (stream, stop) = (Arc::clone(&stream), Arc::clone(&stop));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if i == 0 {
                            for _ in 0..64 {
                                let _ = cuda_host_launch::release_after(&*stream, ());
                            }
                        } else {
                            let stream = Arc::clone(&stream);
                            std::thread::spawn(move || {
                                let _ = cuda_host_launch::release_after(&*stream, ());
                            })
                            .join()
                            .unwrap();
                        }
                    }
                })
            })
            .collect();
        // Forks from a thread that never launches in the parent.
        let forker = {
            let stream = Arc::clone(&stream);
            std::thread::spawn(move || -> Result<usize, String> {
                let deadline = Instant::now() + Duration::from_secs(3);
                let mut forks = 0;
                while Instant::now() < deadline {
                    // SAFETY: the child only calls `release_after` and `_exit`s; it prints
                    // nothing (a parent's thread may have held stderr's lock).
                    let pid = unsafe { libc::fork() };
                    if pid < 0 {
                        return Err("fork failed".into());
                    }
                    if pid == 0 {
                        let code = match cuda_host_launch::release_after(&*stream, ()) {
                            Err(e) if is_fork_error(e.error()) => 0,
                            _ => 1,
                        };
                        // SAFETY: ends the child without the parent's exit handlers.
                        unsafe { libc::_exit(code) };
                    }
                    forks += 1;
                    let waited = Instant::now();
                    let mut status = 0;
                    loop {
                        // SAFETY: our own child; a valid out-pointer.
                        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                        if done == pid {
                            break;
                        }
                        if waited.elapsed() > PATIENCE {
                            // SAFETY: our own child, hung.
                            unsafe { libc::kill(pid, libc::SIGKILL) };
                            // SAFETY: as above.
                            unsafe { libc::waitpid(pid, &mut status, 0) };
                            return Err(format!(
                                "fork {forks}: the child's first launch hung (a lock held at the \
                                 fork)"
                            ));
                        }
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
                        return Err(format!(
                            "fork {forks}: the child's launch was not refused as a forked \
                             child's (status {status:#x})"
                        ));
                    }
                }
                Ok(forks)
            })
        };
        let forked = forker.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        for thread in busy {
            thread.join().unwrap();
        }
        let forks = forked.unwrap();
        assert!(forks > 0, "no fork was made");
        flush(PATIENCE).unwrap();
    }

    /// A child forked while a record of the parent's waits in the cleanup queue (the reaper is
    /// inside an earlier owner's `Drop`): the child's `drain` releases nothing of it. (Mutation
    /// testing: with `is_forked_child` answering no, the child's drain dropped the parent's
    /// owner, and every test passed: the other fork case forks with the queue empty.)
    fn a_forked_childs_drain_leaves_the_parents_queued_records_alone() {
        static INSIDE: AtomicBool = AtomicBool::new(false);
        static LET_GO: AtomicBool = AtomicBool::new(false);
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let slow = OnDrop(Some(Box::new(|| {
            INSIDE.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + PATIENCE;
            while !LET_GO.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
        })));
        host_launch(&stream, move || {
            let _keep = &slow;
        })
        .unwrap();
        // After the crate's (registered by the first launch): it runs first at exit.
        // SAFETY: an `extern "C" fn()` that only stores an atomic.
        assert_eq!(unsafe { libc::atexit(mark_exit_began) }, 0);
        let deadline = Instant::now() + PATIENCE;
        while !INSIDE.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the reaper never began the slow drop");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Queued behind the slow drop, in the queue itself (the reaper holds only its batch).
        host_launch(&stream, || {}).unwrap();
        stream.synchronize().unwrap();
        // SAFETY: the child only calls `drain`, then `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = match drain() {
                0 => 0,
                n => {
                    eprintln!("forked child: drain released {n} records of the parent's");
                    1
                }
            };
            // SAFETY: ends the child without running the parent's exit handlers or unwinding.
            unsafe { libc::_exit(code) };
        }
        LET_GO.store(true, Ordering::SeqCst);
        let mut status = 0;
        // SAFETY: our own child; a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the forked child died: status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "the forked child failed (its stderr says why)");
        flush(PATIENCE).unwrap();
    }

    /// The process exits while the reaper is inside an owner's `Drop` that calls the driver, with
    /// another owner queued and a launch pending: the drop in progress finishes before the
    /// driver's teardown, and nothing is released after it. The fake counts driver calls made
    /// after its teardown; an exit handler of this test, registered before the driver was
    /// initialised (so it runs after the teardown), checks that there were none.
    fn exit_lets_the_drop_in_progress_finish_before_the_driver_goes_and_starts_no_other() {
        // SAFETY: an `extern "C" fn()` that only reads atomics, calls the fake's control functions
        // and `_exit`s.
        assert_eq!(unsafe { libc::atexit(check_after_teardown) }, 0);
        let context = fake_primary_context();
        context.set_current().unwrap();
        let stream = Stream::new(&context).unwrap();
        let (freed_tx, freed) = mpsc::channel();
        // A slow owner: the reaper is inside its Drop when the process exits.
        let slow = SlowDeviceBuffer {
            _buffer: DeviceBuffer::new(&freed_tx),
        };
        host_launch(&stream, move || {
            let _keep = &slow;
        })
        .unwrap();
        // After the crate's (registered by the first launch): it runs first at exit.
        // SAFETY: an `extern "C" fn()` that only stores an atomic.
        assert_eq!(unsafe { libc::atexit(mark_exit_began) }, 0);
        let deadline = Instant::now() + PATIENCE;
        while !SLOW_DROP.started.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the slow owner was never dropped");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Queued behind it: its host function has run, its owner waits for the reaper.
        let queued = CountedDeviceBuffer {
            _buffer: DeviceBuffer::new(&freed_tx),
        };
        let ran = Arc::new(AtomicBool::new(false));
        let ran_in_host = Arc::clone(&ran);
        host_launch(&stream, move || {
            let _keep = &queued;
            ran_in_host.store(true, Ordering::SeqCst);
        })
        .unwrap();
        while !ran.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the second host function never ran");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Pending: its host function never runs (the stream is held, for good: the guard is
        // given up, the hold kept).
        let _hold = fake()
            .hold_stream(stream.raw())
            .expect("the fake could not hold the stream")
            .into_token();
        let pending = CountedDeviceBuffer {
            _buffer: DeviceBuffer::new(&freed_tx),
        };
        host_launch(&stream, move || {
            let _keep = &pending;
        })
        .unwrap();
        drop(freed);
        // The test returns; the harness exits the process with all of this under way.
    }

    /// At exit a release stops before its next record: a drain holds two owners in one batch and
    /// is inside the first one's `Drop` when the process exits; that drop finishes, the second
    /// owner is not dropped. The first `Drop` returns only after the crate's exit handler (which
    /// waits its whole second for it) closed the gate: an exit handler of this test, registered
    /// before the crate's (by the first launch), so run after it, lets it return. Manual cleanup:
    /// no reaper. (Mutation testing: with the gate's "closed" answering no, the batch went on and
    /// dropped the second owner during the exit.)
    fn exit_stops_a_drain_before_its_next_record(CUDA_HOST_LAUNCH_CLEANUP = "manual") {
        // SAFETY: `extern "C" fn()`s that read and store atomics (and `_exit` on failure);
        // handlers run in reverse order: the check after the driver's teardown, the release of
        // the first owner's `Drop` after the crate's handler and before the teardown.
        assert_eq!(unsafe { libc::atexit(check_the_drain_stopped) }, 0);
        let context = fake_primary_context();
        assert_eq!(unsafe { libc::atexit(let_the_first_drop_return) }, 0);
        let stream = Stream::new(&context).unwrap();
        let first = OnDrop(Some(Box::new(|| {
            DRAIN_AT_EXIT.first_started.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + PATIENCE;
            while !DRAIN_AT_EXIT.first_may_return.load(Ordering::SeqCst) && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        })));
        let second = OnDrop(Some(Box::new(|| {
            DRAIN_AT_EXIT.second_dropped.store(true, Ordering::SeqCst);
        })));
        // Held while both are launched: a launch in manual mode drains what is queued, so the
        // first must not have run before the second is launched.
        let hold = fake()
            .hold_stream(stream.raw())
            .expect("the fake could not hold the stream");
        host_launch(&stream, move || {
            let _keep = &first;
        })
        .unwrap();
        host_launch(&stream, move || {
            let _keep = &second;
        })
        .unwrap();
        hold.release();
        // Both host functions ran: both records wait in the queue for a drain, one batch.
        stream.synchronize().unwrap();
        std::thread::spawn(|| {
            drain();
            DRAIN_AT_EXIT.drain_returned.store(true, Ordering::SeqCst);
        });
        let deadline = Instant::now() + PATIENCE;
        while !DRAIN_AT_EXIT.first_started.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the drain never began the first owner's drop");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::mem::forget(stream);
        // The test returns; the harness exits the process with the drain inside the first drop.
    }
}

/// What `exit_stops_a_drain_before_its_next_record` saw.
struct DrainAtExit {
    first_started: AtomicBool,
    first_may_return: AtomicBool,
    second_dropped: AtomicBool,
    drain_returned: AtomicBool,
}

static DRAIN_AT_EXIT: DrainAtExit = DrainAtExit {
    first_started: AtomicBool::new(false),
    first_may_return: AtomicBool::new(false),
    second_dropped: AtomicBool::new(false),
    drain_returned: AtomicBool::new(false),
};

/// The exit handler that runs after the crate's: lets the first owner's `Drop` return, then
/// waits for the drain to end its batch.
extern "C" fn let_the_first_drop_return() {
    if std::env::var_os(cuda_workspace::testing::ISOLATED_TEST_ENV).is_none() {
        return;
    }
    DRAIN_AT_EXIT.first_may_return.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + PATIENCE;
    while !DRAIN_AT_EXIT.drain_returned.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The verdict, after the driver's teardown: the drain returned, without the second owner.
extern "C" fn check_the_drain_stopped() {
    if std::env::var_os(cuda_workspace::testing::ISOLATED_TEST_ENV).is_none() {
        return;
    }
    let failure = if !DRAIN_AT_EXIT.drain_returned.load(Ordering::SeqCst) {
        Some("the drain did not return")
    } else if DRAIN_AT_EXIT.second_dropped.load(Ordering::SeqCst) {
        Some("the second owner was dropped after the process began to exit")
    } else {
        None
    };
    if let Some(failure) = failure {
        eprintln!("exit test: {failure}");
        // SAFETY: ends the process at once with a failure status (the parent test reports it).
        unsafe { libc::_exit(3) };
    }
}

/// A value that runs a closure when dropped.
struct OnDrop(Option<Box<dyn FnOnce() + Send>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// A waker that records the capture-interaction mode of the thread that wakes it.
#[derive(Default)]
struct ModeRecorder {
    woken: AtomicBool,
    mode: AtomicU32,
}

impl Wake for ModeRecorder {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.mode
            .store(fake().capture_interaction_mode(), Ordering::SeqCst);
        self.woken.store(true, Ordering::SeqCst);
    }
}

/// Launches a host function with an owner on a new stream and waits until the owner is dropped.
fn reaper_releases_an_owner() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let (dropped_tx, dropped) = mpsc::channel();
    let owner = OnDrop(Some(Box::new(move || {
        let _ = dropped_tx.send(());
    })));
    host_launch(&stream, move || {
        let _keep = &owner;
    })
    .unwrap();
    dropped.recv_timeout(PATIENCE).unwrap();
}

/// What the forked child checks; an `Err` says what went wrong.
fn in_forked_child(stream: &Stream) -> Result<(), String> {
    let dropped = Arc::new(Mutex::new(None));
    let owner = {
        let dropped = Arc::clone(&dropped);
        OnDrop(Some(Box::new(move || {
            *dropped.lock().unwrap() = Some(std::thread::current().id());
        })))
    };
    match host_launch(stream, move || {
        let _keep = &owner;
    }) {
        Err(e) if is_fork_error(e.error()) => {
            // Handed back, alive until dropped here.
            if dropped.lock().unwrap().is_some() || !e.is_handed_back() {
                return Err("the refused launch's owner was not handed back".into());
            }
        }
        other => return Err(format!("host_launch returned {other:?}, not a fork error")),
    }
    if *dropped.lock().unwrap() != Some(std::thread::current().id()) {
        return Err("the refused launch's owner was not dropped on the calling thread".into());
    }
    match flush(Duration::from_millis(100)) {
        Err(e) if is_fork_error(&e) => {}
        other => return Err(format!("flush returned {other:?}, not a fork error")),
    }
    match drain() {
        0 => Ok(()),
        n => Err(format!("drain released {n} records of the parent's")),
    }
}

/// Whether `e` says that this process is a forked child.
fn is_fork_error(e: &Error) -> bool {
    e.to_string().contains("forked")
}

/// The slow owner's progress.
struct SlowDrop {
    started: AtomicBool,
    finished: AtomicBool,
}

static SLOW_DROP: SlowDrop = SlowDrop {
    started: AtomicBool::new(false),
    finished: AtomicBool::new(false),
};

/// Owners other than the slow one dropped so far.
static OTHER_DROPS: AtomicU64 = AtomicU64::new(0);

/// How long the slow owner's `Drop` takes before it calls the driver.
const SLOW: Duration = Duration::from_millis(200);

/// Set by an exit handler registered after the crate's (so run before it): the process began to
/// exit.
static EXIT_BEGAN: AtomicBool = AtomicBool::new(false);

extern "C" fn mark_exit_began() {
    EXIT_BEGAN.store(true, Ordering::SeqCst);
}

/// A device buffer whose `Drop` takes [`SLOW`] before it frees the memory.
struct SlowDeviceBuffer {
    _buffer: DeviceBuffer,
}

impl Drop for SlowDeviceBuffer {
    fn drop(&mut self) {
        SLOW_DROP.started.store(true, Ordering::SeqCst);
        // Until the process began to exit (a loaded machine may take longer than SLOW to get the
        // test's thread there), then SLOW more: the crate's exit handler, which runs right after
        // the one that marks it, closes the gate meanwhile.
        let deadline = Instant::now() + PATIENCE;
        while !EXIT_BEGAN.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(SLOW);
        // The inner buffer's Drop (cuMemFree) runs after this body, then:
        let _finish = OnDrop(Some(Box::new(|| {
            SLOW_DROP.finished.store(true, Ordering::SeqCst)
        })));
    }
}

/// A device buffer whose drop is counted in [`OTHER_DROPS`].
struct CountedDeviceBuffer {
    _buffer: DeviceBuffer,
}

impl Drop for CountedDeviceBuffer {
    fn drop(&mut self) {
        OTHER_DROPS.fetch_add(1, Ordering::SeqCst);
    }
}

/// The exit test's last exit handler (registered first): after the driver's teardown, waits for
/// the slow owner's drop to finish (it would, on a machine where the teardown takes longer than
/// the drop), then fails the process if any driver call came after the teardown or if an owner
/// other than the slow one was dropped.
extern "C" fn check_after_teardown() {
    if std::env::var_os(cuda_workspace::testing::ISOLATED_TEST_ENV).is_none() {
        return;
    }
    let deadline = Instant::now() + SLOW * 10;
    while SLOW_DROP.started.load(Ordering::SeqCst)
        && !SLOW_DROP.finished.load(Ordering::SeqCst)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Let anything the reaper would still start run into the torn-down driver, if it does.
    std::thread::sleep(SLOW / 4);
    let fake = fake();
    let failure = if !fake.torn_down() {
        Some("the fake driver's teardown did not run before this handler".to_string())
    } else if !SLOW_DROP.finished.load(Ordering::SeqCst) {
        Some("the slow owner's drop never finished".to_string())
    } else if fake.calls_after_teardown() != 0 {
        Some(format!(
            "{} driver calls came after the driver's teardown at exit",
            fake.calls_after_teardown()
        ))
    } else if OTHER_DROPS.load(Ordering::SeqCst) != 0 {
        Some(format!(
            "{} owners were released after the process began to exit",
            OTHER_DROPS.load(Ordering::SeqCst)
        ))
    } else {
        None
    };
    if let Some(failure) = failure {
        eprintln!("exit test: {failure}");
        // SAFETY: ends the process at once with a failure status (the parent test reports it).
        unsafe { libc::_exit(3) };
    }
}
