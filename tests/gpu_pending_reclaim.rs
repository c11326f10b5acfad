//! Owners of host functions that will never run, on the real GPU. Opt-in: `--ignored
//! --test-threads=1`, or the bundle of `scripts/gpu-bundle`.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cuda_host_launch::{
    RawStream, Stream, flush, host_launch, launch_host_function, pending_launches, reclaim_pending,
};
use cuda_workspace::gpu::Gpu;
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{CountedOwner, DropCounts, Probe, ThreadSet, bump};

const N: usize = 1_000;

isolated_test! {
    /// In a process of its own: after the trap the driver refuses to re-create the primary
    /// context in this process.
    #[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
    fn after_a_trapping_kernel_every_pending_owner_is_reclaimed_by_the_reset() {
    let gpu = Gpu::open();
    let stream = Stream::new(&gpu.context).unwrap();
    let probe = Probe::new();
    gpu.kernels.trap(stream.raw());
    for i in 0..N {
        if i % 2 == 0 {
            host_launch(&stream, probe.closure())
                .expect("the driver still accepts launches after the trap");
        } else {
            // SAFETY: `bump` only touches the counter the owners keep alive.
            unsafe { launch_host_function(&stream, Some(bump), probe.data(), probe.owners()) }
                .expect("accepted");
        }
    }
    let sync = stream.synchronize();
    println!("synchronize after the trap: {sync:?}");
    assert!(sync.is_err(), "the trap is a sticky error");
    std::thread::sleep(Duration::from_millis(200));
    flush(Duration::from_secs(5)).unwrap();
    let pending = gpu.context.pending_launches();
    assert_eq!(probe.runs(), 0, "no host function runs after a sticky error");
    assert_eq!(probe.drops.dropped(), 0, "nothing released yet");
    assert_eq!(pending, N);
    assert_eq!(pending_launches(None), N);
    drop(stream); // destroying a stream of the dead context: the handle goes away with the reset
    // SAFETY: every stream of the context is dropped, and nothing made in it is used after the reset.
    let reclaimed = unsafe { gpu.context.reset() }.expect("cuDevicePrimaryCtxReset");
    flush(Duration::from_secs(10)).unwrap();
    println!(
        "{N} host functions launched after a trap: ran {}, pending {pending}; reset reclaimed \
         {reclaimed}; owners dropped {} ({:.0}%)",
        probe.runs(),
        probe.drops.dropped(),
        100.0 * probe.drops.dropped() as f64 / N as f64
    );
    assert_eq!(reclaimed, N);
    assert_eq!(probe.drops.dropped(), N, "every owner dropped, once");
    assert_eq!(probe.drops.live(), 0);
    assert_eq!(pending_launches(None), 0);

    // Whether the driver let the context be re-created (the 13.0 driver does not after a trap).
    let mut count = 0;
    // SAFETY: a valid out-pointer; a harmless query.
    let after = unsafe { gpu.driver.cuDeviceGetCount(&mut count) };
    println!("after the reset, cuDeviceGetCount: {after:?}");
}
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_normal_context_destroy_runs_pending_functions_first_and_owners_drop_once() {
    let gpu = Gpu::open();
    let d = gpu.driver;
    let mut device = 0;
    let mut context = ptr::null_mut();
    let mut raw_stream = ptr::null_mut();
    // SAFETY: valid out-pointers; a fresh context, made current, with a stream of its own.
    unsafe {
        d.cuDeviceGet(&mut device, 0).unwrap();
        d.cuCtxCreate(&mut context, ptr::null_mut(), 0, device)
            .unwrap();
        d.cuStreamCreate(&mut raw_stream, 0).unwrap();
    }
    let m = cuda_workspace::gpu::MappedU32s::new(d, 1);
    // A kernel of the new context holds the stream while the host functions queue up behind it.
    let kernels = cuda_workspace::gpu::Kernels::load_current(d);
    kernels.spin_then_write(raw_stream, m.device(0), 1, 100_000_000);
    let probe = Probe::new();
    // SAFETY: `raw_stream` stays valid until cuCtxDestroy, after the launches.
    let stream = unsafe { RawStream::from_raw(raw_stream) };
    for _ in 0..N {
        host_launch(stream, probe.closure()).unwrap();
    }
    let pending_before = pending_launches(Some(context));
    // SAFETY: the context we created; destroyed once (it runs the pending host functions first).
    unsafe { d.cuCtxDestroy(context) }.unwrap();
    // Its host memory went with the context.
    std::mem::forget(m);
    // SAFETY: the context is destroyed and nothing launches into it.
    let reclaimed = unsafe { reclaim_pending(context) };
    flush(Duration::from_secs(10)).unwrap();
    println!(
        "context destroyed with {pending_before} pending: ran {}, reclaimed {reclaimed}, owners \
         dropped {}",
        probe.runs(),
        probe.drops.dropped()
    );
    assert!(
        pending_before > 0,
        "host functions were pending at the destroy"
    );
    assert_eq!(probe.runs(), N, "cuCtxDestroy ran them first");
    assert_eq!(reclaimed, 0);
    assert_eq!(probe.drops.dropped(), N, "each owner dropped once");
    assert_eq!(probe.drops.live(), 0);
    gpu.bind_thread();
}

/// Counts its drop (through the counted owner it holds), and adds its dropping thread to
/// [`DROPPED_ON`].
struct Flagged(#[allow(dead_code, reason = "held for its Drop")] CountedOwner);
impl Drop for Flagged {
    fn drop(&mut self) {
        DROPPED_ON.insert_current();
    }
}

/// The threads that ran the host functions (the driver's) and those that dropped owners: disjoint
/// if no owner was dropped on a driver thread. Found by the test itself, not by asking the library
/// (`in_host_function` is only as right as the library's own marking).
static RAN_ON: ThreadSet = ThreadSet::new();
static DROPPED_ON: ThreadSet = ThreadSet::new();
static RUNS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn count(_: *mut c_void) {
    RAN_ON.insert_current();
    RUNS.fetch_add(1, Ordering::Relaxed);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn sixteen_threads_times_a_million_launches_over_4_streams_and_2_contexts() {
    const THREADS: usize = 16;
    const PER_THREAD: usize = 1_000_000;
    const TOTAL: usize = THREADS * PER_THREAD;
    let gpu = Gpu::open();
    let d = gpu.driver;
    // A second context of our own, with two streams; the primary context gets the other two.
    let mut device = 0;
    let mut second = ptr::null_mut();
    let mut raw = [ptr::null_mut(); 2];
    // SAFETY: valid out-pointers; the context and its streams are destroyed at the end.
    unsafe {
        d.cuDeviceGet(&mut device, 0).unwrap();
        d.cuCtxCreate(&mut second, ptr::null_mut(), 0, device)
            .unwrap();
        d.cuStreamCreate(&mut raw[0], 0).unwrap();
        d.cuStreamCreate(&mut raw[1], 0).unwrap();
    }
    gpu.bind_thread();
    let primary = [
        Stream::new(&gpu.context).unwrap(),
        Stream::new(&gpu.context).unwrap(),
    ];
    let drops = DropCounts::new(TOTAL);
    // Warm up, then measure the heap.
    for s in &primary {
        for _ in 0..20_000 {
            host_launch(s, || {}).unwrap();
        }
        s.synchronize().unwrap();
    }
    flush(Duration::from_secs(30)).unwrap();
    let heap_before = cuda_workspace::gpu::heap_in_use();
    let stats_before = cuda_host_launch::cleanup_stats();
    // SAFETY: the second context's streams live until the context is destroyed, after the scope.
    let second_streams = unsafe { [RawStream::from_raw(raw[0]), RawStream::from_raw(raw[1])] };
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (primary, second_streams) = (&primary, second_streams);
            let gpu = &gpu;
            scope.spawn(move || {
                gpu.bind_thread();
                for i in 0..PER_THREAD {
                    let id = t * PER_THREAD + i;
                    let owner = Flagged(drops.owner(id));
                    match (t + i) % 4 {
                        0 | 1 => {
                            let s = &primary[(t + i) % 2];
                            if i % 2 == 0 {
                                host_launch(s, move || {
                                    let _keep = &owner;
                                    RAN_ON.insert_current();
                                    RUNS.fetch_add(1, Ordering::Relaxed);
                                })
                                .unwrap();
                            } else {
                                // SAFETY: `count` ignores its argument.
                                unsafe {
                                    launch_host_function(s, Some(count), ptr::null_mut(), owner)
                                }
                                .unwrap();
                            }
                        }
                        k => {
                            let s = second_streams[k - 2];
                            // SAFETY: `count` ignores its argument.
                            unsafe { launch_host_function(s, Some(count), ptr::null_mut(), owner) }
                                .unwrap();
                        }
                    }
                }
            });
        }
    });
    let enqueued = started.elapsed();
    for s in &primary {
        s.synchronize().unwrap();
    }
    // SAFETY: the second context's live streams.
    unsafe {
        d.cuStreamSynchronize(raw[0]).unwrap();
        d.cuStreamSynchronize(raw[1]).unwrap();
    }
    let total = started.elapsed();
    flush(Duration::from_secs(60)).unwrap();
    let heap_after = cuda_workspace::gpu::heap_in_use();
    let stats = cuda_host_launch::cleanup_stats();
    let (never, twice) = (drops.never(), drops.more_than_once());
    let (ran_on, dropped_on) = (RAN_ON.ids(), DROPPED_ON.ids());
    let on_driver_threads = RAN_ON.common(&DROPPED_ON);
    println!(
        "{TOTAL} launches from {THREADS} threads over 4 streams in 2 contexts: enqueued in \
         {enqueued:?}, all run in {total:?} ({:.0}/s); ran {}; owners lost {never}, dropped twice \
         {twice}; host functions ran on {} threads, owners dropped on {} threads, on both {}; \
         pending {}; heap in use before {heap_before} B, after {heap_after} B",
        TOTAL as f64 / total.as_secs_f64(),
        RUNS.load(Ordering::Relaxed),
        ran_on.len(),
        dropped_on.len(),
        on_driver_threads.len(),
        pending_launches(None)
    );
    assert_eq!(RUNS.load(Ordering::Relaxed), TOTAL);
    assert_eq!((never, twice), (0, 0));
    assert!(!ran_on.is_empty() && !dropped_on.is_empty());
    assert_eq!(
        on_driver_threads,
        Vec::<u64>::new(),
        "owners dropped on a thread that ran host functions"
    );
    assert_eq!(pending_launches(None), 0);
    // The heap is printed, not checked: what is kept for the most launches pending at once
    // (tickets, record segments) moves with the reaper's lag. The records are counted instead.
    assert_eq!(
        stats.queued - stats_before.queued,
        TOTAL as u64,
        "records queued for release"
    );
    assert_eq!(
        stats.queued, stats.released,
        "records queued and not released"
    );
    // SAFETY: our context; its streams go with it.
    unsafe { d.cuCtxDestroy(second) }.unwrap();
    gpu.bind_thread();
}
