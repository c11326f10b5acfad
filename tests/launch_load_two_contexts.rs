//! Load: 16 threads × 20 000 launches over 4 streams in 2 contexts (the primary context, and one
//! made with `cuCtxCreate` through `cuda-dl-sys`, reached through raw stream handles), closures and
//! raw launches mixed, run-once and repeatable. Every owner is counted: none lost, none dropped
//! twice, none dropped on a driver thread (the dropping thread of each owner is classified by its
//! operating-system name: the fake's driver threads are `fake-cuda-drive…`/`fake-cuda-user-…`),
//! all of them by the reaper; every host function ran; nothing is pending afterwards and no driver
//! object is left behind. In a process of its own, so that the counts are this test's alone.
//! Prints the figures, the heap's among them: not checked, since what the crate keeps for the most
//! launches pending at once (tickets, record segments) and the fake's queues move with the reaper's
//! lag, which load moves (a lost record is LeakSanitizer's to find, `scripts/sanitize`).

use std::cell::Cell;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUcontext, CUstream};
use cuda_host_launch::{
    AsRawStream, LaunchOptions, RawStream, Stream, cleanup_stats, flush, host_launch,
    launch_host_function, launch_ticket_bytes, pending_launches, reclaim_pending,
};
use cuda_workspace::gpu::heap_in_use;
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    CountedOwner, DropCounts, REAPER_NAME, fake, fake_driver_path, fake_primary_context,
};
use fake_cuda::fixture::LiveObjects;

const THREADS: usize = 16;
const PER_THREAD: usize = 20_000;
/// Each thread waits for its stream after this many launches. The fake driver, unlike the real
/// one, never makes a launch wait for room in its queue, so without this the most launches pending
/// at once (what the record pool, the tickets and the fake's queues grow to) would vary widely from
/// run to run (seen before this bound: heap +4.6 MB, tickets +2.9 MB, 1 full run in 4).
const BATCH: usize = 1_000;
const WARM_UP: usize = 2 * BATCH;
const FLUSH: Duration = Duration::from_secs(30);

/// Host functions that ran.
static RAN: AtomicU64 = AtomicU64::new(0);
/// Host closures that found themselves on a thread the classifier does not take for a driver
/// thread (which would make "none dropped on a driver thread" meaningless).
static MISCLASSIFIED: AtomicU64 = AtomicU64::new(0);

/// Drops by the kind of thread that made them.
static ON_DRIVER: AtomicU64 = AtomicU64::new(0);
static ON_REAPER: AtomicU64 = AtomicU64::new(0);
static ELSEWHERE: AtomicU64 = AtomicU64::new(0);

const UNKNOWN: u8 = 0;
const DRIVER: u8 = 1;
const REAPER: u8 = 2;
const OTHER: u8 = 3;

thread_local! {
    /// What kind of thread this is, found once (a const-initialised `Cell` needs no destructor,
    /// so it is fine on the fake's threads too).
    static KIND: Cell<u8> = const { Cell::new(UNKNOWN) };
}

/// The calling thread's kind, by its operating-system name (the fake's threads are foreign to
/// this binary's standard library) or its `std` name (the reaper).
fn thread_kind() -> u8 {
    KIND.with(|kind| {
        if kind.get() == UNKNOWN {
            let comm = std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default();
            kind.set(if comm.starts_with("fake-cuda-") {
                DRIVER
            } else if std::thread::current().name() == Some(REAPER_NAME) {
                REAPER
            } else {
                OTHER
            });
        }
        kind.get()
    })
}

