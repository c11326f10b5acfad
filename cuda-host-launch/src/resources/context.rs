//! A device's primary context, retained for as long as this value lives.

use std::ptr;
use std::sync::Arc;

use std::sync::atomic::{AtomicPtr, Ordering};

use cuda_dl_sys::types::{CUcontext, CUctx_st, CUdevice};

use super::device::Device;
use crate::reaper::defer_drop::defer_drop;
use crate::support::error::Error;
use crate::support::pushed_context::with_pushed;
use crate::transport::primary_release::{self, reset_function};

/// A retained primary context (`cuDevicePrimaryCtxRetain`), released on drop.
///
/// Streams and events hold an `Arc` of their context so it outlives them.
#[derive(Debug)]
pub struct PrimaryContext {
    device: Device,
    /// The current handle: a reset destroys the context, and the next activation makes a new one.
    raw: AtomicPtr<CUctx_st>,
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
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn retain(device: Device) -> Result<Arc<PrimaryContext>, Error> {
        crate::support::host_thread::refuse_inside_host_function("PrimaryContext::retain")?;
        let driver = cuda_dl_sys::driver()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid place to write a context handle; `device` came from the driver.
        unsafe { driver.cuDevicePrimaryCtxRetain(&mut raw, device.raw())? };
        primary_release::remember(raw.addr(), device.raw());
        Ok(Arc::new(PrimaryContext {
            device,
            raw: AtomicPtr::new(raw),
        }))
    }

