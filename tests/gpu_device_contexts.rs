//! Two GPUs in one process (issue 24): needs a machine with two devices (the `nvidia-h200-x2`
//! kind of the device tool). Opt-in: `--ignored --test-threads=1`, or the bundle of
//! `scripts/gpu-bundle`; on a one-GPU machine these tests fail (run on purpose, they must not skip).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::CUstreamCaptureMode;
use cuda_host_launch::{
    Device, PrimaryContext, Stream, flush, host_launch, launch_host_function, pending_launches,
    release_after,
};
use cuda_workspace::gpu::{Gpu, Kernels, MappedU32s};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{CountedOwner, DropCounts, ThreadSet, thread_id};

const PATIENCE: Duration = Duration::from_secs(120);

/// One device: its primary context and the test kernels loaded in it.
struct OnDevice {
    context: Arc<PrimaryContext>,
    kernels: Kernels,
}

/// Both devices (device 0 through `Gpu::open`, which checks the driver is the real one).
fn device_contexts() -> (Gpu, [OnDevice; 2]) {
    let gpu = Gpu::open();
    let mut count = 0;
    // SAFETY: a valid out-pointer.
    unsafe { gpu.driver.cuDeviceGetCount(&mut count) }.unwrap();
    assert!(
        count >= 2,
        "this test needs two GPUs; the machine has {count}"
    );
    let devices = [0, 1].map(|d| {
        let context = PrimaryContext::retain(Device::get(d).unwrap()).unwrap();
        context.set_current().unwrap();
        let kernels = Kernels::load_current(gpu.driver);
        OnDevice { context, kernels }
    });
    devices[0].context.set_current().unwrap();
    (gpu, devices)
}

static RAN_ON: ThreadSet = ThreadSet::new();
static DROPPED_ON: ThreadSet = ThreadSet::new();

struct Noted(#[allow(dead_code, reason = "dropped for its count")] CountedOwner);

impl Drop for Noted {
    fn drop(&mut self) {
        DROPPED_ON.insert_current();
    }
}

unsafe extern "C" fn note_run(_: *mut std::ffi::c_void) {
    RAN_ON.insert_current();
}

/// `per_device` launches (C functions with owners, closures, releases in turn) from 8 threads
/// with a stream each on each device in `devices`; returns the wall time until all were released.
fn launch_load(
    devices: &[&OnDevice],
    per_device: usize,
    counts: DropCounts,
    first: usize,
) -> Duration {
    const THREADS: usize = 8;
    let per_thread = per_device / THREADS;
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let streams: Vec<Stream> = devices
                    .iter()
                    .map(|d| Stream::new_non_blocking(&d.context).unwrap())
                    .collect();
                for i in 0..per_thread {
                    for (d, stream) in streams.iter().enumerate() {
                        let index = first + (d * THREADS + t) * per_thread + i;
                        let owner = Noted(counts.owner(index));
                        match i % 3 {
                            // SAFETY: `note_run` touches a static set only.
                            0 => unsafe {
                                launch_host_function(
                                    stream,
                                    Some(note_run),
                                    std::ptr::null_mut(),
                                    owner,
                                )
                            }
                            .unwrap(),
                            1 => host_launch(stream, move || {
                                let _keep = &owner;
                                RAN_ON.insert_current();
                            })
                            .unwrap(),
                            _ => release_after(stream, owner).unwrap(),
                        }
                    }
                }
                for stream in &streams {
                    stream.synchronize().unwrap();
                }
            });
        }
    });
    let deadline = Instant::now() + PATIENCE;
    while pending_launches(None) > 0 {
        assert!(Instant::now() < deadline, "launches still pending");
        std::thread::sleep(Duration::from_millis(1));
    }
    flush(PATIENCE).unwrap();
    started.elapsed()
}