/// Marks its slot (through the counted owner it holds) and its dropping thread's kind when dropped.
struct Counted(#[allow(dead_code, reason = "held for its Drop")] CountedOwner);

impl Drop for Counted {
    fn drop(&mut self) {
        match thread_kind() {
            DRIVER => &ON_DRIVER,
            REAPER => &ON_REAPER,
            _ => &ELSEWHERE,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}

unsafe extern "C" fn count_run(_: *mut c_void) {
    RAN.fetch_add(1, Ordering::Relaxed);
}

/// The 4 streams: 2 of the primary context (this crate's `Stream`, whose context is known), 2 of
/// a context of our own (raw handles: the launch asks `cuStreamGetCtx`).
struct Streams {
    primary: [Stream; 2],
    own: [RawStream; 2],
    /// Our context's handle, as an address (a handle is a token usable from any thread).
    own_context: usize,
}

impl Streams {
    fn new() -> Streams {
        let context = fake_primary_context();
        let driver = cuda_dl_sys::driver().unwrap();
        let (mut own, mut popped) = (ptr::null_mut(), ptr::null_mut());
        let mut raw: [CUstream; 2] = [ptr::null_mut(); 2];
        // SAFETY: valid out-pointers; `cuCtxCreate` pushes the new context, in which the streams
        // are made; it is popped again.
        unsafe {
            driver
                .cuCtxCreate(&mut own, ptr::null_mut(), 0, context.device().raw())
                .unwrap();
            for stream in &mut raw {
                driver.cuStreamCreate(stream, 0).unwrap();
            }
            driver.cuCtxPopCurrent(&mut popped).unwrap();
        }
        Streams {
            primary: [
                Stream::new_non_blocking(&context).unwrap(),
                Stream::new_non_blocking(&context).unwrap(),
            ],
            // SAFETY: the streams live until `destroy`, after every launch.
            own: raw.map(|s| unsafe { RawStream::from_raw(s) }),
            own_context: own.expose_provenance(),
        }
    }

    /// Waits for stream `k` (0, 1: the primary context's; 2, 3: ours).
    fn synchronize_one(&self, k: usize) {
        match k {
            0 | 1 => self.primary[k].synchronize().unwrap(),
            _ => {
                let driver = cuda_dl_sys::driver().unwrap();
                // SAFETY: a live stream.
                unsafe { driver.cuStreamSynchronize(self.own[k - 2].raw()) }.unwrap();
            }
        }
    }

    fn synchronize(&self) {
        for stream in &self.primary {
            stream.synchronize().unwrap();
        }
        let driver = cuda_dl_sys::driver().unwrap();
        for stream in &self.own {
            // SAFETY: a live stream.
            unsafe { driver.cuStreamSynchronize(stream.raw()) }.unwrap();
        }
    }

    /// Destroys our context (which runs anything pending first) and its streams.
    fn destroy(self) {
        let driver = cuda_dl_sys::driver().unwrap();
        // SAFETY: our streams and context, destroyed once, after every launch into them.
        unsafe {
            for stream in &self.own {
                driver.cuStreamDestroy(stream.raw()).unwrap();
            }
            let context: CUcontext = ptr::with_exposed_provenance_mut(self.own_context);
            driver.cuCtxDestroy(context).unwrap();
            assert_eq!(reclaim_pending(context), 0);
        }
    }
}

/// One launch of kind `i % 4` on `stream`, its owner marking `slot`.
fn launch(stream: impl AsRawStream, i: usize, drops: DropCounts, slot: usize) {
    let owner = Counted(drops.owner(slot));
    let options = LaunchOptions::default();
    match i % 4 {
        0 => host_launch(stream, move || {
            let _keep = &owner;
            if thread_kind() != DRIVER {
                MISCLASSIFIED.fetch_add(1, Ordering::Relaxed);
            }
            RAN.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap(),
        // SAFETY: `count_run` ignores its argument and does not unwind.
        1 => unsafe { launch_host_function(stream, Some(count_run), ptr::null_mut(), owner) }
            .unwrap(),
        2 => options
            .host_launch_repeatable(stream, move || {
                let _keep = &owner;
                RAN.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap(),
        // SAFETY: as above; it may run any number of times.
        _ => unsafe {
            options.launch_host_function_repeatable(stream, Some(count_run), ptr::null_mut(), owner)
        }
        .unwrap(),
    }
}

/// `per_thread` launches from each of `THREADS` threads, thread `t` on stream `t % 4`, owners
/// marking `drops` from `first` on, each thread waiting for its stream after every [`BATCH`];
/// waits until all ran and were released.
fn run(streams: &Streams, drops: DropCounts, first: usize, per_thread: usize) {
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                for i in 0..per_thread {
                    let slot = first + t * per_thread + i;
                    match t % 4 {
                        k @ (0 | 1) => launch(&streams.primary[k], i, drops, slot),
                        k => launch(streams.own[k - 2], i, drops, slot),
                    }
                    if (i + 1) % BATCH == 0 {
                        streams.synchronize_one(t % 4);
                    }
                }
            });
        }
    });
    streams.synchronize();
    flush(FLUSH).unwrap();
}

isolated_test! {
    /// 16 threads × 20 000 launches over 4 streams in 2 contexts: every function ran, every owner
    /// was dropped exactly once, by the reaper, none on a driver thread; every record queued for
    /// release was released; nothing is pending; no driver object was left behind.
    fn launches_from_16_threads_over_2_contexts_lose_nothing_and_leave_nothing_behind(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        const TOTAL: usize = THREADS * PER_THREAD;
        let drops = DropCounts::new(THREADS * WARM_UP + TOTAL);
        let streams = Streams::new();
        // Warm up the allocator, the record pool, the fake's queues and the reaper, the same way.
        run(&streams, drops, 0, WARM_UP);
        let live_before = LiveObjects::of(fake());
        let heap_before = heap_in_use();
        let tickets_before = launch_ticket_bytes();
        let stats_before = cleanup_stats();
        RAN.store(0, Ordering::SeqCst);
        let by_reaper_before = ON_REAPER.load(Ordering::SeqCst);

        let started = Instant::now();
        run(&streams, drops, THREADS * WARM_UP, PER_THREAD);
        let elapsed = started.elapsed();

        let heap_after = heap_in_use();
        // The launch tickets grow to the most launches pending at once (never freed: a graph may
        // call a launch late); the fake driver, unlike the real one, never makes a launch wait for
        // room in its queue, so that peak varies from run to run.
        let tickets_grew = launch_ticket_bytes() - tickets_before;
        let stats = cleanup_stats();
        let (never, twice) = (drops.never(), drops.more_than_once());
        let (on_driver, by_reaper, elsewhere) = (
            ON_DRIVER.load(Ordering::SeqCst),
            ON_REAPER.load(Ordering::SeqCst) - by_reaper_before,
            ELSEWHERE.load(Ordering::SeqCst),
        );
        println!(
            "{TOTAL} launches ({THREADS} threads × {PER_THREAD}, 4 streams, 2 contexts) in \
             {elapsed:?}: {:.0} launches/s; owners lost {never}, dropped twice {twice}, dropped \
             on a driver thread {on_driver}, by the reaper {by_reaper}, elsewhere {elsewhere}; \
             heap {heap_before} B before, {heap_after} B after ({:+} B; the tickets \
             {tickets_grew:+} B); {stats:?}",
            TOTAL as f64 / elapsed.as_secs_f64(),
            heap_after as i64 - heap_before as i64,
        );
        assert_eq!(RAN.load(Ordering::SeqCst), TOTAL as u64, "host functions that ran");
        assert_eq!((never, twice), (0, 0), "owners lost, dropped twice");
        assert_eq!(MISCLASSIFIED.load(Ordering::SeqCst), 0, "driver threads not recognised");
        assert_eq!(on_driver, 0, "owners dropped on a driver thread");
        assert_eq!((by_reaper, elsewhere), (TOTAL as u64, 0), "owners dropped by the reaper");
        assert_eq!(stats.queued - stats_before.queued, TOTAL as u64);
        assert_eq!(stats.queued, stats.released);
        assert_eq!(pending_launches(None), 0);
        assert_eq!(fake().pending_host_functions(ptr::null_mut()), 0);
        assert_eq!(fake().driver_thread_call_count(""), 0, "CUDA calls on a driver thread");
        let grown = LiveObjects::of(fake()).grown_since(&live_before);
        assert!(grown.is_empty(), "driver objects left behind: {grown:?}");
        streams.destroy();
    }
}
