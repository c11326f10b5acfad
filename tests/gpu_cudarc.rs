//! cudarc's streams, kernels and buffers with this crate's launches, on the real GPU. Opt-in:
//! `--ignored --test-threads=1`, or the bundle of `scripts/gpu-bundle`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_dl_sys::types::CUcontext;
use cuda_host_launch::{flush, host_launch, pending_launches};
use cudarc::driver::{CudaContext, CudaSlice, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

/// A cudarc device buffer that records which thread dropped (and so freed) it.
struct Tracked {
    buffer: Option<CudaSlice<u32>>,
    dropped_by: Arc<Mutex<Vec<String>>>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.dropped_by.lock().unwrap().push(name);
        drop(self.buffer.take()); // cudarc frees it here (cuMemFreeAsync on its stream)
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_cudarc_buffer_owned_by_a_host_launch_after_a_cudarc_kernel_is_freed_by_the_reaper() {
    let context = CudaContext::new(0).unwrap();
    let stream = context.new_stream().unwrap();
    let module = context
        .load_module(Ptx::from_src(cuda_workspace::gpu::TEST_KERNELS_PTX))
        .unwrap();
    let copy = module.load_function("copy_u32").unwrap();
    let dropped_by = Arc::new(Mutex::new(Vec::new()));
    let ran = Arc::new(AtomicUsize::new(0));
    for round in 0..100u32 {
        let source = stream.clone_htod(&[round]).unwrap();
        let mut target = stream.alloc_zeros::<u32>(1).unwrap();
        let mut launch = stream.launch_builder(&copy);
        launch.arg(&source).arg(&mut target);
        // SAFETY: `copy_u32(src, dst)` reads one u32 from `src`, writes one to `dst`; both hold one
        // and live until the kernel has run (`source` through the host launch below).
        unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }.unwrap();
        let owner = Tracked {
            buffer: Some(source),
            dropped_by: Arc::clone(&dropped_by),
        };
        let counter = Arc::clone(&ran);
        host_launch(&stream, move || {
            let _keep = &owner;
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        assert_eq!(stream.clone_dtoh(&target).unwrap(), [round]);
    }
    stream.synchronize().unwrap();
    flush(Duration::from_secs(10)).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 100);
    let names = dropped_by.lock().unwrap().clone();
    assert_eq!(names.len(), 100, "each buffer dropped once");
    assert!(
        names.iter().all(|n| n == "cuda-hl-reaper"),
        "every buffer freed by the reaper: {names:?}"
    );
    assert_eq!(pending_launches(Some(context.cu_ctx() as CUcontext)), 0);
    context.check_err().expect("cudarc recorded no error");
}
