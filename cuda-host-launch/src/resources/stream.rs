//! A stream of this crate.

use std::ptr;
use std::sync::Arc;

use cuda_dl_sys::types::{CUresult, CUstream, CUstream_flags};

use super::context::PrimaryContext;
use crate::reaper::defer_drop::defer_drop;
use crate::support::error::Error;
use crate::support::raw_stream::{AsRawStream, StreamIds};

/// A CUDA stream (`cuStreamCreate`), destroyed on drop. Holds its context alive.
///
/// Destroying a stream with host functions still pending is fine: `cuStreamDestroy` returns at once
/// and the driver still runs them (their owners are released as usual).
#[derive(Debug)]
pub struct Stream {
    raw: CUstream,
    context: Arc<PrimaryContext>,
    /// The driver's ids of the stream and its context (CUDA 12.0; `None` before), read once.
    ids: Option<StreamIds>,
}

// SAFETY: a stream handle is an opaque token the driver accepts from any thread; the driver API is
// thread-safe.
unsafe impl Send for Stream {}
// SAFETY: as above; `&Stream` only hands out the token and makes thread-safe driver calls.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream of `context` that synchronizes with the legacy default stream.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn new(context: &Arc<PrimaryContext>) -> Result<Stream, Error> {
        crate::support::host_thread::refuse_inside_host_function("Stream::new")?;
        Self::with_flags(context, CUstream_flags::CU_STREAM_DEFAULT)
    }

    /// A new stream of `context` that does not synchronize with the legacy default stream.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn new_non_blocking(context: &Arc<PrimaryContext>) -> Result<Stream, Error> {
        crate::support::host_thread::refuse_inside_host_function("Stream::new_non_blocking")?;
        Self::with_flags(context, CUstream_flags::CU_STREAM_NON_BLOCKING)
    }

    fn with_flags(context: &Arc<PrimaryContext>, flags: CUstream_flags) -> Result<Stream, Error> {
        // The stream becomes an RAII value inside the scope, so that if popping the context
        // fails, dropping it destroys the stream instead of leaking it.
        context.scoped(|driver| {
            let mut raw = ptr::null_mut();
            // SAFETY: a context is current; `raw` is a valid place to write a stream handle.
            unsafe { driver.cuStreamCreate(&mut raw, flags.0)? };
            let mut stream = Stream {
                raw,
                context: Arc::clone(context),
                ids: None,
            };
            stream.ids = ids_of(driver, raw, context.raw())?;
            Ok(stream)
        })
    }

    /// Waits until all work enqueued so far, host functions included, has completed.
    ///
    /// # Errors
    /// [`Error::Cuda`], e.g. a sticky error such as `CUDA_ERROR_LAUNCH_FAILED` (719).
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn synchronize(&self) -> Result<(), Error> {
        crate::support::host_thread::refuse_inside_host_function("Stream::synchronize")?;
        let driver = cuda_dl_sys::driver()?;
        // SAFETY: `raw` is a live stream.
        unsafe { driver.cuStreamSynchronize(self.raw)? };
        Ok(())
    }

    /// Whether all work enqueued so far has completed (`cuStreamQuery`).
    ///
    /// # Errors
    /// [`Error::Cuda`] for any result other than success or `CUDA_ERROR_NOT_READY`.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn is_idle(&self) -> Result<bool, Error> {
        crate::support::host_thread::refuse_inside_host_function("Stream::is_idle")?;
        let driver = cuda_dl_sys::driver()?;
        let query = driver.raw().cuStreamQuery()?;
        // SAFETY: `raw` is a live stream.
        let code = unsafe { query(self.raw) };
        if code == CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        driver.check(code, "cuStreamQuery")?;
        Ok(true)
    }

    /// The driver's handle.
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// The stream's context.
    pub fn context(&self) -> &Arc<PrimaryContext> {
        &self.context
    }
}

// SAFETY: the handle is live for as long as the `Stream` is, and was created in `context`.
unsafe impl AsRawStream for Stream {
    fn as_raw_stream(&self) -> CUstream {
        self.raw
    }

    fn context_hint(&self) -> Option<cuda_dl_sys::types::CUcontext> {
        Some(self.context.raw())
    }

    fn ids_hint(&self) -> Option<StreamIds> {
        self.ids
    }
}

/// The ids of a stream just made in `context` (`None` on drivers before 12.0, which have none).
fn ids_of(
    driver: &cuda_dl_sys::Driver,
    stream: CUstream,
    context: cuda_dl_sys::types::CUcontext,
) -> Result<Option<StreamIds>, Error> {
    let too_old = |e: &cuda_dl_sys::Error| {
        matches!(
            e,
            cuda_dl_sys::Error::DriverTooOld { .. } | cuda_dl_sys::Error::SymbolMissing { .. }
        )
    };
    let get_id = match driver.raw().cuStreamGetId() {
        Ok(get_id) => get_id,
        Err(e) if too_old(&e) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if let Err(e) = driver.raw().cuCtxGetId() {
        return if too_old(&e) { Ok(None) } else { Err(e.into()) };
    }
    let mut id = 0;
    // SAFETY: a live stream; a valid out-pointer.
    let code = unsafe { get_id(stream, &mut id) };
    driver.check(code, "cuStreamGetId")?;
    let context_id = crate::support::raw_stream::context_id(driver, context)?;
    Ok(Some(StreamIds {
        stream: id,
        context: context_id,
    }))
}

/// The destruction, as a value that can be deferred off a driver thread.
struct Destroy(CUstream, Arc<PrimaryContext>);

// SAFETY: as for `Stream`.
unsafe impl Send for Destroy {}

impl Drop for Destroy {
    fn drop(&mut self) {
        let stream = self.0;
        let _ = self.1.scoped(|driver| {
            // SAFETY: the stream is live and destroyed once, here.
            unsafe { driver.cuStreamDestroy(stream)? };
            Ok(())
        });
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        defer_drop(Destroy(self.raw, Arc::clone(&self.context)));
    }
}
