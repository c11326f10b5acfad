//! cuda-host-launch on the real GPU. Opt-in: `cargo test --test gpu_host_launch -- --ignored
//! --test-threads=1`, or the bundle of `scripts/gpu-bundle`. Without a driver every test fails.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUstreamCaptureMode, CUstreamCaptureStatus};
use cuda_host_launch::{
    Error, Event, LaunchError, PanicOrigin, RawStream, Stream, cleanup_stats, flush, host_launch,
    launch_host_function, launch_host_function_with_bytes, launch_ticket_bytes,
    reset_panic_handler, set_panic_handler,
};
use cuda_workspace::gpu::{Gpu, MappedU32s, heap_in_use};
use cuda_workspace::testing::{DropCounts, Drops};

/// About 25 ms of spinning at the H200's ~2 GHz clock.
const SPIN_CYCLES: u64 = 50_000_000;
const FLUSH: Duration = Duration::from_secs(30);

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn the_host_function_runs_after_earlier_work_and_later_work_waits_for_it() {
    let gpu = Gpu::open();
    let stream = Stream::new(&gpu.context).unwrap();
    // 0: written by the spinning kernel; 1: what the host function saw; 2: set by the host function
    // as it returns; 3: copied from 2 by a kernel enqueued after the host function.
    let m = Arc::new(MappedU32s::new(gpu.driver, 4));
    gpu.kernels
        .spin_then_write(stream.raw(), m.device(0), 42, SPIN_CYCLES);
    let seen = Arc::clone(&m);
    let started = Instant::now();
    host_launch(&stream, move || {
        seen.set(1, seen.get(0));
        std::thread::sleep(Duration::from_millis(20));
        seen.set(2, 1);
    })
    .unwrap();
    let enqueue = started.elapsed();
    let kernel_done_at_return = m.get(0);
    gpu.kernels.copy_u32(stream.raw(), m.device(2), m.device(3));
    stream.synchronize().unwrap();
    println!(
        "enqueue returned after {enqueue:?} with the kernel still running: {}; host function saw \
         {}; the kernel after it saw done = {}",
        kernel_done_at_return == 0,
        m.get(1),
        m.get(3)
    );
    assert_eq!(
        kernel_done_at_return, 0,
        "the launch returned before the kernel finished"
    );
    assert_eq!(m.get(1), 42, "the host function ran after the kernel");
    assert_eq!(
        m.get(3),
        1,
        "the kernel after the host function waited for it"
    );
}

static F_THREAD: Mutex<Option<ThreadId>> = Mutex::new(None);

