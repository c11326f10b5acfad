//! The copy functions: host to device, device to host, device to device, unified (`cuMemcpy`,
//! the direction told by the addresses) and between contexts (`cuMemcpyPeer`), each synchronous
//! (`_v2`, per-thread `_v2_ptds`) and `Async` (per-thread `_ptsz`). How they are ordered, when
//! they wait and what they read at once: `memory_op.rs`.
//!
//! An address the function's name says is device memory must lie in device or page-locked memory
//! (`CUDA_ERROR_INVALID_VALUE` otherwise, as for one freed already); any address that starts in an
//! allocation must not run past its end; a null address is `CUDA_ERROR_INVALID_VALUE`. A copy of 0
//! bytes does nothing.

use std::ffi::{c_uint, c_void};

use cuda_dl_sys::types::{CUarray, CUcontext, CUdeviceptr, CUstream};

use crate::context::check_context;
use crate::errors::{NOT_SUPPORTED, Res};
use crate::memory_op::{Call, copy, device, host, unified};
use crate::state::lock;

stream_export!("cuMemcpyHtoD", cuMemcpyHtoD_v2 / cuMemcpyHtoD_v2_ptds => memcpy_htod(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize));
unsafe fn memcpy_htod(dst: CUdeviceptr, src: *const c_void, n: usize, per_thread: bool) -> Res {
    copy(Call::Sync, per_thread, device(dst), host(src), n)
}

/// The ABI 2000 variant (32-bit device pointer and size), which has no per-thread twin: the
/// fake's one symbol whose variants are partly per-thread, as on the real driver, for
/// `cuGetProcAddress`'s per-thread answers.
unsafe fn memcpy_htod_v1(dst: c_uint, src: *const c_void, n: c_uint) -> Res {
    // SAFETY: as the caller's contract for the 64-bit variant, which this one widens into.
    unsafe { memcpy_htod(CUdeviceptr::from(dst), src, n as usize, false) }
}
export!("cuMemcpyHtoD", cuMemcpyHtoD => memcpy_htod_v1(dstDevice: c_uint, srcHost: *const c_void, ByteCount: c_uint));

stream_export!("cuMemcpyDtoH", cuMemcpyDtoH_v2 / cuMemcpyDtoH_v2_ptds => memcpy_dtoh(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize));
unsafe fn memcpy_dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize, per_thread: bool) -> Res {
    copy(Call::Sync, per_thread, host(dst), device(src), n)
}

stream_export!("cuMemcpyDtoD", cuMemcpyDtoD_v2 / cuMemcpyDtoD_v2_ptds => memcpy_dtod(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize));
unsafe fn memcpy_dtod(dst: CUdeviceptr, src: CUdeviceptr, n: usize, per_thread: bool) -> Res {
    copy(Call::Sync, per_thread, device(dst), device(src), n)
}

stream_export!("cuMemcpy", cuMemcpy / cuMemcpy_ptds => memcpy(dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize));
unsafe fn memcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize, per_thread: bool) -> Res {
    copy(Call::Sync, per_thread, unified(dst), unified(src), n)
}

stream_export!("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2 / cuMemcpyHtoDAsync_v2_ptsz => memcpy_htod_async(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize, hStream: CUstream));
unsafe fn memcpy_htod_async(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
    per_thread: bool,
) -> Res {
    copy(Call::Async(stream), per_thread, device(dst), host(src), n)
}

stream_export!("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2 / cuMemcpyDtoHAsync_v2_ptsz => memcpy_dtoh_async(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream));
unsafe fn memcpy_dtoh_async(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
    per_thread: bool,
) -> Res {
    copy(Call::Async(stream), per_thread, host(dst), device(src), n)
}

stream_export!("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2 / cuMemcpyDtoDAsync_v2_ptsz => memcpy_dtod_async(dstDevice: CUdeviceptr, srcDevice: CUdeviceptr, ByteCount: usize, hStream: CUstream));
unsafe fn memcpy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
    per_thread: bool,
) -> Res {
    copy(Call::Async(stream), per_thread, device(dst), device(src), n)
}

stream_export!("cuMemcpyAsync", cuMemcpyAsync / cuMemcpyAsync_ptsz => memcpy_async(dst: CUdeviceptr, src: CUdeviceptr, ByteCount: usize, hStream: CUstream));
unsafe fn memcpy_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
    per_thread: bool,
) -> Res {
    copy(
        Call::Async(stream),
        per_thread,
        unified(dst),
        unified(src),
        n,
    )
}

/// `Ok` if both contexts are live (`CUDA_ERROR_INVALID_CONTEXT` otherwise). Every context of the
/// fake shares one address space, so the copy is then a device-to-device one.
fn check_peers(dst: CUcontext, src: CUcontext) -> Res {
    let st = lock();
    check_context(&st, dst.addr())?;
    check_context(&st, src.addr())?;
    Ok(())
}

stream_export!("cuMemcpyPeer", cuMemcpyPeer / cuMemcpyPeer_ptds => memcpy_peer(dstDevice: CUdeviceptr, dstContext: CUcontext, srcDevice: CUdeviceptr, srcContext: CUcontext, ByteCount: usize));
unsafe fn memcpy_peer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    per_thread: bool,
) -> Res {
    check_peers(dst_ctx, src_ctx)?;
    copy(Call::Sync, per_thread, device(dst), device(src), n)
}

stream_export!("cuMemcpyPeerAsync", cuMemcpyPeerAsync / cuMemcpyPeerAsync_ptsz => memcpy_peer_async(dstDevice: CUdeviceptr, dstContext: CUcontext, srcDevice: CUdeviceptr, srcContext: CUcontext, ByteCount: usize, hStream: CUstream));
unsafe fn memcpy_peer_async(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    n: usize,
    stream: CUstream,
    per_thread: bool,
) -> Res {
    check_peers(dst_ctx, src_ctx)?;
    copy(Call::Async(stream), per_thread, device(dst), device(src), n)
}

/// `cuMemcpyAtoA`: arrays are not modelled (every call answers `CUDA_ERROR_NOT_SUPPORTED`). Its
/// three exports exist for how the driver's symbols are found: the ABI 2000 variant, like the real
/// driver's, has no per-thread twin while the 3020 one has.
unsafe fn memcpy_atoa(
    _dst: CUarray,
    _dst_offset: usize,
    _src: CUarray,
    _src_offset: usize,
    _n: usize,
) -> Res {
    Err(NOT_SUPPORTED)
}
export!("cuMemcpyAtoA", cuMemcpyAtoA_v2 => memcpy_atoa(dstArray: CUarray, dstOffset: usize, srcArray: CUarray, srcOffset: usize, ByteCount: usize));
export!("cuMemcpyAtoA", cuMemcpyAtoA_v2_ptds => memcpy_atoa(dstArray: CUarray, dstOffset: usize, srcArray: CUarray, srcOffset: usize, ByteCount: usize));

/// `cuMemcpyAtoA`'s ABI 2000 variant (32-bit offsets and size).
unsafe fn memcpy_atoa_v1(
    dst: CUarray,
    dst_offset: c_uint,
    src: CUarray,
    src_offset: c_uint,
    n: c_uint,
) -> Res {
    // SAFETY: no memory is touched.
    unsafe {
        memcpy_atoa(
            dst,
            dst_offset as usize,
            src,
            src_offset as usize,
            n as usize,
        )
    }
}
export!("cuMemcpyAtoA", cuMemcpyAtoA => memcpy_atoa_v1(dstArray: CUarray, dstOffset: c_uint, srcArray: CUarray, srcOffset: c_uint, ByteCount: c_uint));
