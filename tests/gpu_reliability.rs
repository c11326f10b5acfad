//! Owners of host functions that will never run, on the real GPU. Opt-in: `--ignored
//! --test-threads=1`, or the bundle of `scripts/gpu-bundle`.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cuda_host_launch::{
    RawStream, Stream, flush, host_launch, launch_host_function, pending_launches, reclaim_pending,
};
use cuda_workspace::gpu::Gpu;
use cuda_workspace::isolated_test;

const N: usize = 1_000;

struct Counted(Arc<AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

unsafe extern "C" fn bump(data: *mut c_void) {
    // SAFETY: `data` points at the AtomicUsize the launch's owner (an Arc) keeps alive.
    unsafe { &*data.cast::<AtomicUsize>() }.fetch_add(1, Ordering::SeqCst);
}

isolated_test! {
    /// In a process of its own: after the trap the driver refuses to re-create the primary
    /// context in this process.
    #[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
    fn after_a_trapping_kernel_every_pending_owner_is_reclaimed_by_the_reset() {
    let gpu = Gpu::open();
    let stream = Stream::new(&gpu.context).unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    gpu.kernels.trap(stream.raw());
    for i in 0..N {
        let owner = Counted(Arc::clone(&dropped));
        if i % 2 == 0 {
            let ran = Arc::clone(&ran);
            host_launch(&stream, move || {
                let _keep = &owner;
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .expect("the driver still accepts launches after the trap");
        } else {
            let data = Arc::as_ptr(&ran).cast_mut().cast();
            // SAFETY: `bump` only touches the counter the owner tuple keeps alive.
            unsafe { launch_host_function(&stream, Some(bump), data, (owner, Arc::clone(&ran))) }
                .expect("accepted");
        }
    }
    let sync = stream.synchronize();
    println!("synchronize after the trap: {sync:?}");
    assert!(sync.is_err(), "the trap is a sticky error");
    std::thread::sleep(Duration::from_millis(200));
    flush(Duration::from_secs(5)).unwrap();
    let pending = gpu.context.pending_launches();
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "no host function runs after a sticky error"
    );
    assert_eq!(dropped.load(Ordering::SeqCst), 0, "nothing released yet");
    assert_eq!(pending, N);
    assert_eq!(pending_launches(None), N);
    drop(stream); // destroying a stream of the dead context: the handle goes away with the reset
    let reclaimed = gpu.context.reset().expect("cuDevicePrimaryCtxReset");
    flush(Duration::from_secs(10)).unwrap();
    println!(
        "{N} host functions launched after a trap: ran {}, pending {pending}; reset reclaimed \
         {reclaimed}; owners dropped {} ({:.0}%)",
        ran.load(Ordering::SeqCst),
        dropped.load(Ordering::SeqCst),
        100.0 * dropped.load(Ordering::SeqCst) as f64 / N as f64
    );
    assert_eq!(reclaimed, N);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        N,
        "every owner dropped, once"
    );
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
    let dropped = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    // SAFETY: `raw_stream` stays valid until cuCtxDestroy, after the launches.
    let stream = unsafe { RawStream::from_raw(raw_stream) };
    for _ in 0..N {
        let owner = Counted(Arc::clone(&dropped));
        let ran = Arc::clone(&ran);
        host_launch(stream, move || {
            let _keep = &owner;
            ran.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
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
        ran.load(Ordering::SeqCst),
        dropped.load(Ordering::SeqCst)
    );
    assert!(
        pending_before > 0,
        "host functions were pending at the destroy"
    );
    assert_eq!(ran.load(Ordering::SeqCst), N, "cuCtxDestroy ran them first");
    assert_eq!(reclaimed, 0);
    assert_eq!(dropped.load(Ordering::SeqCst), N, "each owner dropped once");
    gpu.bind_thread();
}
