//! A context made with `cuCtxCreate` (not a device's primary context) and a stream of it, for the
//! tests of what the crate does with such streams.

use cuda_dl_sys::types::{CUcontext, CUstream};
use cuda_host_launch::RawStream;

/// A context of device 0 made with `cuCtxCreate` on the process's driver, and a stream of it; both
/// destroyed on drop. The context is left current on the calling thread (as `cuCtxCreate` makes
/// it).
pub struct CreatedContext {
    /// The context's handle.
    pub context: CUcontext,
    /// The stream's handle.
    pub stream: CUstream,
}

impl CreatedContext {
    /// Makes them.
    ///
    /// # Panics
    /// If the driver cannot be loaded or refuses either.
    pub fn new() -> CreatedContext {
        let driver = cuda_dl_sys::driver().expect("the driver");
        let mut context = std::ptr::null_mut();
        // SAFETY: a valid out-pointer, flags 0, device 0.
        unsafe { driver.cuCtxCreate(&mut context, std::ptr::null_mut(), 0, 0) }
            .expect("cuCtxCreate");
        let mut stream = std::ptr::null_mut();
        // SAFETY: `context` is current (cuCtxCreate makes it so); a valid out-pointer.
        unsafe { driver.cuStreamCreate(&mut stream, 0) }.expect("cuStreamCreate");
        CreatedContext { context, stream }
    }

    /// The stream, for the crate's calls.
    ///
    /// # Safety
    /// Used only while this value lives (its drop destroys the stream).
    pub unsafe fn raw_stream(&self) -> RawStream {
        // SAFETY: the stream lives until this value drops (the caller's promise covers the uses).
        unsafe { RawStream::from_raw(self.stream) }
    }
}

impl Default for CreatedContext {
    fn default() -> Self {
        CreatedContext::new()
    }
}

impl Drop for CreatedContext {
    fn drop(&mut self) {
        let Ok(driver) = cuda_dl_sys::driver() else {
            return;
        };
        // SAFETY: ours, destroyed once each, the stream first.
        unsafe {
            let _ = driver.cuStreamDestroy(self.stream);
            let _ = driver.cuCtxDestroy(self.context);
        }
    }
}
