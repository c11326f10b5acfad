//! cudarc and this crate on one stream: a cudarc kernel, then `host_launch` on the same cudarc
//! stream with a cudarc device buffer among the closure's owners. The buffer is freed once the
//! kernel has run, by this crate's reaper thread (never the driver's), and cudarc records no error.
//!
//! `cargo run --example cudarc` on a machine with an NVIDIA driver (cudarc's CUDA 13.0 API, the
//! driver loaded at run time). Without a driver it says so and does nothing: it runs a kernel.

use std::process::ExitCode;
use std::sync::mpsc::channel;
use std::time::Duration;

use cuda_host_launch::{flush, host_launch};
use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let context = CudaContext::new(0)?;
    let stream = context.new_stream()?;
    let module = context.load_module(Ptx::from_src(cuda_workspace::gpu::TEST_KERNELS_PTX))?;
    let copy = module.load_function("copy_u32")?;

    let source = stream.clone_htod(&[42u32])?;
    let mut target = stream.alloc_zeros::<u32>(1)?;
    let mut launch = stream.launch_builder(&copy);
    launch.arg(&source).arg(&mut target);
    // SAFETY: `copy_u32(src, dst)` reads one u32 from `src` and writes one to `dst`; both buffers
    // hold one u32 and live until the kernel has run (`source` through the host launch below).
    unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }?;

    // The kernel's input buffer is released in stream order, after the kernel, off the driver's
    // thread: its `Drop` calls CUDA (cuMemFreeAsync), which a driver thread must not.
    let (report, reports) = channel();
    host_launch(&stream, move || {
        let _ = report.send(format!(
            "host function ran after the kernel on {:?}",
            std::thread::current()
                .name()
                .unwrap_or("the driver's thread")
        ));
        let _keep = &source;
    })?;
    let copied = stream.clone_dtoh(&target)?;
    stream.synchronize()?;
    flush(Duration::from_secs(5))?;
    for line in reports.try_iter() {
        println!("{line}");
    }
    println!("the kernel copied {} (expected 42)", copied[0]);
    context.check_err()?;
    println!("the input buffer was freed by the reaper; cudarc recorded no error");
    Ok(())
}

fn main() -> ExitCode {
    if let Err(e) = cuda_dl_sys::driver() {
        println!("This example runs a kernel, so it needs an NVIDIA driver; none here ({e}).");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cudarc example failed: {e}");
            ExitCode::FAILURE
        }
    }
}
