//! Many launches from many threads: every function runs, every owner is dropped exactly once, the
//! cleanup queue's counters balance and the heap is flat afterwards. In a process of its own, so
//! that the counters and the heap are this test's alone.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuda_host_launch::{Stream, cleanup_stats, flush, launch_host_function, launch_ticket_bytes};
use cuda_workspace::gpu::heap_in_use;
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{DropCounts, fake, fake_primary_context};

const THREADS: usize = 8;
const PER_THREAD: usize = 20_000;
const FLUSH: Duration = Duration::from_secs(30);
/// Each thread waits for its stream after this many launches. The fake driver, unlike the real
/// one, never makes a launch wait for room in its queue, so without this the most launches pending
/// at once (what the record pool, the tickets and the fake's queues grow to) varies from run to run
/// and from the warm-up to the measured run, and the heap check would see that peak, not a leak.
const BATCH: usize = 1_000;

static RAN: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn count_run(_: *mut c_void) {
    RAN.fetch_add(1, Ordering::Relaxed);
}

/// `per_thread` launches from each of `THREADS` threads, each on a stream of its own, with owners
/// marking `drops` from `first` on, the stream synchronized after every [`BATCH`]; waits until all
/// have run and been released.
fn launch_from_threads(drops: DropCounts, first: usize, per_thread: usize) {
    let context = fake_primary_context();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let context = &context;
            s.spawn(move || {
                let stream = Stream::new(context).unwrap();
                for i in 0..per_thread {
                    let owner = drops.owner(first + t * per_thread + i);
                    // SAFETY: `count_run` ignores its argument and does not unwind.
                    unsafe {
                        launch_host_function(&stream, Some(count_run), std::ptr::null_mut(), owner)
                    }
                    .unwrap();
                    if (i + 1) % BATCH == 0 {
                        stream.synchronize().unwrap();
                    }
                }
                stream.synchronize().unwrap();
            });
        }
    });
    flush(FLUSH).unwrap();
}

isolated_test! {
    /// 8 threads × 20 000 launches, each thread on its own stream, with counted owners: all ran,
    /// every owner was dropped exactly once, the cleanup queue's counters balance, and the heap
    /// is where it was after a warm-up of the same shape (within 1 MiB, beside what the launch
    /// tickets grew by: they grow to the most launches pending at once and are never freed).
    fn launches_from_8_threads_drop_every_owner_exactly_once_and_leave_the_heap_flat() {
        const WARM_UP: usize = 2 * BATCH;
        const TOTAL: usize = THREADS * PER_THREAD;
        let drops = DropCounts::new(THREADS * WARM_UP + TOTAL);
        // Warm up the allocator, the fake's queues and the reaper, the same way, then measure.
        launch_from_threads(drops, 0, WARM_UP);
        let heap_before = heap_in_use();
        let tickets_before = launch_ticket_bytes();
        let stats_before = cleanup_stats();
        RAN.store(0, Ordering::SeqCst);

        let started = Instant::now();
        launch_from_threads(drops, THREADS * WARM_UP, PER_THREAD);
        let elapsed = started.elapsed();

        let stats = cleanup_stats();
        let heap_after = heap_in_use();
        // The launch tickets grow to the most launches pending at once (never freed: a graph may
        // call a launch late); `BATCH` bounds that peak, but the reaper's lag still moves it a
        // little from run to run.
        let tickets_grew = launch_ticket_bytes() - tickets_before;
        let (never, twice) = (drops.never(), drops.more_than_once());
        println!(
            "{TOTAL} launches from {THREADS} threads in {elapsed:?}; owners never dropped {never}, \
             more than once {twice}; heap {heap_before} B before, {heap_after} B after; {stats:?}"
        );
        assert_eq!(RAN.load(Ordering::SeqCst), TOTAL as u64);
        assert_eq!((never, twice), (0, 0));
        assert_eq!(stats.queued - stats_before.queued, TOTAL as u64);
        assert_eq!(stats.queued, stats.released);
        assert_eq!(fake().pending_host_functions(std::ptr::null_mut()), 0);
        assert!(
            heap_after <= heap_before + tickets_grew + (1 << 20),
            "the heap grew by {} bytes (the tickets by {tickets_grew})",
            heap_after.saturating_sub(heap_before)
        );
        // Every owner is gone: free the counters (LeakSanitizer would report them otherwise).
        // SAFETY: no owner is left and `drops` is not used again.
        unsafe { drops.free() };
    }
}