    /// Makes this the calling thread's current context (`cuCtxSetCurrent`), as the special streams
    /// ([`RawStream::LEGACY`](crate::RawStream::LEGACY), ...) and raw `cuda-dl-sys` calls need.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn set_current(&self) -> Result<(), Error> {
        crate::support::host_thread::refuse_inside_host_function("PrimaryContext::set_current")?;
        let driver = cuda_dl_sys::driver()?;
        // SAFETY: `raw` is a retained, live context.
        unsafe { driver.cuCtxSetCurrent(self.raw())? };
        Ok(())
    }

    /// Waits until all work of the context has completed (`cuCtxSynchronize`), its pending host
    /// functions included.
    ///
    /// # Errors
    /// [`Error::Cuda`], e.g. a sticky error such as `CUDA_ERROR_LAUNCH_FAILED` (719).
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn synchronize(&self) -> Result<(), Error> {
        crate::support::host_thread::refuse_inside_host_function("PrimaryContext::synchronize")?;
        self.scoped(|driver| {
            // SAFETY: a context is current (pushed by `scoped`).
            unsafe { driver.cuCtxSynchronize()? };
            Ok(())
        })
    }

    /// Resets the device's primary context (`cuDevicePrimaryCtxReset`): every allocation, module,
    /// stream and event of it is destroyed, and a sticky error (719) is cleared. Pending host
    /// functions that will now never run (after a sticky error) have their owners released through
    /// the cleanup queue; returns how many this call released. The context stays retained and can
    /// be used again.
    ///
    /// Once the driver's reset has returned, any reclaim of this crate may take the reset
    /// context's work, not only this call's: the watcher giving back its own retain of the
    /// context at that moment releases some of it itself (each launch is released once, by
    /// whichever comes first), and the count here leaves those out. When this returns, none of
    /// the reset context's launches is pending ([`pending_launches`](Self::pending_launches)).
    ///
    /// The reset destroys the context (its old handle is dead: `CUDA_ERROR_CONTEXT_IS_DESTROYED`,
    /// `tools/probes/reset_and_register.out`). The calling thread's current context, if it was the
    /// old one, is cleared, and this value takes the re-activated context's handle, where the
    /// driver allows: after a sticky error a 13.0 driver refuses to re-create the primary context
    /// (`CUDA_ERROR_LAUNCH_FAILED`), so the process must be restarted to use the GPU again; the
    /// reclaim has happened either way.
    ///
    /// # Safety
    /// The reset destroys what every user of the device's primary context holds, in this crate and
    /// in any other binding, so the caller must make sure that nothing uses any of it again:
    /// - every [`Stream`](crate::Stream) and [`Event`](crate::Event) made in this context has been
    ///   dropped (dropping one later would destroy a dead handle, which the driver may have reused
    ///   for another object);
    /// - no other thread uses the context or anything made in it while the reset runs, and nothing
    ///   made in it before the reset (streams, events, memory, modules, graphs executable in it,
    ///   through any binding) is used after it;
    /// - no other [`PrimaryContext`] of the same device (another retain, here or in another
    ///   binding) is used to reach the old context's objects.
    ///
    /// The reclaim after the reset takes only the work of the context that was reset (it tells
    /// contexts apart by their `cuCtxGetId`, CUDA 12.0): work another thread enqueues into the
    /// context made again after the reset, even before this call returns, is left alone. Launches
    /// of this crate that race the reset are released exactly once whatever happens (a reclaim
    /// never takes a launch whose launch call has not returned), but a launch the driver accepted
    /// just before the reset may then never be released, if the reset discards it. The
    /// watcher queries nothing while the reset runs, but a [`spawn_after`](crate::spawn_after)
    /// callback whose stream got there just before may still be running on the reaper, and finds
    /// the context gone if it calls CUDA.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the reset fails (nothing is reclaimed then).
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub unsafe fn reset(&self) -> Result<usize, Error> {
        crate::support::host_thread::refuse_inside_host_function("PrimaryContext::reset")?;
        let driver = cuda_dl_sys::driver()?;
        let old = self.raw();
        let reset = reset_function(driver)?;
        let device = self.device.raw();
        let run_reset = || -> Result<(), cuda_dl_sys::Error> {
            // SAFETY: a valid device handle. An error names the variant called.
            Ok(unsafe { reset.call((device,)) }?)
        };
        // The watcher queries nothing while the reset runs, and never an event of the old
        // context after it (the reset destroys them): their entries stay pending, for the
        // reclaim. A failed reset forgets and reclaims nothing.
        // SAFETY: `run_reset` resets the device's primary context `old`, after which the driver
        // runs none of its pending host functions (it ran them first, or discards them after a
        // sticky error).
        let reclaimed =
            unsafe { crate::transport::reset_and_reclaim(driver, device, old.addr(), run_reset) }?;
        // If the old context is this thread's current one, take it off: the driver reports its
        // sticky error (719) to every later call of the thread, the retain below included. (After
        // a sticky error, cuCtxGetCurrent itself may fail that way: then the current context is a
        // dead one too.)
        let mut current = ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let query = unsafe { driver.cuCtxGetCurrent(&mut current) };
        if query.is_err() || current == old {
            // SAFETY: clearing the current context is always allowed.
            let _ = unsafe { driver.cuCtxSetCurrent(ptr::null_mut()) };
        }
        // The reset kept our retain: re-activate and take the new handle, leaving the count as it
        // was (retain + release). After a sticky error the driver may refuse (a 13.0 driver
        // answers CUDA_ERROR_LAUNCH_FAILED here): the GPU is then unusable in this process,
        // but the reclaim above has already released every pending owner.
        let mut new = ptr::null_mut();
        // SAFETY: a valid device and out-pointer.
        if unsafe { driver.cuDevicePrimaryCtxRetain(&mut new, self.device.raw()) }.is_ok() {
            // SAFETY: we retained just above; our own retain keeps the context alive.
            let _ = unsafe { primary_release::release(driver, self.device.raw()) };
            primary_release::remember(new.addr(), self.device.raw());
            self.raw.store(new, Ordering::Release);
        }
        Ok(reclaimed)
    }

    /// How many launches of this crate into this context wait for their host function.
    pub fn pending_launches(&self) -> usize {
        crate::enqueue::pending::count(Some(self.raw()))
    }

    /// The driver's handle.
    pub fn raw(&self) -> CUcontext {
        self.raw.load(Ordering::Acquire)
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Runs `f` with this context pushed as the calling thread's current context (a failed pop is
    /// tried once more: [`with_pushed`]). `f`'s error first, then the first pop's.
    pub(crate) fn scoped<R>(
        &self,
        f: impl FnOnce(&cuda_dl_sys::Driver) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let driver = cuda_dl_sys::driver()?;
        // SAFETY: `raw` is a retained, live context. A failed pop is tried once more; the first
        // pop's error is reported.
        let (result, pop) = unsafe { with_pushed(driver, self.raw(), || f(driver)) }?;
        // On a failed pop the value `f` made is dropped here: callers that create driver objects
        // return them as RAII values (a `Stream`, an `Event`), so nothing leaks.
        let value = result?;
        pop?;
        Ok(value)
    }
}

/// The release, as a value that can be deferred off a driver thread.
struct Release(CUdevice, CUcontext);

// SAFETY: a device ordinal and a context handle: tokens the driver accepts from any thread.
unsafe impl Send for Release {}

impl Drop for Release {
    fn drop(&mut self) {
        let Ok(driver) = cuda_dl_sys::driver() else {
            return;
        };
        // SAFETY: the device's primary context was retained once by this value's owner.
        if unsafe { primary_release::release(driver, self.0) } {
            // If it was the last, the context is gone: its pending work will never run. Only the
            // work of contexts that are gone is released, whoever retains the device again.
            crate::transport::reclaim_after_release(driver, self.0, self.1.addr());
        }
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        defer_drop(Release(self.device.raw(), self.raw()));
    }
}
