//! A device's primary context, retained for as long as this value lives.

use std::ptr;
use std::sync::Arc;

use cuda_sys::types::{CUcontext, CUdevice};

use super::device::Device;
use crate::cleanup::defer_drop;
use crate::error::Error;

/// A retained primary context (`cuDevicePrimaryCtxRetain`), released on drop.
///
/// Streams and events hold an `Arc` of their context so it outlives them.
#[derive(Debug)]
pub struct PrimaryContext {
    device: Device,
    raw: CUcontext,
}

// SAFETY: a context handle is an opaque token the driver accepts from any thread; the driver API is
// thread-safe, and this type has no other state.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above: `&PrimaryContext` only hands out the token and makes thread-safe driver calls.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retains `device`'s primary context.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver cannot be loaded or the call fails.
    pub fn retain(device: Device) -> Result<Arc<PrimaryContext>, Error> {
        let driver = cuda_sys::driver()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid place to write a context handle; `device` came from the driver.
        unsafe { driver.cuDevicePrimaryCtxRetain(&mut raw, device.raw())? };
        Ok(Arc::new(PrimaryContext { device, raw }))
    }

    /// Makes this the calling thread's current context (`cuCtxSetCurrent`), as the special streams
    /// ([`RawStream::LEGACY`](crate::RawStream::LEGACY), ...) and raw `cuda-sys` calls need.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    pub fn set_current(&self) -> Result<(), Error> {
        let driver = cuda_sys::driver()?;
        // SAFETY: `raw` is a retained, live context.
        unsafe { driver.cuCtxSetCurrent(self.raw)? };
        Ok(())
    }

    /// Waits until all work of the context has completed (`cuCtxSynchronize`), its pending host
    /// functions included.
    ///
    /// # Errors
    /// [`Error::Cuda`], e.g. a sticky error such as `CUDA_ERROR_LAUNCH_FAILED` (719).
    pub fn synchronize(&self) -> Result<(), Error> {
        self.scoped(|driver| {
            // SAFETY: a context is current (pushed by `scoped`).
            unsafe { driver.cuCtxSynchronize()? };
            Ok(())
        })
    }

    /// The driver's handle.
    pub fn raw(&self) -> CUcontext {
        self.raw
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Runs `f` with this context pushed as the calling thread's current context.
    pub(crate) fn scoped<R>(
        &self,
        f: impl FnOnce(&cuda_sys::Driver) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let driver = cuda_sys::driver()?;
        // SAFETY: `raw` is a retained, live context.
        unsafe { driver.cuCtxPushCurrent(self.raw)? };
        let result = f(driver);
        let mut popped = ptr::null_mut();
        // SAFETY: we pushed a context just above; `popped` is a valid place to write.
        let pop = unsafe { driver.cuCtxPopCurrent(&mut popped) };
        let value = result?;
        pop?;
        Ok(value)
    }
}

/// The release, as a value that can be deferred off a driver thread.
struct Release(CUdevice);

impl Drop for Release {
    fn drop(&mut self) {
        if let Ok(driver) = cuda_sys::driver() {
            // SAFETY: the device's primary context was retained once by this value's owner.
            let _ = unsafe { driver.cuDevicePrimaryCtxRelease(self.0) };
        }
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        defer_drop(Release(self.device.raw()));
    }
}
