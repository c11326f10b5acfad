//! Races between a launch and what other threads may do meanwhile, made deterministic with the fake
//! driver's hooks (a function run at the start of a chosen driver call of the launch):
//! - a reclaim (a context reset or destroy elsewhere) while the launch call runs: whether the driver
//!   then refuses or accepts the launch, the owners are dropped exactly once, after the host
//!   function ran if it ran;
//! - another thread beginning a capture on the stream between the launch's capture query and its
//!   launch (the host function becomes a node of that graph), or just after the launch: the
//!   launch is kept for ever (a graph made from the capture may call it at any time), its host
//!   function runs at most once, and its owners are never dropped;
//! - the host function running before its launcher is done with the record.
//!
//! Each case runs in its own process: a hook is process-wide. Records of both kinds are covered: a
//! closure that fits a pool slot, and one whose captures do not (boxed).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use cuda_host_launch::{
    Graph, PrimaryContext, Stream, flush, host_launch, kept_launches, pending_launches,
    reclaim_pending,
};
use cuda_sys::types::{CUresult, CUstream, CUstreamCaptureMode};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{Drops, fake, fake_driver_path, fake_primary_context};

const PATIENCE: Duration = Duration::from_secs(5);

/// What a launch's host function saw and did.
#[derive(Default)]
struct Seen {
    ran: AtomicUsize,
    /// Set if the host function ran after its owner had been dropped.
    ran_after_drop: AtomicBool,
}

