//! The reaper behind: owners whose `Drop` is slow never hold up the driver's thread, launches or
//! synchronization; and panics everywhere at once (host closures, owners' `Drop`, graph host
//! nodes, the panic handler itself), under load, are all reported and stop nothing.
//!
//! Timing checks compare quantities an order of magnitude apart (a few ms of host functions
//! against the reaper's hundreds of ms of drops), so a busy machine does not make them flaky; the
//! figures are printed. The panic handler and hook are process-wide: each test has a process of
//! its own.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda_host_launch::{
    Graph, LaunchOptions, PanicOrigin, Stream, add_host_node, flush, host_launch,
    reset_panic_handler, set_panic_handler,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{Drops, PATIENCE, fake, fake_driver_path, fake_primary_context};

/// How long each slow owner's `Drop` takes.
const SLOW_DROP: Duration = Duration::from_millis(2);
/// Slow owners in the first batch: the reaper needs `N × SLOW_DROP` (600 ms) for them.
const N: usize = 300;
/// Launches made while the reaper is behind.
const M: usize = 100;

/// An owner whose `Drop` sleeps, then counts.
struct SlowOwner(Arc<AtomicUsize>);

impl Drop for SlowOwner {
    fn drop(&mut self) {
        std::thread::sleep(SLOW_DROP);
        self.0.fetch_add(1, Ordering::SeqCst);
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
    /// 300 owners whose `Drop` takes 2 ms each (600 ms of reaper work): the host functions still
    /// run back to back, `synchronize` returns as soon as they have run (the reaper far behind),
    /// launches made meanwhile return at once and their host functions run promptly, and `flush`
    /// then waits for every owner, each dropped once, by the reaper.
    fn slow_owners_never_hold_up_the_driver_thread_launches_or_synchronize(
        CUDA_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new_non_blocking(&context).unwrap();
        let dropped = Arc::new(AtomicUsize::new(0));
        let base = Instant::now();
        let ran_at: Arc<Vec<AtomicU64>> = Arc::new((0..N + M).map(|_| AtomicU64::new(0)).collect());

        // Batch 1: launched behind a hold, so that the host functions run back to back.
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        for i in 0..N {
            let (owner, ran_at) = (SlowOwner(Arc::clone(&dropped)), Arc::clone(&ran_at));
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
        let dropped_at_sync = dropped.load(Ordering::SeqCst);

        // Batch 2, while the reaper is still behind: launch latency and launch-to-run latency.
        let mut launch_latency = Duration::ZERO;
        let launched_at: Vec<u64> = (N..N + M)
            .map(|i| {
                let (owner, ran_at) = (SlowOwner(Arc::clone(&dropped)), Arc::clone(&ran_at));
                let started = Instant::now();
                let at = since(base);
                host_launch(&stream, move || {
                    let _keep = &owner;
                    ran_at[i].store(since(base), Ordering::SeqCst);
                })
                .unwrap();
                launch_latency = launch_latency.max(started.elapsed());
                at
            })
            .collect();
        let second_sync_started = Instant::now();
        stream.synchronize().unwrap();
        let second_sync = second_sync_started.elapsed();
        let dropped_at_second_sync = dropped.load(Ordering::SeqCst);

        let flush_started = Instant::now();
        flush(Duration::from_secs(30)).unwrap();
        let flushed = flush_started.elapsed();
        assert_eq!(dropped.load(Ordering::SeqCst), N + M, "owners dropped");

        let runs: Vec<u64> = ran_at.iter().map(|t| t.load(Ordering::SeqCst)).collect();
        assert!(runs.iter().all(|&t| t > 0), "a host function did not run");
        let first = &runs[..N];
        let span = first.iter().max().unwrap() - first.iter().min().unwrap();
        let max_gap = first.windows(2).map(|w| w[1].saturating_sub(w[0])).max().unwrap_or(0);
        let run_latency = runs[N..]
            .iter()
            .zip(&launched_at)
            .map(|(run, launched)| run.saturating_sub(*launched))
            .max()
            .unwrap_or(0);
        let reaper_work = SLOW_DROP * (N + M) as u32;
        println!(
            "{N} host functions with 2 ms owners ran within {:.2} ms (largest gap {:.2} ms); \
             synchronize returned {:.2} ms after the release, with {dropped_at_sync} of {N} \
             owners dropped; {M} launches meanwhile: longest launch {launch_latency:?}, longest \
             launch-to-run {:.2} ms, synchronize {second_sync:?} with {dropped_at_second_sync} of \
             {} owners dropped; flush waited {flushed:?} for the rest (reaper work {reaper_work:?})",
            ms(span),
            ms(max_gap),
            ms(synchronized - released),
            ms(run_latency),
            N + M,
        );
        // The driver's thread ran the host functions without waiting for the reaper: all of them
        // in well under the reaper's time for their owners.
        let budget = (SLOW_DROP * N as u32 / 4).as_nanos() as u64;
        assert!(span < budget, "host functions took {:.1} ms", ms(span));
        assert!(max_gap < budget / 2, "a gap of {:.1} ms", ms(max_gap));
        // synchronize waited for the host functions, not for their owners.
        assert!(dropped_at_sync < N / 2, "synchronize waited for {dropped_at_sync} drops");
        assert!(
            dropped_at_second_sync < N / 2,
            "synchronize waited for {dropped_at_second_sync} drops"
        );
        assert!(launch_latency < Duration::from_millis(100), "a launch took {launch_latency:?}");
        assert!(run_latency < budget, "a host function waited {:.1} ms", ms(run_latency));
        assert!(second_sync < Duration::from_millis(150), "synchronize took {second_sync:?}");
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
        CUDA_SYS_LIBRARY = fake_driver_path()
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
                        let result = if i % 8 == 3 {
                            // Some repeatable (not capturing: run once) launches too.
                            LaunchOptions::default().host_launch_repeatable(stream, move || {
                                let _keep = (&counted, &panicking);
                                ran.fetch_add(1, Ordering::SeqCst);
                            })
                        } else {
                            host_launch(stream, move || {
                                let _keep = (&counted, &panicking);
                                ran.fetch_add(1, Ordering::SeqCst);
                                if closure_panics {
                                    panic!("{EXPECTED} from a host closure");
                                }
                            })
                        };
                        result.unwrap();
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
            ["cuda-host-launch-reaper"],
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
