//! Accepting any stream handle: this crate's [`Stream`](crate::Stream), a handle from another binding,
//! or one of the special handles.

use cuda_dl_sys::types::{CUcontext, CUstream};

use crate::support::context_key::{ContextKey, key_of};
use crate::support::error::Error;

/// A type that is, or holds, a CUDA stream handle valid for as long as the value is borrowed.
///
/// # Safety
/// `as_raw_stream` must return a handle that is valid (created and not yet destroyed), or one of the
/// special handles (`0`, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`), for as long as `self` lives.
/// Safe launch functions rely on it: a dangling handle would be undefined behaviour in the driver.
pub unsafe trait AsRawStream {
    /// The handle.
    fn as_raw_stream(&self) -> CUstream;

    /// The stream's context, if the implementor knows it without asking the driver (this crate's
    /// [`Stream`](crate::Stream) does). `None` (the default) makes a launch ask the driver
    /// (`cuStreamGetCtx`, or the current context for the special handles). An implementor that
    /// returns `Some` must return the stream's true context.
    fn context_hint(&self) -> Option<cuda_dl_sys::types::CUcontext> {
        None
    }

    /// The ids the driver gave the stream and its context ([`StreamIds`]), if the implementor
    /// knows them without asking the driver (this crate's [`Stream`](crate::Stream) does). `None`
    /// (the default) makes an operation that needs them ask the driver (`cuStreamGetId`,
    /// `cuCtxGetId`). An implementor that returns `Some` must return the stream's true ids, and
    /// [`context_hint`](AsRawStream::context_hint) must then return the stream's context.
    fn ids_hint(&self) -> Option<StreamIds> {
        None
    }
}

/// The ids the driver gave a stream and its context (`cuStreamGetId`, `cuCtxGetId`, CUDA 12.0):
/// unlike their handles, never given to another stream or context in the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamIds {
    /// The stream's `cuStreamGetId`.
    pub stream: u64,
    /// Its context's `cuCtxGetId`.
    pub context: u64,
}

// SAFETY: a reference to a valid stream holder returns that holder's valid handle and context.
unsafe impl<T: AsRawStream + ?Sized> AsRawStream for &T {
    fn as_raw_stream(&self) -> CUstream {
        (**self).as_raw_stream()
    }

    fn context_hint(&self) -> Option<cuda_dl_sys::types::CUcontext> {
        (**self).context_hint()
    }

    fn ids_hint(&self) -> Option<StreamIds> {
        (**self).ids_hint()
    }
}

// SAFETY: an `Arc` keeps its stream holder alive while it is borrowed; handle and context are the
// holder's.
unsafe impl<T: AsRawStream + ?Sized> AsRawStream for std::sync::Arc<T> {
    fn as_raw_stream(&self) -> CUstream {
        (**self).as_raw_stream()
    }

    fn context_hint(&self) -> Option<cuda_dl_sys::types::CUcontext> {
        (**self).context_hint()
    }

    fn ids_hint(&self) -> Option<StreamIds> {
        (**self).ids_hint()
    }
}

/// A stream handle made elsewhere: by `cuda-dl-sys` directly, by another binding (cudarc's
/// `CudaStream::cu_stream()`, cust), or by another language (a PyTorch stream's `cuda_stream`).
///
/// Creating one is `unsafe` (you vouch that the handle stays valid while you use it); using it is
/// then as safe as any stream of this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawStream(CUstream);

// SAFETY: a CUstream handle is an opaque token the driver accepts from any thread; `RawStream` owns
// nothing, and its constructor's contract covers validity.
unsafe impl Send for RawStream {}
// SAFETY: as above; sharing a handle shares nothing but the token.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// The legacy default stream (`CU_STREAM_LEGACY`) of the calling thread's current context.
    pub const LEGACY: RawStream = RawStream(cuda_dl_sys::CU_STREAM_LEGACY);
    /// The calling thread's per-thread default stream (`CU_STREAM_PER_THREAD`) of its current context.
    pub const PER_THREAD: RawStream = RawStream(cuda_dl_sys::CU_STREAM_PER_THREAD);
    /// The null stream `0`: the legacy or the per-thread default stream, as the driver was loaded
    /// ([`cuda_dl_sys::DefaultStream`]).
    pub const DEFAULT: RawStream = RawStream(std::ptr::null_mut());

    /// Wraps a handle made elsewhere.
    ///
    /// # Safety
    /// `stream` must be a valid stream handle (or a special handle) and stay valid for as long as
    /// this `RawStream`, or any copy of it, is used.
    pub const unsafe fn from_raw(stream: CUstream) -> RawStream {
        RawStream(stream)
    }

    /// The handle.
    pub fn raw(self) -> CUstream {
        self.0
    }
}

// SAFETY: the constructor's contract (or the special constants) make the handle valid while used.
unsafe impl AsRawStream for RawStream {
    fn as_raw_stream(&self) -> CUstream {
        self.0
    }
}

/// `context`'s `cuCtxGetId` (CUDA 12.0; `DriverTooOld` before): unlike its handle, never shared
/// with a context made after it was destroyed.
pub(crate) fn context_id(driver: &cuda_dl_sys::Driver, context: CUcontext) -> Result<u64, Error> {
    let get_id = driver.raw().cuCtxGetId()?;
    let mut id = 0;
    // SAFETY: a context handle from the driver; a valid out-pointer.
    let code = unsafe { get_id(context, &mut id) };
    driver.check(code, "cuCtxGetId")?;
    Ok(id)
}

/// Whether `stream` is one of the special handles, which name a stream of the calling thread's
/// current context.
fn is_special(stream: CUstream) -> bool {
    stream.is_null()
        || stream == cuda_dl_sys::CU_STREAM_LEGACY
        || stream == cuda_dl_sys::CU_STREAM_PER_THREAD
}

/// The context an operation on `stream` goes to: the implementor's hint, the current context for
/// the special handles, or `cuStreamGetCtx`.
pub(crate) fn context_of(
    driver: &cuda_dl_sys::Driver,
    stream: CUstream,
    hint: Option<CUcontext>,
) -> Result<CUcontext, Error> {
    if let Some(context) = hint {
        return Ok(context);
    }
    let mut context: CUcontext = std::ptr::null_mut();
    if is_special(stream) {
        // SAFETY: a valid out-pointer.
        unsafe { driver.cuCtxGetCurrent(&mut context)? };
    } else {
        // SAFETY: the stream is valid (the `AsRawStream` guarantee); a valid out-pointer.
        unsafe { driver.cuStreamGetCtx(stream, &mut context)? };
    }
    Ok(context)
}

/// The context an operation on `stream` goes to, as the crate names contexts (handle and id: see
/// `context_key`): from the implementor's hints where it gives them, else asked of the driver.
pub(crate) fn context_key_of(
    driver: &cuda_dl_sys::Driver,
    stream: &(impl AsRawStream + ?Sized),
) -> Result<ContextKey, Error> {
    let hint = stream.context_hint();
    if let (Some(context), Some(ids)) = (hint, stream.ids_hint()) {
        return Ok(ContextKey {
            handle: context.addr(),
            id: ids.context,
        });
    }
    let context = context_of(driver, stream.as_raw_stream(), hint)?;
    key_of(driver, context)
}
