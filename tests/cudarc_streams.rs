//! cudarc's streams as launch targets (feature `cudarc`), on the fake driver: cudarc opens
//! `libcuda.so` by name, so each test runs in a process of its own whose loader path starts with
//! a folder where `libcuda.so` is the fake; `cuda-dl-sys` opens the same file, so both bindings share
//! one fake driver, as they would share the real one.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cuda_dl_sys::types::{CUcontext, CUstream};
use cuda_host_launch::{AsRawStream, flush, host_launch, pending_launches};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{fake, fake_driver_path};
use cudarc::driver::CudaContext;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode_enum};

const PATIENCE: Duration = Duration::from_secs(5);

/// A folder holding `libcuda.so` (the name cudarc opens first), a link to the fake driver.
fn fake_libcuda_folder() -> PathBuf {
    let fake = fake_driver_path();
    let folder = fake
        .parent()
        .expect("the fake driver's folder")
        .join("fake-libcuda");
    std::fs::create_dir_all(&folder).expect("create the fake libcuda folder");
    // Tests run in parallel: each makes its own link and renames it into place (atomic).
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let own = folder.join(format!(
        "libcuda.so.{}.{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&own);
    std::os::unix::fs::symlink(&fake, &own).expect("link to the fake driver");
    std::fs::rename(&own, folder.join("libcuda.so")).expect("put libcuda.so in place");
    folder
}

/// An owner that records the name of the thread that dropped it.
struct NamedDrop(Arc<std::sync::Mutex<Vec<String>>>);

impl Drop for NamedDrop {
    fn drop(&mut self) {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.0.lock().unwrap().push(name);
    }
}

isolated_test! {
    /// A closure launched on a cudarc stream runs, its owner is dropped once, by the reaper, and
    /// the launch is counted in the context cudarc made the stream in.
    fn a_launch_on_a_cudarc_stream_runs_and_is_released_by_the_reaper(
        LD_LIBRARY_PATH = fake_libcuda_folder(),
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = CudaContext::new(0).unwrap();
        let stream = context.new_stream().unwrap();
        let cu_context = context.cu_ctx() as CUcontext;
        assert_eq!(stream.as_raw_stream(), stream.cu_stream() as CUstream);
        assert_eq!(stream.context_hint(), Some(cu_context));

        let held = fake()
            .hold_stream(stream.as_raw_stream())
            .expect("the fake could not hold the stream");
        let dropped_by = Arc::new(std::sync::Mutex::new(Vec::new()));
        let owner = NamedDrop(Arc::clone(&dropped_by));
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        host_launch(&stream, move || {
            let _keep = &owner;
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        assert_eq!(pending_launches(Some(cu_context)), 1, "counted in cudarc's context");
        held.release();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(
            *dropped_by.lock().unwrap(),
            ["cuda-hl-reaper"],
            "dropped once, by the reaper"
        );
        assert_eq!(pending_launches(Some(cu_context)), 0);
        context.check_err().unwrap();
    }

    /// cudarc's default stream (handle 0) is the legacy default stream, which cudarc's own calls
    /// use, and claims no context (a special handle names the current context's stream); its
    /// per-thread stream stays the per-thread handle. An `Arc` of a stream is a stream too.
    fn cudarcs_special_streams_map_to_the_drivers_special_handles(
        LD_LIBRARY_PATH = fake_libcuda_folder(),
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = CudaContext::new(0).unwrap();
        let default = context.default_stream();
        assert_eq!(default.as_raw_stream(), cuda_dl_sys::CU_STREAM_LEGACY);
        assert_eq!(default.context_hint(), None);
        let per_thread = context.per_thread_stream();
        assert_eq!(per_thread.as_raw_stream(), cuda_dl_sys::CU_STREAM_PER_THREAD);
        assert_eq!(per_thread.context_hint(), None);

        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        host_launch(&default, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        default.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        context.check_err().unwrap();
    }

    /// cudarc's safe `begin_capture`, called by another thread between the launch's capture query
    /// and its launch (a fake-driver hook inside `cuLaunchHostFunc`), makes the run-once launch a
    /// node of cudarc's graph: the graph's first replay runs it, its owner is dropped once, after
    /// that run, and later replays touch nothing of the released launch.
    fn cudarcs_begin_capture_racing_a_launch_leaves_it_sound(
        LD_LIBRARY_PATH = fake_libcuda_folder(),
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = CudaContext::new(0).unwrap();
        let stream = context.new_stream().unwrap();
        let capturer = Arc::clone(&stream);
        fake().set_hook("cuLaunchHostFunc", 1, move || {
            let capturer = Arc::clone(&capturer);
            std::thread::spawn(move || {
                capturer
                    .begin_capture(CUstreamCaptureMode_enum::CU_STREAM_CAPTURE_MODE_RELAXED)
                    .unwrap();
            })
            .join()
            .unwrap();
        });
        let dropped_by = Arc::new(std::sync::Mutex::new(Vec::new()));
        let owner = NamedDrop(Arc::clone(&dropped_by));
        let ran = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&ran);
        let dropped = Arc::clone(&dropped_by);
        let ran_after_drop = Arc::new(AtomicUsize::new(0));
        let late = Arc::clone(&ran_after_drop);
        host_launch(&stream, move || {
            let _keep = &owner;
            if !dropped.lock().unwrap().is_empty() {
                late.fetch_add(1, Ordering::SeqCst);
            }
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        let graph = stream
            .end_capture(CUgraphInstantiate_flags(0))
            .unwrap()
            .expect("the capture took the launch");
        for _ in 0..3 {
            graph.launch().unwrap();
            stream.synchronize().unwrap();
            flush(PATIENCE).unwrap();
        }
        assert_eq!(ran.load(Ordering::SeqCst), 1, "a run-once launch ran once");
        assert_eq!(ran_after_drop.load(Ordering::SeqCst), 0);
        assert_eq!(*dropped_by.lock().unwrap(), ["cuda-hl-reaper"]);
        drop(graph);
        context.check_err().unwrap();
    }
}