/// Launches a closure that owns `drops.owner()` on `stream`: small (a pooled record) or, with
/// `boxed`, with 256 bytes of captures (a boxed record). The closure counts its runs and checks that
/// its owner is still alive.
fn launch(
    stream: &Stream,
    drops: &Arc<Drops>,
    seen: &Arc<Seen>,
    boxed: bool,
) -> Result<(), cuda_host_launch::Error> {
    let owner = drops.owner();
    let (seen, drops) = (Arc::clone(seen), Arc::clone(drops));
    let ballast = [7u8; 256];
    host_launch(stream, move || {
        let _keep = &owner;
        if boxed {
            assert_eq!(std::hint::black_box(ballast)[255], 7);
        }
        if drops.dropped() > 0 {
            seen.ran_after_drop.store(true, Ordering::SeqCst);
        }
        seen.ran.fetch_add(1, Ordering::SeqCst);
    })
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

/// Begins a relaxed-mode capture of `stream` (as another thread's safe API would).
fn begin_capture(stream: SendStream) {
    let driver = cuda_sys::driver().unwrap();
    // SAFETY: a live stream of the fake driver.
    unsafe {
        driver.cuStreamBeginCapture(
            stream.raw(),
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        )
    }
    .unwrap();
}

/// Ends `stream`'s capture and takes the graph.
fn end_capture(stream: &Stream) -> Graph {
    let driver = cuda_sys::driver().unwrap();
    let mut graph = std::ptr::null_mut();
    // SAFETY: a capturing stream; `graph` is a valid out-pointer.
    unsafe { driver.cuStreamEndCapture(stream.raw(), &mut graph) }.unwrap();
    // SAFETY: a graph the capture just made, owned by nobody else.
    unsafe { Graph::from_raw(graph) }
}

/// The context's handle, for a hook's closure.
fn context_handle(context: &PrimaryContext) -> usize {
    context.raw().addr()
}

/// Reclaims the pending launches of a context (as a reset on another thread would).
fn reclaim(context: usize) -> usize {
    // SAFETY: the test breaks no promise the reclaim relies on beyond the launch in flight, which
    // is what it is about: nothing else is pending in the context.
    unsafe { reclaim_pending(std::ptr::with_exposed_provenance_mut(context)) }
}

/// A reclaim runs inside the launch call, which the driver then refuses: the launcher alone
/// releases the record.
fn reclaim_during_a_refused_launch(boxed: bool) {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
    let handle = context_handle(&context);
    let reclaimed = Arc::new(AtomicUsize::new(usize::MAX));
    let out = Arc::clone(&reclaimed);
    fake().set_hook("cuLaunchHostFunc", 1, move || {
        out.store(reclaim(handle), Ordering::SeqCst);
    });
    fake().set_fault(
        "cuLaunchHostFunc",
        1,
        CUresult::CUDA_ERROR_INVALID_CONTEXT.0,
    );
    let result = launch(&stream, &drops, &seen, boxed);
    assert!(result.is_err(), "the fault refuses the launch");
    assert_eq!(
        reclaimed.load(Ordering::SeqCst),
        0,
        "the reclaim took a launch in flight"
    );
    flush(PATIENCE).unwrap();
    assert_eq!(drops.dropped(), 1, "the owner dropped once");
    assert_eq!(drops.live(), 0);
    assert_eq!(seen.ran.load(Ordering::SeqCst), 0);
    assert_eq!(pending_launches(None), 0);
}

/// A reclaim runs inside the launch call, which the driver then accepts: the host function runs,
/// with its owner alive, and the owner is dropped once, after it.
fn reclaim_during_an_accepted_launch(boxed: bool) {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
    let handle = context_handle(&context);
    fake().set_hook("cuLaunchHostFunc", 1, move || {
        reclaim(handle);
    });
    launch(&stream, &drops, &seen, boxed).unwrap();
    stream.synchronize().unwrap();
    flush(PATIENCE).unwrap();
    assert_eq!(
        seen.ran.load(Ordering::SeqCst),
        1,
        "the host function ran once"
    );
    assert!(
        !seen.ran_after_drop.load(Ordering::SeqCst),
        "the host function ran after its owner was dropped"
    );
    assert_eq!(drops.dropped(), 1, "the owner dropped once");
    assert_eq!(drops.live(), 0);
    assert_eq!(pending_launches(None), 0);
}

/// Another thread begins a capture on the stream between the launch's capture query and its
/// launch, so the host function becomes a node of that graph. The graph is replayed three times:
/// the host function runs once, and the launch is kept for ever, its owner never dropped (even
/// once the graph is gone: another graph instantiated from it earlier could still call it).
fn capture_begun_before_the_launch(boxed: bool) {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
    let raw = SendStream::of(&stream);
    fake().set_hook("cuLaunchHostFunc", 1, move || begin_capture(raw));
    launch(&stream, &drops, &seen, boxed).unwrap();
    assert_eq!(kept_launches(), 1);
    let graph = end_capture(&stream);
    let exec = graph.instantiate().unwrap();
    for _ in 0..3 {
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
    }
    flush(PATIENCE).unwrap();
    assert_eq!(
        seen.ran.load(Ordering::SeqCst),
        1,
        "a run-once payload ran once"
    );
    assert!(!seen.ran_after_drop.load(Ordering::SeqCst));
    drop((exec, graph));
    flush(PATIENCE).unwrap();
    assert_eq!(drops.dropped(), 0, "the owner of a kept launch was dropped");
    assert_eq!(kept_launches(), 1);
    assert_eq!(pending_launches(None), 0);
}

isolated_test! {
    /// A reclaim during a launch the driver refuses: a pooled record.
    fn a_reclaim_during_a_refused_launch_leaves_it_to_the_launcher(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        reclaim_during_a_refused_launch(false);
    }

    /// A reclaim during a launch the driver refuses: a boxed record.
    fn a_reclaim_during_a_refused_launch_leaves_a_boxed_record_to_the_launcher(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        reclaim_during_a_refused_launch(true);
    }

    /// A reclaim during a launch the driver accepts: a pooled record.
    fn a_reclaim_during_an_accepted_launch_leaves_it_to_the_driver(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        reclaim_during_an_accepted_launch(false);
    }

    /// A reclaim during a launch the driver accepts: a boxed record.
    fn a_reclaim_during_an_accepted_launch_leaves_a_boxed_record_to_the_driver(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        reclaim_during_an_accepted_launch(true);
    }

    /// A capture begun between the capture query and the launch: a pooled record.
    fn a_capture_begun_inside_the_launch_keeps_it_and_runs_it_once(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_begun_before_the_launch(false);
    }

    /// A capture begun between the capture query and the launch: a boxed record.
    fn a_capture_begun_inside_the_launch_keeps_a_boxed_record_and_runs_it_once(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_begun_before_the_launch(true);
    }

    /// A capture that took the launch and was never replayed: the launch is kept for ever, and a
    /// reset of its context does not release it (a graph made from the capture may still call it,
    /// in any context).
    fn a_captured_launch_is_kept_through_a_reset_of_its_context(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
        let raw = SendStream::of(&stream);
        fake().set_hook("cuLaunchHostFunc", 1, move || begin_capture(raw));
        launch(&stream, &drops, &seen, false).unwrap();
        drop(end_capture(&stream));
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 0);
        assert_eq!((kept_launches(), context.pending_launches()), (1, 0));
        drop(stream);
        // SAFETY: the context's only stream is dropped and nothing made in it is used afterwards.
        let reclaimed = unsafe { context.reset() }.unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(reclaimed, 0);
        assert_eq!(drops.dropped(), 0);
        assert_eq!(seen.ran.load(Ordering::SeqCst), 0);
        assert_eq!(kept_launches(), 1);
    }

    /// A capture begun just after the launch (before the launcher asks again), while the stream
    /// is still busy: the launch went ahead of the capture, but the launcher cannot tell, so it is
    /// kept; the host function still runs from the stream, once.
    fn a_capture_begun_after_the_launch_keeps_the_launch_and_it_still_runs_once(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
        let hold = fake().hold_stream(stream.raw());
        let raw = SendStream::of(&stream);
        // The first capture query is the launch's check, the second its look after the launch.
        fake().set_hook("cuStreamGetCaptureInfo", 2, move || begin_capture(raw));
        launch(&stream, &drops, &seen, true).unwrap();
        assert_eq!(kept_launches(), 1);
        let graph = end_capture(&stream);
        drop(graph);
        fake().release_hold(hold);
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(seen.ran.load(Ordering::SeqCst), 1);
        assert!(!seen.ran_after_drop.load(Ordering::SeqCst));
        assert_eq!(drops.dropped(), 0);
        assert_eq!(pending_launches(None), 0);
    }

    /// The host function runs to its end before its launcher has looked at the stream again: the
    /// launcher queues the record, once.
    fn a_host_function_that_ran_before_its_launcher_was_done_is_released_once(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
        let watch = Arc::clone(&seen);
        fake().set_hook("cuStreamGetCaptureInfo", 2, move || {
            while watch.ran.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
        });
        launch(&stream, &drops, &seen, false).unwrap();
        drops.wait_dropped(1);
        flush(PATIENCE).unwrap();
        assert_eq!(seen.ran.load(Ordering::SeqCst), 1);
        assert_eq!(drops.live(), 0);
        assert_eq!(pending_launches(None), 0);
    }

    /// The host function is still running when its launcher is done: the launcher leaves the
    /// record to it, and it queues the record when its run is over, once.
    fn a_host_function_still_running_when_its_launcher_is_done_releases_its_record(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let (started, finish) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let (hook_started, run_started, run_finish) =
            (Arc::clone(&started), Arc::clone(&started), Arc::clone(&finish));
        fake().set_hook("cuStreamGetCaptureInfo", 2, move || {
            hook_started.wait();
        });
        let owner = drops.owner();
        host_launch(&stream, move || {
            let _keep = &owner;
            run_started.wait();
            run_finish.wait();
        })
        .unwrap();
        // The launcher is done; the host function is still running.
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 0, "dropped while its host function runs");
        finish.wait();
        drops.wait_dropped(1);
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 1);
        assert_eq!(drops.live(), 0);
        assert_eq!(pending_launches(None), 0);
    }

    /// The host function runs to its end before its launcher looks at the stream again, and in
    /// between another thread begins a capture: the launch is kept, and not queued by anyone.
    fn a_host_function_that_ran_early_on_a_stream_that_began_capturing_is_kept(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
        let watch = Arc::clone(&seen);
        let raw = SendStream::of(&stream);
        fake().set_hook("cuStreamGetCaptureInfo", 2, move || {
            while watch.ran.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            begin_capture(raw);
        });
        launch(&stream, &drops, &seen, false).unwrap();
        drop(end_capture(&stream));
        flush(PATIENCE).unwrap();
        assert_eq!(seen.ran.load(Ordering::SeqCst), 1);
        assert_eq!(drops.dropped(), 0);
        assert_eq!((kept_launches(), pending_launches(None)), (1, 0));
    }
}
