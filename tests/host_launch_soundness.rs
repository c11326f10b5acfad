//! Races between a launch and what other threads may do meanwhile, made deterministic with the fake
//! driver's hooks (a function run at the start of a chosen driver call of the launch):
//! - a reclaim (a context reset or destroy elsewhere) while the launch call runs: whether the driver
//!   then refuses or accepts the launch, the owners are dropped exactly once, after the host
//!   function ran if it ran;
//! - another thread beginning a capture on the stream between the launch's capture query and its
//!   launch (the host function becomes a node of that graph), and even ending it before the launch
//!   returns: the host function runs on the first replay only, its owners are dropped once, after
//!   it, and later replays touch nothing of the released record;
//! - the host function running before its launcher is done with the record.
//!
//! Each case runs in its own process: a hook is process-wide. Records of both kinds are covered: a
//! closure that fits a pool slot, and one whose captures do not (boxed).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use cuda_dl_sys::types::{CUresult, CUstream, CUstreamCaptureMode};
use cuda_host_launch::{
    Graph, PrimaryContext, Stream, flush, host_launch, pending_launches, reclaim_pending,
};
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
    // A refusal's owner, handed back, is dropped here (what `?` does).
    .map_err(Into::into)
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
    let driver = cuda_dl_sys::driver().unwrap();
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
    let driver = cuda_dl_sys::driver().unwrap();
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
/// launch, so the host function becomes a node of that graph; with `end_inside`, it also ends the
/// capture before the launch returns (the launcher cannot see it at all). The graph is replayed
/// three times: the host function runs on the first replay only, its owner is dropped once, after
/// the run, and the later replays touch nothing of the released record.
fn capture_begun_inside_the_launch(boxed: bool, end_inside: bool) {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
    let raw = SendStream::of(&stream);
    fake().set_hook("cuLaunchHostFunc", 1, move || begin_capture(raw));
    let ended: Arc<std::sync::Mutex<Option<Graph>>> = Arc::default();
    if end_inside {
        let out = Arc::clone(&ended);
        fake().set_hook_after("cuLaunchHostFunc", 1, move || {
            *out.lock().unwrap() = Some(end_capture_raw(raw));
        });
    }
    launch(&stream, &drops, &seen, boxed).unwrap();
    let graph = ended
        .lock()
        .unwrap()
        .take()
        .unwrap_or_else(|| end_capture(&stream));
    let exec = graph.instantiate().unwrap();
    assert_eq!(
        context.pending_launches(),
        1,
        "the captured launch, not yet run"
    );
    for _ in 0..3 {
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
    }
    assert_eq!(
        seen.ran.load(Ordering::SeqCst),
        1,
        "a run-once payload ran once"
    );
    assert!(!seen.ran_after_drop.load(Ordering::SeqCst));
    assert_eq!(
        drops.dropped(),
        1,
        "the owner dropped once, after the first replay"
    );
    assert_eq!(drops.live(), 0);
    drop((exec, graph));
    flush(PATIENCE).unwrap();
    assert_eq!(drops.dropped(), 1);
    assert_eq!(pending_launches(None), 0);
}

