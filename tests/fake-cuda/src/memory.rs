//! Memory: page-locked host memory and "device" memory are both zeroed host memory; a device
//! pointer is the host address. Copies and sets are synchronous.

use std::alloc::Layout;
use std::ffi::{c_uchar, c_uint, c_void};

use cuda_sys::types::{CUarray, CUdeviceptr, CUmodule};

use crate::context::current;
use crate::errors::{INVALID_VALUE, NOT_SUPPORTED, OUT_OF_MEMORY, Res, ensure};
use crate::state::{State, as_ptr, lock};

/// Alignment of every allocation (the real driver's is at least 256 for device memory).
const ALIGN: usize = 256;

fn allocate(st: &mut State, size: usize, host: bool) -> Result<usize, cuda_sys::types::CUresult> {
    ensure(size > 0, INVALID_VALUE)?;
    let layout = Layout::from_size_align(size, ALIGN).map_err(|_| OUT_OF_MEMORY)?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    ensure(!p.is_null(), OUT_OF_MEMORY)?;
    let addr = p.expose_provenance();
    st.allocations.insert(addr, (size, host));
    Ok(addr)
}

fn free(st: &mut State, addr: usize, host: bool) -> Res {
    match st.allocations.get(&addr) {
        Some(&(size, h)) if h == host => {
            st.allocations.remove(&addr);
            let layout = Layout::from_size_align(size, ALIGN).map_err(|_| INVALID_VALUE)?;
            // SAFETY: `addr` came from `alloc_zeroed` with this layout and is freed only once (it
            // has just left the registry).
            unsafe { std::alloc::dealloc(as_ptr(addr), layout) };
            Ok(())
        }
        _ => Err(INVALID_VALUE),
    }
}

/// `Ok` if `[addr, addr + len)` lies inside one allocation.
fn check_range(st: &State, addr: usize, len: usize) -> Res {
    if len == 0 {
        return Ok(());
    }
    let inside = st
        .allocations
        .range(..=addr)
        .next_back()
        .is_some_and(|(start, (size, _))| {
            addr.checked_add(len).is_some_and(|end| end <= start + size)
        });
    ensure(inside, INVALID_VALUE)
}

export!("cuMemHostAlloc", cuMemHostAlloc => mem_host_alloc(pp: *mut *mut c_void, bytesize: usize, Flags: c_uint));
unsafe fn mem_host_alloc(pp: *mut *mut c_void, size: usize, _flags: c_uint) -> Res {
    ensure(!pp.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    current(&st)?;
    let addr = allocate(&mut st, size, true)?;
    // SAFETY: non-null, and the caller passes a valid place for a pointer.
    unsafe { pp.write(as_ptr(addr)) };
    Ok(())
}

export!("cuMemFreeHost", cuMemFreeHost => mem_free_host(p: *mut c_void));
unsafe fn mem_free_host(p: *mut c_void) -> Res {
    free(&mut lock(), p.addr(), true)
}

/// Host ranges registered with `cuMemHostRegister`: start -> (length, the context current at the
/// registration). Like the real driver's, a registration belongs to its context: destroying the
/// context, or the last release or a reset of a primary one, drops it ([`forget_registrations`]).
static REGISTERED: std::sync::Mutex<Registrations> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

type Registrations = std::collections::BTreeMap<usize, (usize, usize)>;

fn registrations() -> std::sync::MutexGuard<'static, Registrations> {
    REGISTERED.lock().unwrap_or_else(|e| e.into_inner())
}

fn registered(p: usize) -> bool {
    registrations()
        .range(..=p)
        .next_back()
        .is_some_and(|(start, (len, _))| p < start + len)
}

/// Whether `[p, p + len)` lies in one range registered in `ctx`.
pub(crate) fn registered_in(ctx: usize, p: usize, len: usize) -> bool {
    registrations()
        .range(..=p)
        .next_back()
        .is_some_and(|(start, (size, owner))| *owner == ctx && p + len <= start + size)
}

/// Drops the registrations made in `ctx` (it is being destroyed or reset).
pub(crate) fn forget_registrations(ctx: usize) {
    registrations().retain(|_, (_, owner)| *owner != ctx);
}

/// Host ranges registered now.
pub(crate) fn registration_count() -> usize {
    registrations().len()
}

export!("cuMemHostRegister", cuMemHostRegister_v2 => mem_host_register(p: *mut c_void, bytesize: usize, Flags: c_uint));
unsafe fn mem_host_register(p: *mut c_void, size: usize, _flags: c_uint) -> Res {
    ensure(!p.is_null() && size > 0, INVALID_VALUE)?;
    let ctx = current(&lock())?;
    let mut map = registrations();
    // (The real driver says CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, 712.)
    ensure(!map.contains_key(&p.addr()), INVALID_VALUE)?;
    map.insert(p.addr(), (size, ctx));
    Ok(())
}

