//! What a downstream crate's test looks like: its own host-side code (here a tiny "done flag"
//! that a host function sets when the stream reaches it), tested against the fake driver through
//! `cuda-sys`, steered with `fake_cuda::steer`. No GPU, no kernels.
//!
//! In your crate: `fake-cuda` and `cuda-sys` in `[dev-dependencies]` (Cargo then builds
//! `libfake_cuda.so` beside your test binaries), and this file as a template.

use std::ffi::c_void;
use std::process::Command;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cuda_sys::types::{CUcontext, CUresult, CUstream};
use cuda_sys::{Driver, LoadOptions};
use fake_cuda::steer::{self, Config, FakeCuda};

// ---- The code under test: the downstream crate's own (normally in its src/). ----

/// A flag that becomes true once `stream` has done everything enqueued before it.
fn done_flag(driver: &Driver, stream: CUstream) -> Result<Arc<AtomicBool>, cuda_sys::Error> {
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

/// The fake, loaded once for this test binary, with device 0's primary context current on the
/// calling thread; and a guard that keeps the tests of this binary from running at once (faults
/// and holds are process-wide).
fn setup() -> (&'static Driver, &'static FakeCuda, MutexGuard<'static, ()>) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    static LOADED: OnceLock<(&'static Driver, FakeCuda)> = OnceLock::new();
    let (driver, fake) = LOADED.get_or_init(|| {
        let library = steer::locate().expect("the fake driver");
        // SAFETY: the fake implements the driver's C ABI.
        let driver =
            unsafe { Driver::load(LoadOptions::with_library_path(&library)) }.expect("load");
        (
            driver,
            FakeCuda::open(&library).expect("the fake's control functions"),
        )
    });
    let mut context: CUcontext = ptr::null_mut();
    // SAFETY: valid out-pointers.
    unsafe {
        driver.cuDevicePrimaryCtxRetain(&mut context, 0).unwrap();
        driver.cuCtxSetCurrent(context).unwrap();
    }
    (driver, fake, guard)
}

fn stream(driver: &Driver) -> CUstream {
    let mut stream = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { driver.cuStreamCreate(&mut stream, 0) }.unwrap();
    stream
}

#[test]
fn the_flag_is_set_only_once_the_stream_reaches_it() {
    let (driver, fake, _one) = setup();
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
    let (driver, fake, _one) = setup();
    let stream = stream(driver);
    // The next cuLaunchHostFunc (any variant) on any thread fails: keep it to this test's call.
    fake.set_fault("cuLaunchHostFunc", 1, CUresult::CUDA_ERROR_OUT_OF_MEMORY.0);
    let error = done_flag(driver, stream).expect_err("the injected fault");
    assert_eq!(error.code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    let flag = done_flag(driver, stream).expect("the fault hit one call only");
    // SAFETY: a live stream.
    unsafe { driver.cuStreamSynchronize(stream) }.unwrap();
    assert!(flag.load(Ordering::Acquire));
}

/// The marker that makes this binary, run again as a child, act as a program that opens
/// `libcuda.so.1` by name (as cudarc does).
const CHILD: &str = "DOWNSTREAM_BY_NAME_CHILD";

#[test]
fn a_binding_that_opens_libcuda_by_name_gets_the_fake_configured_by_environment() {
    if std::env::var_os(CHILD).is_some() {
        // The child: what a binding does (dlopen by name, cuInit, cuDriverGetVersion).
        // SAFETY: the library found first on LD_LIBRARY_PATH, the fake.
        let library = unsafe { libloading::Library::new("libcuda.so.1") }.expect("libcuda.so.1");
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
        return;
    }
    let library = steer::locate().unwrap();
    let folder = steer::libcuda_folder(
        &library,
        &std::env::temp_dir().join(format!("fake-libcuda-{}", std::process::id())),
    )
    .unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "a_binding_that_opens_libcuda_by_name_gets_the_fake_configured_by_environment",
            "--exact",
        ])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", &folder);
    Config {
        version: Some(11080),
        ..Config::default()
    }
    .apply(&mut child);
    let out = child.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&folder);
}