/// Another thread ends the stream's capture and destroys its graph between a repeatable launch's
/// capture query and its launch call (as cudarc's safe `end_capture` and a dropped graph may): the
/// launch then goes onto the stream as a plain host function, and its record must still be alive
/// when the stream gets there, though the graph that was to own it is gone. (Before: the graph's
/// destruction released the record at once, and the host function ran a freed record.) The
/// owner is then kept for good (no one can tell when such a call ran): it must not be dropped.
fn capture_ended_inside_a_repeatable_launch(boxed: bool) {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
    let raw = SendStream::of(&stream);
    begin_capture(raw);
    let token: Arc<std::sync::Mutex<Option<u64>>> = Arc::default();
    let keep = Arc::clone(&token);
    fake().set_hook("cuLaunchHostFunc", 1, move || {
        let graph = end_capture_raw(raw);
        // The stream holds what follows until the test lets it go.
        *keep.lock().unwrap() = fake().hold_stream(raw.raw()).map(|hold| hold.into_token());
        drop(graph);
    });
    let owner = drops.owner();
    let (ran, drops_seen) = (Arc::clone(&seen), Arc::clone(&drops));
    let ballast = [7u8; 256];
    cuda_host_launch::LaunchOptions::default()
        .host_launch_repeatable(&stream, move || {
            let _keep = &owner;
            if boxed {
                assert_eq!(std::hint::black_box(ballast)[255], 7);
            }
            if drops_seen.dropped() > 0 {
                ran.ran_after_drop.store(true, Ordering::SeqCst);
            }
            ran.ran.fetch_add(1, Ordering::SeqCst);
        })
        .map_err(|e| e.to_string())
        .unwrap();
    flush(PATIENCE).unwrap();
    assert_eq!(
        drops.dropped(),
        0,
        "the owner, while its host function waits on the stream"
    );
    let token = token
        .lock()
        .unwrap()
        .take()
        .expect("the hook held the stream");
    fake().release_hold(token);
    stream.synchronize().unwrap();
    flush(PATIENCE).unwrap();
    assert_eq!(seen.ran.load(Ordering::SeqCst), 1);
    assert!(!seen.ran_after_drop.load(Ordering::SeqCst));
    assert_eq!(drops.dropped(), 0, "kept for good");
}

/// Another thread invalidates the stream's capture during a repeatable launch into it (a query
/// of an event recorded into the capture does that), so the driver refuses the launch: no node
/// uses the record, and the owners are handed back (taken out of the user object; the capture's
/// graph, still there, lets the object go). (Before: a look that did not see the capture active
/// took it for ended, and kept the record for good; later the owners were released soon instead
/// of handed back.)
fn capture_invalidated_inside_a_repeatable_launch() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let drops = Drops::new();
    let raw = SendStream::of(&stream);
    let driver = cuda_dl_sys::driver().unwrap();
    let event = cuda_host_launch::Event::new(&context).unwrap();
    let event_addr = event.raw().addr();
    begin_capture(raw);
    fake().set_hook("cuLaunchHostFunc", 1, move || {
        let driver = cuda_dl_sys::driver().unwrap();
        let event = std::ptr::with_exposed_provenance_mut(event_addr);
        // SAFETY: a live event and stream; the query of an event recorded into a live capture
        // invalidates the capture.
        unsafe {
            driver.cuEventRecord(event, raw.raw()).unwrap();
            let _ = driver.cuEventQuery(event);
        }
    });
    let owner = drops.owner();
    let refused = cuda_host_launch::LaunchOptions::default()
        .host_launch_repeatable(&stream, move || {
            let _keep = &owner;
        })
        .expect_err("the invalidated capture refuses the node");
    let handed_back = refused.into_inner().expect("handed back: no node uses it");
    flush(PATIENCE).unwrap();
    assert_eq!(drops.dropped(), 0, "the crate dropped what it handed back");
    drop(handed_back);
    assert_eq!(drops.dropped(), 1, "dropped with what was handed back");
    let mut graph = std::ptr::null_mut();
    // SAFETY: a capturing (invalidated) stream; a valid out-pointer.
    let _ = unsafe { driver.cuStreamEndCapture(stream.raw(), &mut graph) };
    drop(event);
    assert_eq!(drops.dropped(), 1);
}

/// Ends a capture from a hook (which cannot borrow the `Stream`).
fn end_capture_raw(stream: SendStream) -> Graph {
    let driver = cuda_dl_sys::driver().unwrap();
    let mut graph = std::ptr::null_mut();
    // SAFETY: a capturing stream; `graph` is a valid out-pointer.
    unsafe { driver.cuStreamEndCapture(stream.raw(), &mut graph) }.unwrap();
    // SAFETY: a graph the capture just made, owned by nobody else.
    unsafe { Graph::from_raw(graph) }
}

