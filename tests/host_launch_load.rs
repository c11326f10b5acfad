//! Many launches from many threads: every function runs, every owner is dropped exactly once, the
//! cleanup queue's counters balance and the heap is flat afterwards. In a process of its own, so
//! that the counters and the heap are this test's alone.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuda_host_launch::{Stream, cleanup_stats, flush, launch_host_function};
use cuda_workspace::gpu::heap_in_use;
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{drop_flags, fake, fake_primary_context};

const THREADS: usize = 8;
const PER_THREAD: usize = 20_000;
const FLUSH: Duration = Duration::from_secs(30);

static RAN: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn count_run(_: *mut c_void) {
    RAN.fetch_add(1, Ordering::Relaxed);
}

/// Marks its slot when dropped.
struct Counted(&'static [AtomicU8], usize);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0[self.1].fetch_add(1, Ordering::Relaxed);
    }
}

/// `per_thread` launches from each of `THREADS` threads, each on a stream of its own, with owners
/// marking `drops` from `first` on; waits until all have run and been released.
fn launch_from_threads(drops: &'static [AtomicU8], first: usize, per_thread: usize) {
    let context = fake_primary_context();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let context = &context;
            s.spawn(move || {
                let stream = Stream::new(context).unwrap();
                for i in 0..per_thread {
                    let owner = Counted(drops, first + t * per_thread + i);
                    // SAFETY: `count_run` ignores its argument and does not unwind.
                    unsafe {
                        launch_host_function(&stream, Some(count_run), std::ptr::null_mut(), owner)
                    }
                    .unwrap();
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
    /// is where it was after a warm-up (within 1 MiB).
    fn launches_from_8_threads_drop_every_owner_exactly_once_and_leave_the_heap_flat() {
        const WARM_UP: usize = 1_000;
        const TOTAL: usize = THREADS * PER_THREAD;
        let drops = drop_flags(THREADS * WARM_UP + TOTAL);
        // Warm up the allocator, the fake's queues and the reaper, the same way, then measure.
        launch_from_threads(drops, 0, WARM_UP);
        let heap_before = heap_in_use();
        let stats_before = cleanup_stats();
        RAN.store(0, Ordering::SeqCst);

        let started = Instant::now();
        launch_from_threads(drops, THREADS * WARM_UP, PER_THREAD);
        let elapsed = started.elapsed();

        let stats = cleanup_stats();
        let heap_after = heap_in_use();
        let never = drops.iter().filter(|d| d.load(Ordering::Relaxed) == 0).count();
        let twice = drops.iter().filter(|d| d.load(Ordering::Relaxed) > 1).count();
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
            heap_after <= heap_before + (1 << 20),
            "the heap grew by {} bytes",
            heap_after.saturating_sub(heap_before)
        );
        // Every owner is gone, so nothing refers to the flags any more: free them (LeakSanitizer
        // would report them otherwise).
        // SAFETY: `drops` came from `Box::leak` above and no owner (the only other users) is left.
        drop(unsafe { Box::from_raw(std::ptr::from_ref(drops).cast_mut()) });
    }
}