export!("cuMemHostUnregister", cuMemHostUnregister => mem_host_unregister(p: *mut c_void));
unsafe fn mem_host_unregister(p: *mut c_void) -> Res {
    ensure(registrations().remove(&p.addr()).is_some(), INVALID_VALUE)
}

export!("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer_v2 => mem_host_get_device_pointer(pdptr: *mut CUdeviceptr, p: *mut c_void, Flags: c_uint));
unsafe fn mem_host_get_device_pointer(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> Res {
    ensure(!pdptr.is_null() && flags == 0, INVALID_VALUE)?;
    let st = lock();
    let host = st
        .allocations
        .range(..=p.addr())
        .next_back()
        .is_some_and(|(start, (size, host))| *host && p.addr() < start + size);
    ensure(host || registered(p.addr()), INVALID_VALUE)?;
    // SAFETY: non-null, and the caller passes a valid place for a device pointer.
    unsafe { pdptr.write(p.addr() as CUdeviceptr) };
    Ok(())
}

export!("cuMemAlloc", cuMemAlloc_v2 => mem_alloc(dptr: *mut CUdeviceptr, bytesize: usize));
unsafe fn mem_alloc(dptr: *mut CUdeviceptr, size: usize) -> Res {
    ensure(!dptr.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    current(&st)?;
    let addr = allocate(&mut st, size, false)?;
    // SAFETY: non-null, and the caller passes a valid place for a device pointer.
    unsafe { dptr.write(addr as CUdeviceptr) };
    Ok(())
}

export!("cuMemFree", cuMemFree_v2 => mem_free(dptr: CUdeviceptr));
unsafe fn mem_free(dptr: CUdeviceptr) -> Res {
    free(&mut lock(), dptr as usize, false)
}

/// `cuMemcpyHtoD` and its per-thread twin (synchronous either way).
unsafe fn memcpy_htod(dst: CUdeviceptr, src: *const c_void, n: usize) -> Res {
    let st = lock();
    check_range(&st, dst as usize, n)?;
    ensure(n == 0 || !src.is_null(), INVALID_VALUE)?;
    // SAFETY: the destination range lies in a live allocation (checked); the caller passes `n`
    // readable bytes at `src`.
    unsafe { std::ptr::copy(src.cast::<u8>(), as_ptr(dst as usize), n) };
    Ok(())
}
export!("cuMemcpyHtoD", cuMemcpyHtoD_v2 => memcpy_htod(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize));
export!("cuMemcpyHtoD", cuMemcpyHtoD_v2_ptds => memcpy_htod(dstDevice: CUdeviceptr, srcHost: *const c_void, ByteCount: usize));

/// The ABI 2000 variant (32-bit device pointer and size), which has no per-thread twin: the
/// fake's one symbol whose variants are partly per-thread, as on the real driver, for
/// `cuGetProcAddress`'s per-thread answers.
unsafe fn memcpy_htod_v1(dst: c_uint, src: *const c_void, n: c_uint) -> Res {
    // SAFETY: as the caller's contract for the 64-bit variant, which this one widens into.
    unsafe { memcpy_htod(CUdeviceptr::from(dst), src, n as usize) }
}
export!("cuMemcpyHtoD", cuMemcpyHtoD => memcpy_htod_v1(dstDevice: c_uint, srcHost: *const c_void, ByteCount: c_uint));

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

unsafe fn memcpy_dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize) -> Res {
    let st = lock();
    check_range(&st, src as usize, n)?;
    ensure(n == 0 || !dst.is_null(), INVALID_VALUE)?;
    // SAFETY: the source range lies in a live allocation (checked); the caller passes `n`
    // writable bytes at `dst`.
    unsafe { std::ptr::copy(as_ptr::<u8>(src as usize), dst.cast::<u8>(), n) };
    Ok(())
}
export!("cuMemcpyDtoH", cuMemcpyDtoH_v2 => memcpy_dtoh(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize));
export!("cuMemcpyDtoH", cuMemcpyDtoH_v2_ptds => memcpy_dtoh(dstHost: *mut c_void, srcDevice: CUdeviceptr, ByteCount: usize));

unsafe fn memset_d8(dst: CUdeviceptr, value: c_uchar, n: usize) -> Res {
    let st = lock();
    check_range(&st, dst as usize, n)?;
    // SAFETY: the range lies in a live allocation (checked).
    unsafe { std::ptr::write_bytes(as_ptr::<u8>(dst as usize), value, n) };
    Ok(())
}
export!("cuMemsetD8", cuMemsetD8_v2 => memset_d8(dstDevice: CUdeviceptr, uc: c_uchar, N: usize));
export!("cuMemsetD8", cuMemsetD8_v2_ptds => memset_d8(dstDevice: CUdeviceptr, uc: c_uchar, N: usize));

export!("cuModuleLoadData", cuModuleLoadData => module_load_data(module: *mut CUmodule, image: *const c_void));
/// The fake runs no kernels.
unsafe fn module_load_data(_module: *mut CUmodule, _image: *const c_void) -> Res {
    Err(NOT_SUPPORTED)
}