isolated_test! {
    /// See [`capture_invalidated_inside_a_repeatable_launch`].
    fn a_capture_invalidated_inside_a_repeatable_launch_hands_its_owners_back(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_invalidated_inside_a_repeatable_launch();
    }

    /// See [`capture_ended_inside_a_repeatable_launch`].
    fn a_capture_ended_inside_a_repeatable_launch_leaves_its_record_alive(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_ended_inside_a_repeatable_launch(false);
    }

    /// As above, a boxed record.
    fn a_capture_ended_inside_a_repeatable_launch_leaves_a_boxed_record_alive(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_ended_inside_a_repeatable_launch(true);
    }

    /// A reclaim during a launch the driver refuses: a pooled record.
    fn a_reclaim_during_a_refused_launch_leaves_it_to_the_launcher(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        reclaim_during_a_refused_launch(false);
    }

    /// A reclaim during a launch the driver refuses: a boxed record.
    fn a_reclaim_during_a_refused_launch_leaves_a_boxed_record_to_the_launcher(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        reclaim_during_a_refused_launch(true);
    }

    /// A reclaim during a launch the driver accepts: a pooled record.
    fn a_reclaim_during_an_accepted_launch_leaves_it_to_the_driver(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        reclaim_during_an_accepted_launch(false);
    }

    /// A reclaim during a launch the driver accepts: a boxed record.
    fn a_reclaim_during_an_accepted_launch_leaves_a_boxed_record_to_the_driver(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        reclaim_during_an_accepted_launch(true);
    }

    /// A capture begun between the capture query and the launch: a pooled record.
    fn a_capture_begun_inside_the_launch_runs_it_once_and_releases_it_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_begun_inside_the_launch(false, false);
    }

    /// A capture begun between the capture query and the launch: a boxed record.
    fn a_capture_begun_inside_the_launch_runs_a_boxed_record_once_and_releases_it_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_begun_inside_the_launch(true, false);
    }

    /// A capture begun and ended inside the launch, unseen by the launcher: a pooled record.
    fn a_capture_begun_and_ended_inside_the_launch_runs_it_once_and_releases_it_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_begun_inside_the_launch(false, true);
    }

    /// A capture begun and ended inside the launch, unseen by the launcher: a boxed record.
    fn a_capture_begun_and_ended_inside_the_launch_runs_a_boxed_record_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        capture_begun_inside_the_launch(true, true);
    }

    /// A capture that took the launch and was never replayed: the launch stays pending (a graph
    /// made from the capture may still run it), and a reset of its context releases it, once; a
    /// replay afterwards touches nothing.
    fn a_captured_launch_never_replayed_is_released_with_its_context(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
        let raw = SendStream::of(&stream);
        fake().set_hook("cuLaunchHostFunc", 1, move || begin_capture(raw));
        launch(&stream, &drops, &seen, false).unwrap();
        let graph = end_capture(&stream);
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 0);
        assert_eq!(context.pending_launches(), 1);
        drop(stream);
        // SAFETY: the context's only stream is dropped and nothing made in it is used afterwards
        // (the graph is bound to no context until it is instantiated).
        let reclaimed = unsafe { context.reset() }.unwrap();
        assert_eq!(reclaimed, 1);
        drops.wait_dropped(1);
        // The graph replayed in the context's new incarnation: the released launch is not run.
        let stream = Stream::new(&context).unwrap();
        let exec = graph.instantiate().unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(seen.ran.load(Ordering::SeqCst), 0);
        assert_eq!(drops.dropped(), 1);
        assert_eq!(drops.live(), 0);
        assert_eq!(pending_launches(None), 0);
    }

    /// The host function runs to its end before its launcher has looked at the stream again: the
    /// launcher queues the record, once.
    fn a_host_function_that_ran_before_its_launcher_was_done_is_released_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let (drops, seen) = (Drops::new(), Arc::new(Seen::default()));
        let watch = Arc::clone(&seen);
        fake().set_hook_after("cuLaunchHostFunc", 1, move || {
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
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let (started, finish) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let (hook_started, run_started, run_finish) =
            (Arc::clone(&started), Arc::clone(&started), Arc::clone(&finish));
        fake().set_hook_after("cuLaunchHostFunc", 1, move || {
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
}
