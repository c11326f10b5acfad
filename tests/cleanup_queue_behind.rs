//! The reaper behind: owners whose `Drop` blocks never hold up the driver's thread, launches or
//! synchronization; and panics everywhere at once (host closures, owners' `Drop`, graph host
//! nodes, the panic handler itself), under load, are all reported and stop nothing.
//!
//! No check here depends on timing: the reaper is held behind a gate (an owner's `Drop` that waits
//! until the test opens it), so "the driver's thread did not wait for the drops" is a count (no
//! owner dropped while everything else completed), whatever the machine's load. The durations are
//! printed as figures, never asserted. The panic handler and hook are process-wide: each test has
//! a process of its own.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cuda_host_launch::{
    Graph, LaunchOptions, PanicOrigin, Stream, add_host_node, flush, host_launch,
    reset_panic_handler, set_panic_handler,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    Drops, PATIENCE, ThreadInfo, fake, fake_driver_path, fake_primary_context,
};

/// How long each owner's `Drop` takes once the gate is open.
const SLOW_DROP: Duration = Duration::from_millis(2);
/// Owners in the first batch: once the gate opens, the reaper needs `N × SLOW_DROP` for them.
const N: usize = 300;
/// Launches made while the reaper is held.
const M: usize = 100;

/// Closed until [`Gate::open`]: every owner's `Drop` waits at it. A `Drop` that waits out
/// [`PATIENCE`] (the thread dropping it was waited for by what the test does meanwhile, or the test
/// forgot to open it) notes it and opens the gate, so that the test fails on that note rather than
/// hanging.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
    waited_out: AtomicBool,
}

