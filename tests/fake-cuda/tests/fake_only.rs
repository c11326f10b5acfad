//! What the fake guarantees beyond the real driver (so not in the conformance suite, where the
//! real driver's answer is undefined or unobservable): stale handles are reported, never used, and
//! a context's driver thread ends with the context. These were `fake_driver_model.rs`'s checks.

use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::types::{CUcontext, CUresult, CUstream};
use fake_cuda::fixture;

fn code(result: Result<(), impl Into<cuda_dl_sys::Error>>) -> Option<CUresult> {
    result.err().and_then(|e| e.into().code())
}

unsafe extern "C" fn bump(data: *mut std::ffi::c_void) {
    // SAFETY: every launch passes a live `AtomicUsize`.
    unsafe { &*data.cast::<AtomicUsize>() }.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn stale_stream_and_context_handles_are_reported_not_used() {
    let fake = fixture::lock();
    let driver = fake.driver();
    let mut context: CUcontext = ptr::null_mut();
    let mut stream: CUstream = ptr::null_mut();
    let count = AtomicUsize::new(0);
    let data = ptr::from_ref(&count).cast_mut().cast();
    // Other contexts' threads (the other test's primary context) stay.
    let before = fake.driver_thread_count();
    // SAFETY: valid out-pointers; `count` outlives the destroy, which runs the host function.
    unsafe {
        driver
            .cuCtxCreate(&mut context, ptr::null_mut(), 0, 0)
            .unwrap();
        driver.cuStreamCreate(&mut stream, 0).unwrap();
        driver.cuLaunchHostFunc(stream, Some(bump), data).unwrap();
        assert_eq!(
            fake.driver_thread_count(),
            before + 1,
            "one driver thread for the context"
        );
        driver.cuCtxDestroy(context).unwrap();
    }
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(
        fake.driver_thread_count(),
        before,
        "the context's thread outlived it"
    );
    // SAFETY: stale handles: the fake reports them without touching anything.
    unsafe {
        assert_eq!(
            code(driver.cuCtxDestroy(context)),
            Some(CUresult::CUDA_ERROR_INVALID_CONTEXT)
        );
        assert_eq!(
            code(driver.cuStreamQuery(stream)),
            Some(CUresult::CUDA_ERROR_INVALID_HANDLE)
        );
    }
}

#[test]
fn a_destroyed_streams_handle_is_reported_while_its_work_still_runs() {
    let fake = fixture::lock();
    let driver = fake.driver();
    let context = fake.primary_context().unwrap();
    let mut stream: CUstream = ptr::null_mut();
    let count = AtomicUsize::new(0);
    let data = ptr::from_ref(&count).cast_mut().cast();
    // SAFETY: a valid out-pointer; `count` outlives the synchronize below.
    unsafe { driver.cuStreamCreate(&mut stream, 0) }.unwrap();
    let hold = fake.hold_stream(stream).expect("a live stream");
    // SAFETY: as above; the destroyed handle is only queried.
    unsafe {
        driver.cuLaunchHostFunc(stream, Some(bump), data).unwrap();
        driver.cuStreamDestroy(stream).unwrap();
        assert_eq!(fake.pending_host_functions(context), 1);
        assert_eq!(
            code(driver.cuStreamQuery(stream)),
            Some(CUresult::CUDA_ERROR_INVALID_HANDLE)
        );
    }
    hold.release();
    // SAFETY: no arguments.
    unsafe { driver.cuCtxSynchronize() }.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(fake.pending_host_functions(context), 0);
}
