//! An event of this crate.

use std::ptr;
use std::sync::Arc;

use cuda_dl_sys::types::{CUevent, CUevent_flags, CUresult};

use super::context::PrimaryContext;
use crate::reaper::defer_drop::defer_drop;
use crate::support::error::Error;
use crate::support::raw_stream::AsRawStream;

/// A CUDA event (`cuEventCreate`, timing disabled), destroyed on drop. Holds its context alive.
#[derive(Debug)]
pub struct Event {
    raw: CUevent,
    context: Arc<PrimaryContext>,
}

// SAFETY: an event handle is an opaque token the driver accepts from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; `&Event` only hands out the token and makes thread-safe driver calls.
unsafe impl Sync for Event {}

impl Event {
    /// A new event of `context`.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn new(context: &Arc<PrimaryContext>) -> Result<Event, Error> {
        crate::support::host_thread::refuse_inside_host_function("Event::new")?;
        // An RAII value inside the scope: if popping the context fails, dropping it destroys the
        // event instead of leaking it.
        context.scoped(|driver| {
            let mut raw = ptr::null_mut();
            // SAFETY: a context is current; `raw` is a valid place to write an event handle.
            unsafe {
                driver.cuEventCreate(&mut raw, CUevent_flags::CU_EVENT_DISABLE_TIMING.0)?;
            }
            Ok(Event {
                raw,
                context: Arc::clone(context),
            })
        })
    }

    /// Records the event on `stream` (`cuEventRecord`).
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn record(&self, stream: impl AsRawStream) -> Result<(), Error> {
        crate::support::host_thread::refuse_inside_host_function("Event::record")?;
        let driver = cuda_dl_sys::driver()?;
        // SAFETY: the event is live; the stream is valid by `AsRawStream`'s contract.
        unsafe { driver.cuEventRecord(self.raw, stream.as_raw_stream())? };
        Ok(())
    }

    /// Makes `stream` wait for this event's last record (`cuStreamWaitEvent`); during a capture this
    /// joins `stream` into the capture.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn make_wait(&self, stream: impl AsRawStream) -> Result<(), Error> {
        crate::support::host_thread::refuse_inside_host_function("Event::make_wait")?;
        let driver = cuda_dl_sys::driver()?;
        // SAFETY: the event is live; the stream is valid by `AsRawStream`'s contract.
        unsafe { driver.cuStreamWaitEvent(stream.as_raw_stream(), self.raw, 0)? };
        Ok(())
    }

    /// Waits until the work before the event's last record has completed.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn synchronize(&self) -> Result<(), Error> {
        crate::support::host_thread::refuse_inside_host_function("Event::synchronize")?;
        let driver = cuda_dl_sys::driver()?;
        // SAFETY: the event is live.
        unsafe { driver.cuEventSynchronize(self.raw)? };
        Ok(())
    }

    /// Whether the work before the event's last record has completed.
    ///
    /// # Errors
    /// [`Error::Cuda`] for any result other than success or `CUDA_ERROR_NOT_READY`.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn is_complete(&self) -> Result<bool, Error> {
        crate::support::host_thread::refuse_inside_host_function("Event::is_complete")?;
        let driver = cuda_dl_sys::driver()?;
        let query = driver.raw().cuEventQuery()?;
        // SAFETY: the event is live.
        let code = unsafe { query(self.raw) };
        if code == CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        driver.check(code, "cuEventQuery")?;
        Ok(true)
    }

    /// The driver's handle.
    pub fn raw(&self) -> CUevent {
        self.raw
    }
}

struct Destroy(CUevent, Arc<PrimaryContext>);

// SAFETY: as for `Event`.
unsafe impl Send for Destroy {}

impl Drop for Destroy {
    fn drop(&mut self) {
        let event = self.0;
        let _ = self.1.scoped(|driver| {
            // SAFETY: the event is live and destroyed once, here.
            unsafe { driver.cuEventDestroy(event)? };
            Ok(())
        });
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        defer_drop(Destroy(self.raw, Arc::clone(&self.context)));
    }
}
