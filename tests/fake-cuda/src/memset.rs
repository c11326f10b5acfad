//! The set functions: `cuMemsetD8/D16/D32`, synchronous (`_v2`, per-thread `_v2_ptds`) and
//! `Async` (per-thread `_ptsz`). The address must lie in device or page-locked memory, the whole
//! range in one allocation, and be aligned to the value's width (`CUDA_ERROR_INVALID_VALUE`
//! otherwise). How they are ordered and when they wait: `memory_op.rs`.

use std::ffi::{c_uchar, c_uint, c_ushort};

use cuda_dl_sys::types::{CUdeviceptr, CUstream};

use crate::errors::Res;
use crate::memory_op::{Call, set};

stream_export!("cuMemsetD8", cuMemsetD8_v2 / cuMemsetD8_v2_ptds => memset_d8(dstDevice: CUdeviceptr, uc: c_uchar, N: usize));
unsafe fn memset_d8(dst: CUdeviceptr, value: c_uchar, n: usize, per_thread: bool) -> Res {
    set(Call::Sync, per_thread, dst, value.into(), 1, n)
}

stream_export!("cuMemsetD16", cuMemsetD16_v2 / cuMemsetD16_v2_ptds => memset_d16(dstDevice: CUdeviceptr, us: c_ushort, N: usize));
unsafe fn memset_d16(dst: CUdeviceptr, value: c_ushort, n: usize, per_thread: bool) -> Res {
    set(Call::Sync, per_thread, dst, value.into(), 2, n)
}

stream_export!("cuMemsetD32", cuMemsetD32_v2 / cuMemsetD32_v2_ptds => memset_d32(dstDevice: CUdeviceptr, ui: c_uint, N: usize));
unsafe fn memset_d32(dst: CUdeviceptr, value: c_uint, n: usize, per_thread: bool) -> Res {
    set(Call::Sync, per_thread, dst, value, 4, n)
}

stream_export!("cuMemsetD8Async", cuMemsetD8Async / cuMemsetD8Async_ptsz => memset_d8_async(dstDevice: CUdeviceptr, uc: c_uchar, N: usize, hStream: CUstream));
unsafe fn memset_d8_async(
    dst: CUdeviceptr,
    value: c_uchar,
    n: usize,
    stream: CUstream,
    per_thread: bool,
) -> Res {
    set(Call::Async(stream), per_thread, dst, value.into(), 1, n)
}

stream_export!("cuMemsetD16Async", cuMemsetD16Async / cuMemsetD16Async_ptsz => memset_d16_async(dstDevice: CUdeviceptr, us: c_ushort, N: usize, hStream: CUstream));
unsafe fn memset_d16_async(
    dst: CUdeviceptr,
    value: c_ushort,
    n: usize,
    stream: CUstream,
    per_thread: bool,
) -> Res {
    set(Call::Async(stream), per_thread, dst, value.into(), 2, n)
}

stream_export!("cuMemsetD32Async", cuMemsetD32Async / cuMemsetD32Async_ptsz => memset_d32_async(dstDevice: CUdeviceptr, ui: c_uint, N: usize, hStream: CUstream));
unsafe fn memset_d32_async(
    dst: CUdeviceptr,
    value: c_uint,
    n: usize,
    stream: CUstream,
    per_thread: bool,
) -> Res {
    set(Call::Async(stream), per_thread, dst, value, 4, n)
}
