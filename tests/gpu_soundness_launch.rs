//! The launch's capture race on the real GPU: while one thread launches run-once host functions
//! on a stream, another thread keeps beginning and ending captures of that same stream through
//! `cuda-sys` (as another crate's safe `begin_capture` would), capturing almost nothing so that
//! whole captures fit inside one launch, and replays each graph twice. Whatever each launch met
//! (refused with `CaptureActive`, taken into a graph, or run from the stream), every owner is
//! dropped exactly once, never on a driver thread, and no host function runs twice or after its
//! owner was dropped. Opt-in: `--ignored`, or the bundle of `scripts/gpu-bundle`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use cuda_host_launch::{Error, Graph, Stream, flush, host_launch, pending_launches};
use cuda_sys::types::CUstreamCaptureMode;
use cuda_workspace::gpu::Gpu;

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// Per launch: how often its host function ran and its owner was dropped; and every thread that
/// dropped an owner or ran a host function.
struct Tally {
    runs: Vec<AtomicUsize>,
    drops: Vec<AtomicUsize>,
    ran_after_drop: AtomicBool,
    drop_threads: Mutex<HashSet<ThreadId>>,
    run_threads: Mutex<HashSet<ThreadId>>,
}

impl Tally {
    fn new(n: usize) -> Arc<Tally> {
        Arc::new(Tally {
            runs: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            drops: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            ran_after_drop: AtomicBool::new(false),
            drop_threads: Mutex::new(HashSet::new()),
            run_threads: Mutex::new(HashSet::new()),
        })
    }

    fn count(counters: &[AtomicUsize], f: impl Fn(usize) -> bool) -> usize {
        counters
            .iter()
            .filter(|c| f(c.load(Ordering::SeqCst)))
            .count()
    }
}

/// Launch `i`'s owner.
struct Owner(Arc<Tally>, usize);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.drops[self.1].fetch_add(1, Ordering::SeqCst);
        self.0
            .drop_threads
            .lock()
            .unwrap()
            .insert(std::thread::current().id());
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn launches_racing_another_threads_captures_of_their_stream_release_every_owner_once() {
    const LAUNCHES: usize = 50_000;
    let gpu = Arc::new(Gpu::open());
    let stream = Arc::new(Stream::new_non_blocking(&gpu.context).unwrap());
    let replay = Stream::new_non_blocking(&gpu.context).unwrap();
    let tally = Tally::new(LAUNCHES);
    let done = Arc::new(AtomicBool::new(false));

    // Another thread's captures of the same stream, each replayed twice, then destroyed.
    let capturer = {
        let (gpu, stream, done) = (Arc::clone(&gpu), Arc::clone(&stream), Arc::clone(&done));
        std::thread::spawn(move || {
            gpu.bind_thread();
            let (mut graphs, mut nodes) = (0usize, 0usize);
            while !done.load(Ordering::SeqCst) {
                // SAFETY: a live stream; relaxed mode, so this thread's capture does not forbid
                // the launching thread's driver calls.
                unsafe { gpu.driver.cuStreamBeginCapture(stream.raw(), RELAXED) }.unwrap();
                std::hint::spin_loop();
                let mut raw = std::ptr::null_mut();
                // SAFETY: the stream this thread began capturing; a valid out-pointer.
                unsafe { gpu.driver.cuStreamEndCapture(stream.raw(), &mut raw) }.unwrap();
                // SAFETY: the graph the capture made, owned by nobody else.
                let graph = unsafe { Graph::from_raw(raw) };
                nodes += graph.node_types().unwrap().len();
                let exec = graph.instantiate().unwrap();
                exec.launch(&replay).unwrap();
                exec.launch(&replay).unwrap();
                replay.synchronize().unwrap();
                graphs += 1;
            }
            (graphs, nodes)
        })
    };

    let (mut accepted, mut refused) = (0usize, 0usize);
    let started = Instant::now();
    for i in 0..LAUNCHES {
        let owner = Owner(Arc::clone(&tally), i);
        let seen = Arc::clone(&tally);
        let launched = host_launch(&*stream, move || {
            let _keep = &owner;
            seen.runs[i].fetch_add(1, Ordering::SeqCst);
            if seen.drops[i].load(Ordering::SeqCst) > 0 {
                seen.ran_after_drop.store(true, Ordering::SeqCst);
            }
            seen.run_threads
                .lock()
                .unwrap()
                .insert(std::thread::current().id());
        });
        match launched {
            Ok(()) => accepted += 1,
            Err(Error::CaptureActive { .. }) => refused += 1,
            Err(e) => panic!("launch {i}: {e}"),
        }
    }
    done.store(true, Ordering::SeqCst);
    let (graphs, nodes) = capturer.join().unwrap();
    stream.synchronize().unwrap();
    // Every graph and executable is destroyed; their user objects go asynchronously.
    let deadline = Instant::now() + Duration::from_secs(20);
    let never = |t: &Tally| Tally::count(&t.drops, |d| d == 0);
    while never(&tally) > 0 && Instant::now() < deadline {
        flush(Duration::from_secs(1)).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    let ran_twice = Tally::count(&tally.runs, |r| r > 1);
    let ran = Tally::count(&tally.runs, |r| r == 1);
    let twice = Tally::count(&tally.drops, |d| d > 1);
    println!(
        "{LAUNCHES} launches in {:.2?} racing {graphs} captures of their stream ({nodes} nodes \
         captured): accepted {accepted}, refused {refused}; ran {ran}, ran twice {ran_twice}; \
         owners never dropped {}, dropped twice {}; still pending {}",
        started.elapsed(),
        never(&tally),
        twice,
        pending_launches(None),
    );
    assert!(graphs > 0, "no capture raced the launches");
    assert_eq!(accepted + refused, LAUNCHES);
    assert_eq!(ran_twice, 0, "a run-once host function ran twice");
    assert!(
        !tally.ran_after_drop.load(Ordering::SeqCst),
        "a host function ran after its owner's drop"
    );
    assert_eq!(never(&tally), 0, "owners never dropped");
    assert_eq!(twice, 0, "owners dropped twice");
    // No owner was dropped on a thread that ran host functions (a driver thread).
    let run_threads = tally.run_threads.lock().unwrap();
    assert!(!run_threads.is_empty());
    let drop_threads = tally.drop_threads.lock().unwrap();
    assert!(
        run_threads.is_disjoint(&drop_threads),
        "owners dropped on a driver thread"
    );
}
