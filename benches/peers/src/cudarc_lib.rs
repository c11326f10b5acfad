//! cudarc 0.19: it has no safe host-function API (its `CudaStream` offers none); its result
//! layer's `launch_host_function` is an `unsafe` wrapper of `cuLaunchHostFunc` through cudarc's
//! own loader, measured with the same static C function as the raw row.

use std::ffi::c_void;

use cudarc::driver::{result, sys};

extern "C" fn noop(_: *mut c_void) {}

/// Checks that cudarc can open the driver: its loader panics when it cannot, so this catches the
/// panic (and keeps its message off stderr) and returns it as the reason.
pub fn available() -> Result<(), String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    // SAFETY: `culib` only opens the library (once per process).
    let outcome = std::panic::catch_unwind(|| unsafe {
        sys::culib();
    });
    std::panic::set_hook(hook);
    outcome.map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        format!("cudarc could not open the driver: {message}")
    })
}

/// Enqueues `n` no-op host functions through cudarc's `result::stream::launch_host_function`.
pub fn host_function_noops(stream: *mut c_void, n: usize) -> Result<(), String> {
    for _ in 0..n {
        // SAFETY: a live stream of the current context; `noop` ignores its argument.
        unsafe {
            result::stream::launch_host_function(
                stream as sys::CUstream,
                noop,
                std::ptr::null_mut(),
            )
        }
        .map_err(|e| format!("cudarc launch_host_function: {e:?}"))?;
    }
    Ok(())
}