/// Notes its thread, sleeps 10 ms, then sets the `AtomicBool` its user data points at ("returned").
unsafe extern "C" fn record_and_return(returned: *mut c_void) {
    *F_THREAD.lock().unwrap() = Some(std::thread::current().id());
    std::thread::sleep(Duration::from_millis(10));
    // SAFETY: the launch's owners keep the AtomicBool alive until this function has returned.
    unsafe { &*returned.cast::<AtomicBool>() }.store(true, Ordering::SeqCst);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn owners_are_dropped_once_after_the_function_returned_on_neither_the_driver_nor_the_launcher() {
    let gpu = Gpu::open();
    let stream = Stream::new(&gpu.context).unwrap();
    let m = MappedU32s::new(gpu.driver, 1);
    let drops = Drops::new();
    let returned = Arc::new(AtomicBool::new(false));
    gpu.kernels
        .spin_then_write(stream.raw(), m.device(0), 1, SPIN_CYCLES);
    let data = Arc::as_ptr(&returned).cast_mut().cast();
    let owners = (drops.owner_watching(&returned), Arc::clone(&returned));
    // SAFETY: `record_and_return` only sets the AtomicBool, which the owners keep alive, and does
    // not unwind.
    unsafe { launch_host_function(&stream, Some(record_and_return), data, owners) }.unwrap();
    stream.synchronize().unwrap();
    flush(FLUSH).unwrap();
    let launcher = std::thread::current().id();
    let driver_thread = F_THREAD.lock().unwrap().expect("the host function ran");
    let seen = drops.records();
    println!("launcher {launcher:?}, driver thread {driver_thread:?}, drops {seen:?}");
    assert_eq!(seen.len(), 1, "dropped exactly once");
    assert_eq!(
        seen[0].flag,
        Some(true),
        "dropped after the host function returned"
    );
    let dropped_on = &seen[0].thread;
    assert_ne!(
        dropped_on.id, driver_thread,
        "not dropped on the driver's thread"
    );
    assert_ne!(
        dropped_on.id, launcher,
        "not dropped on the launching thread"
    );
    assert!(
        dropped_on.is_reaper(),
        "dropped by the reaper: {dropped_on:?}"
    );
}

static BYTES_SEEN: Mutex<Vec<u8>> = Mutex::new(Vec::new());

unsafe extern "C" fn copy_out_16_bytes(data: *mut c_void) {
    // SAFETY: the launch passes a pointer to its 16-byte copy.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), 16) };
    *BYTES_SEEN.lock().unwrap() = bytes.to_vec();
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn the_bytes_are_copied_so_changing_the_callers_buffer_after_the_launch_changes_nothing() {
    let gpu = Gpu::open();
    let stream = Stream::new(&gpu.context).unwrap();
    let m = MappedU32s::new(gpu.driver, 1);
    gpu.kernels
        .spin_then_write(stream.raw(), m.device(0), 1, SPIN_CYCLES);
    let mut buffer: Vec<u8> = (0..16).collect();
    // SAFETY: `copy_out_16_bytes` reads exactly 16 bytes and does not unwind.
    unsafe { launch_host_function_with_bytes(&stream, Some(copy_out_16_bytes), &buffer) }.unwrap();
    buffer.iter_mut().for_each(|b| *b = 0xEE);
    let still_held = m.get(0) == 0;
    drop(buffer);
    stream.synchronize().unwrap();
    let seen = BYTES_SEEN.lock().unwrap().clone();
    println!("buffer changed while the stream was held: {still_held}; host function saw {seen:?}");
    assert!(still_held);
    assert_eq!(seen, (0..16).collect::<Vec<u8>>());
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_panicking_closure_is_reported_and_later_host_functions_still_run() {
    let gpu = Gpu::open();
    let stream = Stream::new(&gpu.context).unwrap();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&reports);
    set_panic_handler(move |r| sink.lock().unwrap().push((r.origin, r.message.to_string())));
    cuda_workspace::testing::quiet_expected_panics(|m| m == "boom from a host function");
    let ran = Arc::new(AtomicUsize::new(0));
    host_launch(&stream, || panic!("boom from a host function")).unwrap();
    let after = Arc::clone(&ran);
    host_launch(&stream, move || {
        after.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    stream.synchronize().unwrap();
    flush(FLUSH).unwrap();
    reset_panic_handler();
    let reports = reports.lock().unwrap().clone();
    println!(
        "reports: {reports:?}; later host function ran {} time(s)",
        ran.load(Ordering::SeqCst)
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(
        reports,
        vec![(
            PanicOrigin::HostFunction,
            "boom from a host function".to_string()
        )]
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn launches_on_a_capturing_stream_and_a_stream_forked_into_the_capture_are_refused() {
    let gpu = Gpu::open();
    let d = gpu.driver;
    let origin = Stream::new_non_blocking(&gpu.context).unwrap();
    let forked = Stream::new_non_blocking(&gpu.context).unwrap();
    let fork = Event::new(&gpu.context).unwrap();
    let join = Event::new(&gpu.context).unwrap();
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: live stream.
    unsafe { d.cuStreamBeginCapture(origin.raw(), mode) }.unwrap();

    let drops = Drops::new();
    let owner = drops.owner();
    let refused = host_launch(&origin, move || {
        let _keep = &owner;
    });
    assert_eq!(drops.dropped(), 0, "the crate dropped what it refused");
    assert!(
        refused.as_ref().is_err_and(|e| e.is_handed_back()),
        "not handed back"
    );
    // Taken for an `Error` (what `?` does): the owners handed back are dropped here.
    let refused = refused.map_err(LaunchError::into_error);
    assert!(
        matches!(refused, Err(Error::CaptureActive { .. })),
        "{refused:?}"
    );
    assert_eq!(
        drops.dropped(),
        1,
        "the owners handed back outlived the caller's drop"
    );

    fork.record(&origin).unwrap();
    fork.make_wait(&forked).unwrap();
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: live stream, valid out-pointer.
    unsafe { d.cuStreamIsCapturing(forked.raw(), &mut status) }.unwrap();
    assert_eq!(
        status,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );
    let forked_owner = drops.owner();
    let refused_forked = host_launch(&forked, move || {
        let _keep = &forked_owner;
    })
    .map_err(LaunchError::into_error);
    assert!(
        matches!(refused_forked, Err(Error::CaptureActive { .. })),
        "{refused_forked:?}"
    );
    assert_eq!(
        drops.dropped(),
        2,
        "the forked launch's owners, handed back, were dropped by the caller"
    );
    assert_eq!(drops.live(), 0);
    match (&refused, &refused_forked) {
        (
            Err(Error::CaptureActive {
                stream: s0,
                capture_id: c0,
            }),
            Err(Error::CaptureActive {
                stream: s1,
                capture_id: c1,
            }),
        ) => {
            assert_eq!(*s0, origin.raw().addr(), "the origin stream is named");
            assert_eq!(*s1, forked.raw().addr(), "the forked stream is named");
            assert_eq!(c0, c1, "the forked stream is part of the origin's capture");
        }
        other => panic!("expected two CaptureActive errors, got {other:?}"),
    }

    join.record(&forked).unwrap();
    join.make_wait(&origin).unwrap();
    let mut graph = std::ptr::null_mut();
    // SAFETY: live stream, valid out-pointer.
    unsafe { d.cuStreamEndCapture(origin.raw(), &mut graph) }
        .expect("the capture is still valid after the refused launches");
    assert!(!graph.is_null());
    let mut nodes = 0usize;
    // SAFETY: live graph; a null node array asks for the count.
    unsafe { d.cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes) }.unwrap();
    println!("capture ended valid: a graph of {nodes} node(s); both launches refused");
    assert_eq!(
        nodes, 0,
        "neither refused launch left a node (nothing else was captured)"
    );
    // SAFETY: live graph, destroyed once.
    unsafe { d.cuGraphDestroy(graph) }.unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_stream_made_through_cuda_sys_alone_works() {
    let gpu = Gpu::open();
    let d = gpu.driver;
    let mut raw = std::ptr::null_mut();
    // SAFETY: a context is current; valid out-pointer.
    unsafe { d.cuStreamCreate(&mut raw, 0) }.unwrap();
    // SAFETY: `raw` is a live stream until the cuStreamDestroy below, after the last use.
    let stream = unsafe { RawStream::from_raw(raw) };
    let ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    host_launch(stream, move || flag.store(true, Ordering::SeqCst)).unwrap();
    // SAFETY: live stream.
    unsafe { d.cuStreamSynchronize(raw) }.unwrap();
    // SAFETY: live stream, destroyed once.
    unsafe { d.cuStreamDestroy(raw) }.unwrap();
    assert!(ran.load(Ordering::SeqCst));
    // The special handles work too.
    let legacy = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&legacy);
    host_launch(RawStream::LEGACY, move || {
        flag.store(true, Ordering::SeqCst)
    })
    .unwrap();
    // SAFETY: the legacy stream of the current context.
    unsafe { d.cuStreamSynchronize(cuda_dl_sys::CU_STREAM_LEGACY) }.unwrap();
    assert!(legacy.load(Ordering::SeqCst));
}

static MILLION_RAN: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn count_run(_: *mut c_void) {
    MILLION_RAN.fetch_add(1, Ordering::Relaxed);
}

/// 8 threads × 125,000 launches: every host function ran, every owner was dropped exactly once,
/// every record queued for release was released and nothing is pending. The heap is printed, not
/// checked: what is kept for the most launches pending at once (tickets, record segments) moves
/// with the reaper's lag; leaks of records are LeakSanitizer's to find (`scripts/sanitize`).
#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_million_launches_from_8_threads_drop_every_owner_exactly_once_and_release_every_record() {
    const THREADS: usize = 8;
    const TOTAL: usize = 1_000_000;
    let gpu = Gpu::open();
    let drops = DropCounts::new(TOTAL);
    // Warm the allocator and the driver's queues, then measure.
    let warm = Stream::new(&gpu.context).unwrap();
    for _ in 0..10_000 {
        host_launch(&warm, || {}).unwrap();
    }
    warm.synchronize().unwrap();
    flush(FLUSH).unwrap();
    let (heap_before, tickets_before) = (heap_in_use(), launch_ticket_bytes());
    let stats_before = cleanup_stats();
    MILLION_RAN.store(0, Ordering::SeqCst);
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let gpu = &gpu;
            s.spawn(move || {
                gpu.bind_thread();
                let stream = Stream::new(&gpu.context).unwrap();
                for i in (t..TOTAL).step_by(THREADS) {
                    let owner = drops.owner(i);
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
    let elapsed = started.elapsed();
    flush(FLUSH).unwrap();
    let (heap_after, tickets_after) = (heap_in_use(), launch_ticket_bytes());
    let stats = cleanup_stats();
    let (never, twice) = (drops.never(), drops.more_than_once());
    println!(
        "{TOTAL} launches from {THREADS} threads in {elapsed:?} ({:.0}/s); ran {}; owners never \
         dropped {never}, dropped more than once {twice}; heap in use before {heap_before} B, \
         after {heap_after} B; launch tickets {tickets_before} B, then {tickets_after} B",
        TOTAL as f64 / elapsed.as_secs_f64(),
        MILLION_RAN.load(Ordering::SeqCst)
    );
    assert_eq!(MILLION_RAN.load(Ordering::SeqCst), TOTAL as u64);
    assert_eq!((never, twice), (0, 0));
    assert_eq!(
        stats.queued - stats_before.queued,
        TOTAL as u64,
        "records queued for release"
    );
    assert_eq!(
        stats.queued, stats.released,
        "records queued and not released"
    );
    assert_eq!(gpu.context.pending_launches(), 0);
}