isolated_test! {
    /// 1,000,000 launches per device (`TWO_DEVICES_N` overrides) from 8 threads on both devices,
    /// beside the same on device 0 alone in the same process: every owner dropped once, none on a
    /// thread that ran host functions, one driver thread per context.
    #[ignore = "needs two NVIDIA GPUs: run with --ignored"]
    fn a_million_launches_per_device_from_8_threads_on_two_devices() {
        let n: usize = std::env::var("TWO_DEVICES_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000);
        let (_gpu, devices) = device_contexts();
        let counts = DropCounts::new(3 * n);
        let alone = launch_load(&[&devices[0]], n, counts, 0);
        let both = launch_load(&[&devices[0], &devices[1]], n, counts, n);
        println!(
            "{n} launches on device 0 alone: {alone:?} ({:.0}/s); {n} per device on both: {both:?} \
             ({:.0}/s per device)",
            n as f64 / alone.as_secs_f64(),
            n as f64 / both.as_secs_f64()
        );
        assert_eq!((counts.never(), counts.more_than_once()), (0, 0));
        assert!(DROPPED_ON.common(&RAN_ON).is_empty(), "an owner dropped on a driver thread");
        assert_eq!(RAN_ON.ids().len(), 2, "one driver thread per context");
    }

    /// A host function on device 0 owns device 1's memory; the owner's `Drop` frees it (binding
    /// device 1's context, as a binding's buffer does): off the driver's thread, no error.
    #[ignore = "needs two NVIDIA GPUs: run with --ignored"]
    fn an_owner_of_device_1_memory_after_a_host_function_of_device_0() {
        let (gpu, devices) = device_contexts();
        let driver = gpu.driver;
        devices[1].context.set_current().unwrap();
        let mut buffer = 0;
        // SAFETY: a valid out-pointer; device 1's context is current.
        unsafe { driver.cuMemAlloc(&mut buffer, 1 << 20) }.unwrap();
        devices[0].context.set_current().unwrap();
        type Freed = Arc<Mutex<Option<(String, u64)>>>;
        struct Device1Buffer {
            context: Arc<PrimaryContext>,
            buffer: cuda_dl_sys::types::CUdeviceptr,
            freed: Freed,
        }
        impl Drop for Device1Buffer {
            fn drop(&mut self) {
                let driver = cuda_dl_sys::driver().unwrap();
                let result = self.context.set_current().map_err(|e| e.to_string()).and_then(|()| {
                    // SAFETY: device 1's allocation, freed once, its context current.
                    unsafe { driver.cuMemFree(self.buffer) }.map_err(|e| e.to_string())
                });
                *self.freed.lock().unwrap() = Some((format!("{result:?}"), thread_id()));
            }
        }
        let stream = Stream::new_non_blocking(&devices[0].context).unwrap();
        let flag = MappedU32s::new(driver, 1);
        devices[0].kernels.spin_then_write(stream.raw(), flag.device(0), 1, 1_000_000);
        let freed: Freed = Arc::default();
        let owner = Device1Buffer {
            context: Arc::clone(&devices[1].context),
            buffer,
            freed: Arc::clone(&freed),
        };
        let ran = Arc::new(ThreadSet::new());
        let on = Arc::clone(&ran);
        host_launch(&stream, move || {
            let _keep = &owner;
            on.insert_current();
        })
        .unwrap();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        let (result, thread) = freed.lock().unwrap().clone().expect("the owner was dropped");
        assert_eq!(result, "Ok(())");
        assert!(!ran.ids().contains(&thread), "freed on the driver's thread");
    }

    /// A kernel traps on device 1 with launches pending on both devices: device 0's run and are
    /// released throughout; device 1's stay pending until its reset releases each once.
    #[ignore = "needs two NVIDIA GPUs: run with --ignored"]
    fn a_trap_on_device_1_leaves_device_0_untouched() {
        const N: usize = 1_000;
        let (gpu, devices) = device_contexts();
        let streams = [0, 1].map(|d| {
            devices[d].context.set_current().unwrap();
            Stream::new_non_blocking(&devices[d].context).unwrap()
        });
        let flag = MappedU32s::new(gpu.driver, 1);
        devices[0].kernels.spin_then_write(streams[0].raw(), flag.device(0), 1, 50_000_000);
        devices[1].kernels.trap(streams[1].raw());
        let counts = [DropCounts::new(N), DropCounts::new(N)];
        for d in 0..2 {
            for i in 0..N {
                if i % 2 == 0 {
                    let owner = counts[d].owner(i);
                    host_launch(&streams[d], move || {
                        let _keep = &owner;
                    })
                    .unwrap();
                } else {
                    release_after(&streams[d], counts[d].owner(i)).unwrap();
                }
            }
        }
        streams[0].synchronize().unwrap();
        assert!(streams[1].synchronize().is_err(), "the trap is a sticky error");
        let deadline = Instant::now() + PATIENCE;
        while devices[0].context.pending_launches() > 0 {
            assert!(Instant::now() < deadline, "device 0's launches still pending");
            std::thread::sleep(Duration::from_millis(1));
        }
        flush(PATIENCE).unwrap();
        assert_eq!(counts[0].never(), 0, "device 0's owners released");
        assert_eq!(counts[1].never(), N, "device 1's wait for the reset");
        assert_eq!(devices[1].context.pending_launches(), N);
        let [stream0, stream1] = streams;
        drop(stream1);
        // SAFETY: device 1's only stream is dropped; nothing made in its context is used after.
        let reclaimed = unsafe { devices[1].context.reset() }.unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(reclaimed, N);
        assert_eq!((counts[1].never(), counts[1].more_than_once()), (0, 0));
        // Device 0 still works.
        devices[0].context.set_current().unwrap();
        let after = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&after);
        host_launch(&stream0, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        stream0.synchronize().unwrap();
        assert_eq!(after.load(Ordering::SeqCst), 1);
    }
}

#[test]
#[ignore = "needs two NVIDIA GPUs: run with --ignored"]
fn a_global_capture_on_device_0_survives_device_1_releases() {
    let (gpu, devices) = device_contexts();
    let captured = Stream::new_non_blocking(&devices[0].context).unwrap();
    devices[1].context.set_current().unwrap();
    let work = Stream::new_non_blocking(&devices[1].context).unwrap();
    let flags = MappedU32s::new(gpu.driver, 2);
    let counts = DropCounts::new(2_000);
    devices[0].context.set_current().unwrap();
    // SAFETY: a live stream of device 0.
    unsafe {
        gpu.driver.cuStreamBeginCapture(
            captured.raw(),
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        )
    }
    .unwrap();
    devices[0]
        .kernels
        .spin_then_write(captured.raw(), flags.device(0), 1, 1_000);
    for i in 0..1_000 {
        devices[1]
            .kernels
            .spin_then_write(work.raw(), flags.device(1), 1, 1_000);
        let owner = counts.owner(2 * i);
        host_launch(&work, move || {
            let _keep = &owner;
        })
        .unwrap();
        release_after(&work, counts.owner(2 * i + 1)).unwrap();
    }
    work.synchronize().unwrap();
    let deadline = Instant::now() + PATIENCE;
    while pending_launches(None) > 0 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    flush(PATIENCE).unwrap();
    assert_eq!(counts.never(), 0);
    let mut graph = std::ptr::null_mut();
    // SAFETY: the capturing stream; a valid out-pointer.
    let ended = unsafe { gpu.driver.cuStreamEndCapture(captured.raw(), &mut graph) };
    assert!(ended.is_ok(), "the capture on device 0 survived: {ended:?}");
    // SAFETY: the graph the capture made, destroyed once.
    unsafe { gpu.driver.cuGraphDestroy(graph) }.unwrap();
}
