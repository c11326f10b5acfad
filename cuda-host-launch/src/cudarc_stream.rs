//! cudarc's streams as launch targets (feature `cudarc`): `host_launch(&stream, ..)` and every
//! other launch take a `cudarc::driver::CudaStream` (or an `Arc` of one) directly, with no
//! `unsafe` wrapping of its handle.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let context = cudarc::driver::CudaContext::new(0)?;
//! let stream = context.new_stream()?;
//! let buffer = stream.alloc_zeros::<f32>(1 << 20)?;
//! // ... kernels on `stream` that use `buffer` ...
//! // The buffer is the closure's owner: freed once the work before this point has run and the
//! // closure returned, on this crate's thread.
//! cuda_host_launch::host_launch(&stream, move || {
//!     let _owner = &buffer;
//! })?;
//! # Ok(())
//! # }
//! ```
//!
//! cudarc's default stream (`CudaContext::default_stream`, handle `0`) is taken as the legacy
//! default stream (`CU_STREAM_LEGACY`), which is what cudarc's own calls use, whatever default-stream
//! mode `cuda-dl-sys` was loaded with. Its default and per-thread streams name "the stream of the
//! calling thread's current context": bind the stream's context to the launching thread first
//! (`stream.context().bind_to_thread()`), as cudarc does before each of its calls; the launch goes,
//! and is tracked, in whichever context is current.
//!
//! Capture: a cudarc stream may be captured by another thread at any time (cudarc's
//! `CudaStream::begin_capture` is safe). Launches stay sound in that race as on any stream: a
//! run-once launch that a capture took anyway runs on the graph's first replay only, and later
//! replays find it retired and do nothing.

use cuda_dl_sys::types::{CUcontext, CUstream};
use cudarc::driver::CudaStream;

use crate::support::raw_stream::AsRawStream;

// SAFETY: a `CudaStream`'s handle is created by cudarc and destroyed only in its `Drop`, so it is
// valid while the value is borrowed; cudarc's special handles (0, 0x2) map to the driver's special
// handles. The context returned is the one cudarc created the stream in, the stream's true context;
// for the special handles no context is claimed (the launch asks the driver for the current one).
unsafe impl AsRawStream for CudaStream {
    fn as_raw_stream(&self) -> CUstream {
        let handle = self.cu_stream() as CUstream;
        if handle.is_null() {
            cuda_dl_sys::CU_STREAM_LEGACY
        } else {
            handle
        }
    }

    fn context_hint(&self) -> Option<CUcontext> {
        let handle = self.as_raw_stream();
        if handle == cuda_dl_sys::CU_STREAM_LEGACY || handle == cuda_dl_sys::CU_STREAM_PER_THREAD {
            None
        } else {
            Some(self.context().cu_ctx() as CUcontext)
        }
    }
}