impl Gate {
    fn pass(&self) {
        let deadline = Instant::now() + PATIENCE;
        let mut open = self.open.lock().unwrap();
        while !*open {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.waited_out.store(true, Ordering::SeqCst);
                *open = true;
                self.opened.notify_all();
                break;
            }
            open = self.opened.wait_timeout(open, left).unwrap().0;
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    fn waited_out(&self) -> bool {
        self.waited_out.load(Ordering::SeqCst)
    }
}

/// An owner whose `Drop` waits at the gate, sleeps [`SLOW_DROP`], then counts (and notes whether
/// the reaper dropped it).
struct SlowOwner {
    gate: Arc<Gate>,
    dropped: Arc<AtomicUsize>,
    by_reaper: Arc<AtomicUsize>,
}

impl Drop for SlowOwner {
    fn drop(&mut self) {
        self.gate.pass();
        std::thread::sleep(SLOW_DROP);
        if ThreadInfo::current().is_reaper() {
            self.by_reaper.fetch_add(1, Ordering::SeqCst);
        }
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// Nanoseconds since `base`.
fn since(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}

fn ms(nanos: u64) -> f64 {
    nanos as f64 / 1e6
}

isolated_test! {
    /// 300 owners whose `Drop` blocks (the reaper held in the first of them): the host functions
    /// all run, `synchronize` returns, 100 launches made meanwhile return and their host functions
    /// run, and `synchronize` returns again, all with no owner dropped; once the gate opens,
    /// `flush` waits for every owner (2 ms each), each dropped once, by the reaper. (Any wait of
    /// the driver's thread, a launch or `synchronize` for an owner's drop waits out the closed
    /// gate: the test fails on the gate's note, or on the owners dropped too early.)
    fn slow_owners_never_hold_up_the_driver_thread_launches_or_synchronize(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new_non_blocking(&context).unwrap();
        let gate = Arc::new(Gate::default());
        let (dropped, by_reaper) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let owner = || SlowOwner {
            gate: Arc::clone(&gate),
            dropped: Arc::clone(&dropped),
            by_reaper: Arc::clone(&by_reaper),
        };
        let base = Instant::now();
        let ran_at: Arc<Vec<AtomicU64>> = Arc::new((0..N + M).map(|_| AtomicU64::new(0)).collect());
        let ran = |ran_at: &[AtomicU64]| ran_at.iter().filter(|t| t.load(Ordering::SeqCst) > 0).count();

        // Batch 1: launched behind a hold, so that the host functions run back to back.
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        for i in 0..N {
            let (owner, ran_at) = (owner(), Arc::clone(&ran_at));
            host_launch(&stream, move || {
                let _keep = &owner;
                ran_at[i].store(since(base), Ordering::SeqCst);
            })
            .unwrap();
        }
        let released = since(base);
        hold.release();
        stream.synchronize().unwrap();
        let synchronized = since(base);
        let (ran_at_sync, dropped_at_sync) = (ran(&ran_at), dropped.load(Ordering::SeqCst));

        // Batch 2, while the reaper is held: launches, their host functions, synchronize.
        let mut launch_latency = Duration::ZERO;
        for i in N..N + M {
            let (owner, ran_at) = (owner(), Arc::clone(&ran_at));
            let started = Instant::now();
            host_launch(&stream, move || {
                let _keep = &owner;
                ran_at[i].store(since(base), Ordering::SeqCst);
            })
            .unwrap();
            launch_latency = launch_latency.max(started.elapsed());
        }
        let second_sync_started = Instant::now();
        stream.synchronize().unwrap();
        let second_sync = second_sync_started.elapsed();
        let (ran_at_second_sync, dropped_at_second_sync) =
            (ran(&ran_at), dropped.load(Ordering::SeqCst));

        gate.open();
        let flush_started = Instant::now();
        flush(Duration::from_secs(30)).unwrap();
        let flushed = flush_started.elapsed();
        let dropped_at_flush = dropped.load(Ordering::SeqCst);

        let first: Vec<u64> = ran_at[..N].iter().map(|t| t.load(Ordering::SeqCst)).collect();
        let span = first.iter().max().unwrap() - first.iter().min().unwrap();
        println!(
            "{N} host functions with blocked owners ran within {:.2} ms; synchronize returned \
             {:.2} ms after the release, with {dropped_at_sync} of {N} owners dropped; {M} \
             launches meanwhile: longest launch {launch_latency:?}, synchronize {second_sync:?} \
             with {dropped_at_second_sync} dropped; once the gate opened, flush waited \
             {flushed:?} for the {} drops (reaper work {:?})",
            ms(span),
            ms(synchronized - released),
            N + M,
            SLOW_DROP * (N + M) as u32,
        );
        assert!(!gate.waited_out(), "an owner's drop waited out the closed gate: something waited for it");
        // The driver's thread ran the host functions, and synchronize returned, with the reaper
        // held in the first owner's drop.
        assert_eq!((ran_at_sync, dropped_at_sync), (N, 0), "ran, dropped at the first synchronize");
        // Launches returned and their host functions ran with the reaper still held.
        assert_eq!(
            (ran_at_second_sync, dropped_at_second_sync),
            (N + M, 0),
            "ran, dropped at the second synchronize"
        );
        // flush waited for every drop; each by the reaper.
        assert_eq!(dropped_at_flush, N + M, "owners dropped when flush returned");
        assert_eq!(by_reaper.load(Ordering::SeqCst), N + M, "owners dropped by the reaper");
        assert_eq!(fake().driver_thread_call_count(""), 0);
    }
}

/// Marks the panics this test causes, so the hook keeps them off stderr.
const EXPECTED: &str = "[expected panic]";

/// Keeps this test's own panics quiet (others still print).
fn quiet_expected_panics() {
    cuda_workspace::testing::quiet_expected_panics(|m| m.contains(EXPECTED));
}

/// An owner whose `Drop` counts, then panics.
struct PanickingOwner(Arc<AtomicUsize>);

impl Drop for PanickingOwner {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("{EXPECTED} from an owner's Drop");
    }
}

const PANIC_THREADS: usize = 4;
const PANIC_LAUNCHES: usize = 2_000;
const GRAPH_LAUNCHES: usize = 50;

isolated_test! {
    /// Under load (4 threads × 2000 launches on 2 streams, and a graph replayed 50 times), a
    /// quarter of the host closures panic, a quarter of the launches have an owner whose `Drop`
    /// panics, a quarter both, a graph host node panics on every replay, and the panic handler
    /// panics on every third report. Every panic is reported exactly once, by the reaper; nothing
    /// aborts; every owner is dropped (the panicking ones counted before they panic); and after
    /// the storm the reaper and the streams still work.
    fn panics_everywhere_at_once_are_all_reported_and_stop_nothing(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        quiet_expected_panics();
        let reports: Arc<Mutex<[usize; 2]>> = Arc::default();
        let handler_panics = Arc::new(AtomicUsize::new(0));
        let reporters: Arc<Mutex<std::collections::BTreeSet<String>>> = Arc::default();
        {
            let (reports, handler_panics, reporters) =
                (Arc::clone(&reports), Arc::clone(&handler_panics), Arc::clone(&reporters));
            set_panic_handler(move |report| {
                let n = {
                    let mut counts = reports.lock().unwrap();
                    counts[usize::from(report.origin == PanicOrigin::OwnerDrop)] += 1;
                    counts[0] + counts[1]
                };
                let name = std::thread::current().name().unwrap_or("?").to_string();
                reporters.lock().unwrap().insert(name);
                if n % 3 == 0 {
                    handler_panics.fetch_add(1, Ordering::SeqCst);
                    panic!("{EXPECTED} from the panic handler");
                }
            });
        }
        let context = fake_primary_context();
        let streams = [
            Stream::new_non_blocking(&context).unwrap(),
            Stream::new_non_blocking(&context).unwrap(),
        ];
        let ran = Arc::new(AtomicUsize::new(0));
        let owners_dropped = Arc::new(AtomicUsize::new(0));
        let drops = Drops::new();

        // A graph whose first node panics on every replay; the second node still runs.
        let graph = Graph::new().unwrap();
        let boom = add_host_node(&graph, &[], || panic!("{EXPECTED} from a graph node")).unwrap();
        let after = Arc::clone(&ran);
        add_host_node(&graph, &[boom], move || {
            after.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let exec = graph.instantiate().unwrap();

        let started = Instant::now();
        std::thread::scope(|s| {
            for t in 0..PANIC_THREADS {
                let (stream, ran, dropped, drops) =
                    (&streams[t % 2], &ran, &owners_dropped, &drops);
                s.spawn(move || {
                    for i in 0..PANIC_LAUNCHES {
                        let ran = Arc::clone(ran);
                        let counted = drops.owner();
                        let owner_panics = matches!(i % 4, 1 | 2);
                        let closure_panics = matches!(i % 4, 0 | 2);
                        let panicking = owner_panics.then(|| PanickingOwner(Arc::clone(dropped)));
                        if i % 8 == 3 {
                            // Some repeatable (not capturing: run once) launches too.
                            LaunchOptions::default()
                                .host_launch_repeatable(stream, move || {
                                    let _keep = (&counted, &panicking);
                                    ran.fetch_add(1, Ordering::SeqCst);
                                })
                                .unwrap();
                        } else {
                            host_launch(stream, move || {
                                let _keep = (&counted, &panicking);
                                ran.fetch_add(1, Ordering::SeqCst);
                                if closure_panics {
                                    panic!("{EXPECTED} from a host closure");
                                }
                            })
                            .unwrap();
                        }
                    }
                });
            }
            // Meanwhile, from this thread: the graph whose node panics.
            for _ in 0..GRAPH_LAUNCHES {
                exec.launch(&streams[0]).unwrap();
            }
        });
        for stream in &streams {
            stream.synchronize().unwrap();
        }
        let total = PANIC_THREADS * PANIC_LAUNCHES;
        let per_kind = total / 4;
        let expected = [2 * per_kind + GRAPH_LAUNCHES, 2 * per_kind];
        let deadline = Instant::now() + PATIENCE;
        loop {
            flush(PATIENCE).unwrap();
            let got = *reports.lock().unwrap();
            if got == expected {
                break;
            }
            assert!(
                got[0] <= expected[0] && got[1] <= expected[1],
                "reports {got:?}, expected {expected:?}"
            );
            assert!(Instant::now() < deadline, "reports {got:?}, expected {expected:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
        let elapsed = started.elapsed();
        drops.wait_dropped(total);
        assert_eq!(ran.load(Ordering::SeqCst), total + GRAPH_LAUNCHES);
        assert_eq!(owners_dropped.load(Ordering::SeqCst), 2 * per_kind);
        let reporters = reporters.lock().unwrap().clone();
        println!(
            "{total} launches + {GRAPH_LAUNCHES} graph replays in {elapsed:?}: {} host-function \
             panics and {} owner-drop panics reported (as expected), {} of them by a panicking \
             handler; reported by {reporters:?}",
            expected[0],
            expected[1],
            handler_panics.load(Ordering::SeqCst),
        );
        assert_eq!(handler_panics.load(Ordering::SeqCst), (expected[0] + expected[1]) / 3);
        assert_eq!(
            reporters.into_iter().collect::<Vec<_>>(),
            ["cuda-hl-reaper"],
            "reported by another thread than the reaper"
        );

        // The reaper and the streams still work.
        reset_panic_handler();
        let later = Drops::new();
        for stream in &streams {
            for _ in 0..100 {
                let (owner, ran) = (later.owner(), Arc::clone(&ran));
                host_launch(stream, move || {
                    let _keep = &owner;
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            }
            stream.synchronize().unwrap();
        }
        let records = later.wait_dropped(200);
        assert!(records.iter().all(|r| r.thread.is_reaper()), "{:?}", records[0]);
        assert_eq!(ran.load(Ordering::SeqCst), total + GRAPH_LAUNCHES + 200);
        drop((exec, graph));
        assert_eq!(fake().driver_thread_call_count(""), 0);
    }
}
