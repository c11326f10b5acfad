//! The crate's own threads against the rest of the process, on the real GPU: an owner whose `Drop`
//! frees device memory, released by the reaper while another thread captures a graph in global
//! mode; and a process that exits with such owners queued, pending and being dropped. Opt-in:
//! `--ignored --test-threads=1`, or the bundle of `scripts/gpu-bundle`.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUcontext, CUdeviceptr, CUresult, CUstreamCaptureMode};
use cuda_host_launch::{Graph, Stream, host_launch};
use cuda_workspace::gpu::{Gpu, MappedU32s};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::PATIENCE;

/// Device memory from `cuMemAlloc` whose `Drop` makes its context current (the dropping thread may
/// have none, as the reaper has not) and frees it with `cuMemFree`, then reports the result code,
/// as an owner holding another library's device buffer does.
struct DeviceBuffer {
    context: CUcontext,
    ptr: CUdeviceptr,
    report: Box<dyn Fn(CUresult) + Send>,
}

// SAFETY: a context handle and a device address are plain tokens, usable from any thread.
unsafe impl Send for DeviceBuffer {}

impl DeviceBuffer {
    fn new(gpu: &Gpu, report: impl Fn(CUresult) + Send + 'static) -> DeviceBuffer {
        let mut ptr = 0;
        // SAFETY: a valid out-pointer; the context is current on this thread.
        unsafe { gpu.driver.cuMemAlloc(&mut ptr, 1 << 20) }.expect("cuMemAlloc");
        DeviceBuffer {
            context: gpu.context.raw(),
            ptr,
            report: Box::new(report),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let Some(driver) = cuda_dl_sys::Driver::get() else {
            return;
        };
        let raw = driver.raw();
        let (Ok(set_current), Ok(free)) = (raw.cuCtxSetCurrent(), raw.cuMemFree()) else {
            return;
        };
        // SAFETY: the context the memory was allocated in (alive: the test holds it); memory from
        // cuMemAlloc, freed once.
        let code = unsafe {
            match set_current(self.context) {
                CUresult::CUDA_SUCCESS => free(self.ptr),
                failed => failed,
            }
        };
        (self.report)(code);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn reaper_frees_device_memory_while_another_thread_captures_in_global_mode_and_the_graph_instantiates()
 {
    let gpu = Gpu::open();
    let stream = Stream::new_non_blocking(&gpu.context).unwrap();
    let flags = MappedU32s::new(gpu.driver, 1);
    let (freed_tx, freed) = mpsc::channel();
    // Allocated before the capture begins: cuMemAlloc is potentially unsafe too.
    let buffer = DeviceBuffer::new(&gpu, move |code| {
        let _ = freed_tx.send(code);
    });
    let (began_tx, began) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let graph = std::thread::scope(|scope| {
        let (gpu, flags) = (&gpu, &flags);
        let capturing = scope.spawn(move || {
            gpu.bind_thread();
            let captured = Stream::new_non_blocking(&gpu.context).unwrap();
            // SAFETY: a live stream of ours.
            unsafe {
                gpu.driver.cuStreamBeginCapture(
                    captured.raw(),
                    CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
                )
            }
            .unwrap();
            gpu.kernels
                .spin_then_write(captured.raw(), flags.device(0), 7, 1000);
            began_tx.send(()).unwrap();
            go_rx.recv_timeout(PATIENCE).unwrap();
            let mut raw = std::ptr::null_mut();
            // SAFETY: the stream captures; a valid out-pointer.
            let ended = unsafe { gpu.driver.cuStreamEndCapture(captured.raw(), &mut raw) };
            // SAFETY: on success, the graph the capture made, owned by nobody else.
            ended.map(|()| unsafe { Graph::from_raw(raw) })
        });
        began.recv_timeout(PATIENCE).unwrap();
        // While the capture runs this thread makes no potentially unsafe call: it learns of the
        // drop from the owner's report, not by synchronizing.
        host_launch(&stream, move || {
            let _keep = &buffer;
        })
        .unwrap();
        let code = freed.recv_timeout(PATIENCE).unwrap();
        go.send(()).unwrap();
        let graph = capturing.join().unwrap();
        println!("cuMemFree by the reaper during a global capture: {code:?}; end: {graph:?}");
        assert_eq!(
            code,
            CUresult::CUDA_SUCCESS,
            "cuMemFree in the owner's Drop"
        );
        graph.expect("cuStreamEndCapture after the reaper freed device memory")
    });
    let exec = graph
        .instantiate()
        .expect("the captured graph instantiates");
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(flags.get(0), 7, "the captured kernel ran");
}

/// The exit test's slow owner: dropped (on the reaper) while the process exits.
static SLOW_STARTED: AtomicBool = AtomicBool::new(false);
static SLOW_FINISHED: AtomicBool = AtomicBool::new(false);
/// Its `cuMemFree`'s result code (-1 until it ran).
static SLOW_CODE: AtomicI32 = AtomicI32::new(-1);
/// Other owners dropped so far.
static OTHER_DROPS: AtomicU64 = AtomicU64::new(0);
const SLOW: Duration = Duration::from_millis(200);

/// The exit test's last exit handler (registered before the driver was loaded, so it runs after
/// the driver's teardown): waits for the slow owner's drop, then fails the process if its
/// `cuMemFree` did not succeed (the driver was torn down under it) or if another owner was
/// released while the process exited.
extern "C" fn check_at_the_end_of_exit() {
    if std::env::var_os(cuda_workspace::testing::ISOLATED_TEST_ENV).is_none() {
        return;
    }
    let deadline = Instant::now() + SLOW * 10;
    while !SLOW_FINISHED.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(SLOW / 4);
    let code = SLOW_CODE.load(Ordering::SeqCst);
    let others = OTHER_DROPS.load(Ordering::SeqCst);
    let failure = if code != 0 {
        Some(format!(
            "the owner's cuMemFree during exit returned {code} (-1: never ran)"
        ))
    } else if others != 0 {
        Some(format!(
            "{others} owners were released after the process began to exit"
        ))
    } else {
        None
    };
    if let Some(failure) = failure {
        eprintln!("exit test: {failure}");
        // SAFETY: ends the process at once with a failure status (the parent test reports it).
        unsafe { libc::_exit(3) };
    }
}

isolated_test! {
    /// The process exits while the reaper is inside an owner's `Drop` that frees device memory,
    /// with another such owner queued and one pending behind a running kernel: the drop in
    /// progress completes before the driver is torn down, no other owner is released, and the
    /// process exits cleanly.
    #[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
    fn exit_with_owners_freeing_device_memory_being_dropped_queued_and_pending_is_clean() {
        // SAFETY: an `extern "C" fn()` that reads atomics, prints and `_exit`s.
        assert_eq!(unsafe { libc::atexit(check_at_the_end_of_exit) }, 0);
        let gpu = Gpu::open();
        let stream = Stream::new_non_blocking(&gpu.context).unwrap();
        let slow = SlowDeviceBuffer {
            _buffer: DeviceBuffer::new(&gpu, |code| {
                SLOW_CODE.store(code.0 as i32, Ordering::SeqCst);
                SLOW_FINISHED.store(true, Ordering::SeqCst);
            }),
        };
        host_launch(&stream, move || {
            let _keep = &slow;
        })
        .unwrap();
        let deadline = Instant::now() + PATIENCE;
        while !SLOW_STARTED.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the slow owner was never dropped");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Queued behind it: its host function has run, its owner waits for the reaper.
        let queued = DeviceBuffer::new(&gpu, |_| {
            OTHER_DROPS.fetch_add(1, Ordering::SeqCst);
        });
        let (ran_tx, ran) = mpsc::channel();
        host_launch(&stream, move || {
            let _keep = &queued;
            let _ = ran_tx.send(());
        })
        .unwrap();
        ran.recv_timeout(PATIENCE).unwrap();
        // Pending behind a kernel that runs for a while (a few hundred milliseconds).
        let flags = MappedU32s::new(gpu.driver, 1);
        gpu.kernels
            .spin_then_write(stream.raw(), flags.device(0), 1, 500_000_000);
        let pending = DeviceBuffer::new(&gpu, |_| {
            OTHER_DROPS.fetch_add(1, Ordering::SeqCst);
        });
        host_launch(&stream, move || {
            let _keep = &pending;
        })
        .unwrap();
        // The kernel writes to the flags until the end: never freed.
        std::mem::forget(flags);
        std::mem::forget(stream);
        std::mem::forget(gpu);
        // The test returns; the harness exits the process with all of this under way.
    }
}

/// A device buffer whose `Drop` first marks that it began and takes [`SLOW`], then frees the
/// memory (the field's `Drop`, after this one).
struct SlowDeviceBuffer {
    _buffer: DeviceBuffer,
}

impl Drop for SlowDeviceBuffer {
    fn drop(&mut self) {
        SLOW_STARTED.store(true, Ordering::SeqCst);
        std::thread::sleep(SLOW);
    }
}
