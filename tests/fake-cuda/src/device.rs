//! Initialization, the driver version and the (fake) devices.

use std::ffi::{c_char, c_int, c_uint};

use cuda_dl_sys::types::{CUdevice, CUdevice_attribute, CUresult};

use crate::calls::{call, set_initialized};
use crate::config::config;
use crate::errors::{INVALID_DEVICE, INVALID_VALUE, Res, SUCCESS, ensure};

/// What `cuDeviceGetName` reports.
const NAME: &[u8] = b"Fake CUDA Device";
/// What `cuDeviceTotalMem` reports: 16 GiB (also the most device memory the fake hands out).
pub(crate) const TOTAL_MEMORY: usize = 16 << 30;

/// The attributes that are not 0: what the fake's memory model provides (page-locked memory the
/// device reaches at its host address, one address space, the stream-ordered allocator). Bindings
/// read these to choose their paths (cudarc uses `cuMemAllocAsync` when pools are supported).
const ATTRIBUTES: &[(CUdevice_attribute, c_int)] = &[
    (
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
        1,
    ),
    (
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        1,
    ),
    (
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        1,
    ),
];

/// `Err(CUDA_ERROR_INVALID_DEVICE)` unless `device` is one of the configured devices.
pub(crate) fn check_device(device: CUdevice) -> Res {
    ensure((0..config().devices()).contains(&device), INVALID_DEVICE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(Flags: c_uint) -> CUresult {
    call("cuInit", "cuInit", || {
        if Flags != 0 {
            return INVALID_VALUE;
        }
        if config().devices() == 0 {
            return CUresult::CUDA_ERROR_NO_DEVICE;
        }
        set_initialized();
        crate::teardown::register();
        SUCCESS
    })
}

export!("cuDriverGetVersion", cuDriverGetVersion => driver_get_version(driverVersion: *mut c_int));
unsafe fn driver_get_version(version: *mut c_int) -> Res {
    ensure(!version.is_null(), INVALID_VALUE)?;
    // SAFETY: non-null, and the caller passes a valid place for an int.
    unsafe { version.write(config().version()) };
    Ok(())
}

export!("cuDeviceGet", cuDeviceGet => device_get(device: *mut CUdevice, ordinal: c_int));
unsafe fn device_get(device: *mut CUdevice, ordinal: c_int) -> Res {
    ensure(!device.is_null(), INVALID_VALUE)?;
    check_device(ordinal)?;
    // SAFETY: non-null, and the caller passes a valid place for a device.
    unsafe { device.write(ordinal) };
    Ok(())
}

export!("cuDeviceGetCount", cuDeviceGetCount => device_get_count(count: *mut c_int));
unsafe fn device_get_count(count: *mut c_int) -> Res {
    ensure(!count.is_null(), INVALID_VALUE)?;
    // SAFETY: non-null, and the caller passes a valid place for an int.
    unsafe { count.write(config().devices()) };
    Ok(())
}

export!("cuDeviceGetName", cuDeviceGetName => device_get_name(name: *mut c_char, len: c_int, dev: CUdevice));
unsafe fn device_get_name(name: *mut c_char, len: c_int, dev: CUdevice) -> Res {
    ensure(!name.is_null() && len > 0, INVALID_VALUE)?;
    check_device(dev)?;
    let n = NAME.len().min(len as usize - 1);
    // SAFETY: the caller passes a buffer of `len` bytes; `n + 1 <= len` bytes are written.
    unsafe {
        std::ptr::copy_nonoverlapping(NAME.as_ptr().cast::<c_char>(), name, n);
        name.add(n).write(0);
    }
    Ok(())
}

export!("cuDeviceGetAttribute", cuDeviceGetAttribute => device_get_attribute(pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice));
/// The value of [`ATTRIBUTES`], 0 for every other attribute.
unsafe fn device_get_attribute(pi: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice) -> Res {
    ensure(!pi.is_null(), INVALID_VALUE)?;
    check_device(dev)?;
    let value = ATTRIBUTES
        .iter()
        .find(|(a, _)| *a == attrib)
        .map_or(0, |(_, v)| *v);
    // SAFETY: non-null, and the caller passes a valid place for an int.
    unsafe { pi.write(value) };
    Ok(())
}

export!("cuDeviceTotalMem", cuDeviceTotalMem_v2 => device_total_mem(bytes: *mut usize, dev: CUdevice));
unsafe fn device_total_mem(bytes: *mut usize, dev: CUdevice) -> Res {
    ensure(!bytes.is_null(), INVALID_VALUE)?;
    check_device(dev)?;
    // SAFETY: non-null, and the caller passes a valid place for a size.
    unsafe { bytes.write(TOTAL_MEMORY) };
    Ok(())
}
