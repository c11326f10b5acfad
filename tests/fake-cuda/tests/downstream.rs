//! What a downstream crate's test looks like: its own host-side code (here a tiny "done flag"
//! that a host function sets when the stream reaches it), tested against the fake driver through
//! `cuda-dl-sys`, steered with `fake_cuda::fixture`. No GPU, no kernels.
//!
//! In your crate: `fake-cuda` and `cuda-dl-sys` in `[dev-dependencies]` (Cargo then builds
//! `libfake_cuda.so` beside your test binaries; `README.md` says how from another repository),
//! and this file as a template. `fixture::lock()` is all the set-up: it loads the fake once for
//! the process, makes the tests that steer it take turns (its faults, hooks and settings are
//! process-wide), and resets what a test steered when the test ends.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{CUresult, CUstream};
use fake_cuda::fixture::{self, ChildTest};
use fake_cuda::steer::Config;

// ---- The code under test: the downstream crate's own (normally in its src/). ----

/// A flag that becomes true once `stream` has done everything enqueued before it.
fn done_flag(driver: &Driver, stream: CUstream) -> Result<Arc<AtomicBool>, cuda_dl_sys::Error> {
    unsafe extern "C" fn set(data: *mut c_void) {
        // SAFETY: `data` is the `Arc::into_raw` below, given to this one call.
        let flag = unsafe { Arc::from_raw(data.cast::<AtomicBool>()) };
        flag.store(true, Ordering::Release);
    }
    let flag = Arc::new(AtomicBool::new(false));
    let data = Arc::into_raw(Arc::clone(&flag)).cast_mut().cast();
    // SAFETY: `set` takes the reference `data` carries; a live stream.
    if let Err(e) = unsafe { driver.cuLaunchHostFunc(stream, Some(set), data) } {
        // The driver will never call `set`: take the reference back.
        // SAFETY: `data` came from `Arc::into_raw` and was not used.
        drop(unsafe { Arc::from_raw(data.cast::<AtomicBool>()) });
        return Err(e.into());
    }
    Ok(flag)
}

// ---- The tests. ----

fn stream(driver: &Driver) -> CUstream {
    let mut stream = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { driver.cuStreamCreate(&mut stream, 0) }.unwrap();
    stream
}

#[test]
fn the_flag_is_set_only_once_the_stream_reaches_it() {
    let fake = fixture::lock();
    let driver = fake.driver();
    fake.primary_context().unwrap();
    let stream = stream(driver);
    // A stand-in for a long kernel: the stream waits until the hold is released.
    let hold = fake.hold_stream(stream).expect("a live stream");
    let flag = done_flag(driver, stream).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(
        !flag.load(Ordering::Acquire),
        "set before the stream got there"
    );
    hold.release();
    // SAFETY: a live stream.
    unsafe { driver.cuStreamSynchronize(stream) }.unwrap();
    assert!(flag.load(Ordering::Acquire));
    assert_eq!(
        Arc::strong_count(&flag),
        1,
        "the host function's reference was leaked"
    );
}

#[test]
fn a_failed_launch_returns_the_error_and_leaks_nothing() {
    let fake = fixture::lock();
    let driver = fake.driver();
    fake.primary_context().unwrap();
    let stream = stream(driver);
    let before = fake.live_objects_now();
    // The next cuLaunchHostFunc (any variant) fails. (Other tests wait for the guard's drop, which
    // removes the fault if this test did not use it.)
    fake.set_fault("cuLaunchHostFunc", 1, CUresult::CUDA_ERROR_OUT_OF_MEMORY.0);
    let error = done_flag(driver, stream).expect_err("the injected fault");
    assert_eq!(error.code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    let flag = done_flag(driver, stream).expect("the fault hit one call only");
    // SAFETY: a live stream.
    unsafe { driver.cuStreamSynchronize(stream) }.unwrap();
    assert!(flag.load(Ordering::Acquire));
    assert_eq!(
        Arc::strong_count(&flag),
        1,
        "the host function's reference was leaked"
    );
    let leaked = fake.live_objects_now().grown_since(&before);
    assert!(leaked.is_empty(), "driver objects leaked: {leaked:?}");
}

/// A program that opens `libcuda.so.1` by name (as cudarc opens `libcuda.so`), in a process of
/// its own whose fake reports CUDA 11.8: `ChildTest` runs this test again as that process.
#[test]
fn a_binding_that_opens_libcuda_by_name_gets_the_fake_configured_by_environment() {
    let config = Config {
        version: Some(11080),
        ..Config::default()
    };
    ChildTest::new("a_binding_that_opens_libcuda_by_name_gets_the_fake_configured_by_environment")
        .config(config)
        .run(|| {
            // What a binding does: dlopen by name, cuInit, cuDriverGetVersion.
            // Kept loaded for the process, as bindings keep the driver (unloaded, its state would
            // look leaked).
            static LIBRARY: std::sync::OnceLock<libloading::Library> = std::sync::OnceLock::new();
            let library = LIBRARY.get_or_init(|| {
                // SAFETY: the library found first on LD_LIBRARY_PATH, the fake.
                unsafe { libloading::Library::new("libcuda.so.1") }.expect("libcuda.so.1")
            });
            type Init = unsafe extern "C" fn(u32) -> CUresult;
            type Version = unsafe extern "C" fn(*mut i32) -> CUresult;
            let mut version = 0;
            // SAFETY: the driver API's signatures; a valid out-pointer.
            unsafe {
                assert_eq!(
                    library.get::<Init>(b"cuInit\0").unwrap()(0),
                    CUresult::CUDA_SUCCESS
                );
                library.get::<Version>(b"cuDriverGetVersion\0").unwrap()(&mut version);
            }
            assert_eq!(version, 11080);
        });
}
