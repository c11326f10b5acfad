//! The stream-ordered allocator: `cuMemAllocAsync` and `cuMemFreeAsync` (per-thread `_ptsz`).
//!
//! An allocation is made at the call (its address is usable in stream order from then on, as on
//! the real driver); its free is queued on the stream and happens when the stream gets there, so
//! the memory stays allocated (and counted by `fake_cuda_live_objects`) until then. A second free
//! of memory whose free is queued, or of memory that is not device memory, is
//! `CUDA_ERROR_INVALID_VALUE`. Either function on a capturing stream is not modelled (the real
//! driver adds memory nodes): `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, and the capture is
//! invalidated.

use cuda_dl_sys::types::{CUdeviceptr, CUstream};

use crate::capture;
use crate::errors::{CAPTURE_UNSUPPORTED, INVALID_VALUE, LAUNCH_FAILED, Res, ensure, result};
use crate::memory::{Kind, allocate, begin_free};
use crate::scheduler::enqueue;
use crate::state::{State, lock};
use crate::stream::resolve;

/// The stream a call works on and its context: live, not capturing, and the context without a
/// sticky error that has surfaced.
fn stream_of(
    st: &mut State,
    handle: CUstream,
    per_thread: bool,
) -> Result<(usize, usize), cuda_dl_sys::types::CUresult> {
    let s = resolve(st, handle, per_thread)?;
    if capture::is_capturing(st, s) {
        capture::invalidate(st, s);
        return Err(CAPTURE_UNSUPPORTED);
    }
    let ctx = st.streams.get(&s).map_or(0, |stream| stream.ctx);
    let refused = st.contexts.get(&ctx).is_some_and(|c| c.refuses_work());
    ensure(!refused, LAUNCH_FAILED)?;
    Ok((s, ctx))
}

stream_export!("cuMemAllocAsync", cuMemAllocAsync / cuMemAllocAsync_ptsz => mem_alloc_async(dptr: *mut CUdeviceptr, bytesize: usize, hStream: CUstream));
unsafe fn mem_alloc_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    handle: CUstream,
    per_thread: bool,
) -> Res {
    ensure(!dptr.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let (_, ctx) = stream_of(&mut st, handle, per_thread)?;
    let addr = allocate(&mut st, ctx, size, Kind::StreamOrdered)?;
    // SAFETY: non-null, and the caller passes a valid place for a device pointer.
    unsafe { dptr.write(addr as CUdeviceptr) };
    Ok(())
}

stream_export!("cuMemFreeAsync", cuMemFreeAsync / cuMemFreeAsync_ptsz => mem_free_async(dptr: CUdeviceptr, hStream: CUstream));
unsafe fn mem_free_async(dptr: CUdeviceptr, handle: CUstream, per_thread: bool) -> Res {
    let mut st = lock();
    let (s, _) = stream_of(&mut st, handle, per_thread)?;
    let addr = dptr as usize;
    begin_free(&mut st, addr)?;
    result(enqueue(&mut st, s, crate::memory_op::free(addr)))
}
