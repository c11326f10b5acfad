//! Many launches from many threads: every function runs, every owner is dropped exactly once, the
//! cleanup queue's counters balance and no driver object is left behind. In a process of its own,
//! so that the counters are this test's alone.
//!
//! The heap is printed, not checked: what the crate keeps for the most launches pending at once
//! (tickets, record segments) and the fake's queues move with the reaper's lag, which load moves.
//! A record the crate loses is LeakSanitizer's to find (`scripts/sanitize` runs this test with
//! records boxed and pooled); a ticket never given back, the tickets' unit test's.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuda_host_launch::{
    Stream, cleanup_stats, flush, launch_host_function, launch_ticket_bytes, pending_launches,
};
use cuda_workspace::gpu::heap_in_use;
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{DropCounts, fake, fake_primary_context};
use fake_cuda::fixture::LiveObjects;

const THREADS: usize = 8;
const PER_THREAD: usize = 20_000;
const FLUSH: Duration = Duration::from_secs(30);
/// Each thread waits for its stream after this many launches. The fake driver, unlike the real
/// one, never makes a launch wait for room in its queue, so without this the most launches pending
/// at once (what the record pool, the tickets and the fake's queues grow to) would vary widely from
/// run to run; the heap figure printed would be that peak.
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
    /// every owner was dropped exactly once, every record queued for release was released, no
    /// host function is left with the driver and no driver object was left behind.
    fn launches_from_8_threads_drop_every_owner_exactly_once_and_release_every_record() {
        const WARM_UP: usize = 2 * BATCH;
        const TOTAL: usize = THREADS * PER_THREAD;
        let drops = DropCounts::new(THREADS * WARM_UP + TOTAL);
        // Warm up the allocator, the fake's queues and the reaper, the same way, then measure.
        launch_from_threads(drops, 0, WARM_UP);
        let live_before = LiveObjects::of(fake());
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
        // call a launch late); `BATCH` bounds that peak, but the reaper's lag still moves it.
        let tickets_grew = launch_ticket_bytes() - tickets_before;
        let (never, twice) = (drops.never(), drops.more_than_once());
        println!(
            "{TOTAL} launches from {THREADS} threads in {elapsed:?}; owners never dropped {never}, \
             more than once {twice}; heap {heap_before} B before, {heap_after} B after (the \
             tickets grew by {tickets_grew} B); {stats:?}"
        );
        assert_eq!(RAN.load(Ordering::SeqCst), TOTAL as u64);
        assert_eq!((never, twice), (0, 0));
        assert_eq!(stats.queued - stats_before.queued, TOTAL as u64);
        assert_eq!(stats.queued, stats.released);
        assert_eq!(pending_launches(None), 0);
        assert_eq!(fake().pending_host_functions(std::ptr::null_mut()), 0);
        let grown = LiveObjects::of(fake()).grown_since(&live_before);
        assert!(grown.is_empty(), "driver objects left behind: {grown:?}");
        // Every owner is gone: free the counters (LeakSanitizer would report them otherwise).
        // SAFETY: no owner is left and `drops` is not used again.
        unsafe { drops.free() };
    }
}
