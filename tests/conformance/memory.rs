//! Memory and modules: allocations, synchronous copies and sets, page-locked host memory, what
//! the driver says of bad addresses, and what the fake does without a device (no modules).
//! Stream-ordered copies, sets and allocations: `memory_async`.

use std::ffi::c_void;
use std::ptr;

use cuda_dl_sys::types::{CUcontext, CUdevice_attribute, CUdeviceptr, CUresult};

use super::harness::{Cx, MAPPED, cases, code};

/// `n` bytes of device memory (`cuMemAlloc`), never freed unless the case does.
pub fn device_memory(cx: &Cx, n: usize) -> CUdeviceptr {
    let mut dptr = 0;
    // SAFETY: a valid out-pointer.
    unsafe { cx.driver.cuMemAlloc(&mut dptr, n) }.expect("cuMemAlloc");
    dptr
}

/// `n` bytes of page-locked host memory, mapped (`cuMemHostAlloc`), zeroed, never freed unless
/// the case does.
pub fn pinned(cx: &Cx, n: usize) -> *mut u8 {
    let mut host = ptr::null_mut();
    // SAFETY: a valid out-pointer; the memory is `n` bytes long.
    unsafe {
        cx.driver
            .cuMemHostAlloc(&mut host, n, MAPPED)
            .expect("cuMemHostAlloc");
        ptr::write_bytes(host.cast::<u8>(), 0, n);
    }
    host.cast()
}

/// The `n` bytes at `host` (page-locked memory no stream writes any more).
pub fn bytes(host: *const u8, n: usize) -> Vec<u8> {
    // SAFETY: every use passes memory of at least `n` bytes that nothing writes meanwhile.
    unsafe { std::slice::from_raw_parts(host, n) }.to_vec()
}

/// The `n` bytes of device memory at `dptr`, through a synchronous copy.
pub fn read(cx: &Cx, dptr: CUdeviceptr, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    // SAFETY: `out` holds `n` bytes.
    unsafe { cx.driver.cuMemcpyDtoH(out.as_mut_ptr().cast(), dptr, n) }.expect("cuMemcpyDtoH");
    out
}

/// A context made with `cuCtxCreate` (current until popped).
fn created_context(cx: &Cx) -> CUcontext {
    let mut context = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe {
        cx.driver
            .cuCtxCreate(&mut context, ptr::null_mut(), 0, cx.device)
    }
    .expect("cuCtxCreate");
    context
}

cases! {
    /// Device memory round-trips through synchronous copies and sets.
    fn device_memory_round_trips_through_copies_and_sets(cx) {
        let mut device: CUdeviceptr = 0;
        let input: Vec<u8> = (0..32).collect();
        let mut output = vec![0u8; 32];
        // SAFETY: valid out-pointers and buffers of 32 bytes.
        unsafe {
            cx.driver.cuMemAlloc(&mut device, 32).unwrap();
            cx.driver.cuMemcpyHtoD(device, input.as_ptr().cast(), 32).unwrap();
            cx.driver.cuMemsetD8(device + 8, 0xff, 4).unwrap();
            cx.driver.cuMemcpyDtoH(output.as_mut_ptr().cast(), device, 32).unwrap();
            cx.driver.cuMemFree(device).unwrap();
        }
        let mut expected = input;
        expected[8..12].fill(0xff);
        assert_eq!(output, expected);
    }

    /// `cuMemsetD16` and `cuMemsetD32` set values of their width (little-endian), and
    /// `cuMemcpyDtoD` copies between device buffers.
    fn device_to_device_copies_and_wide_sets_round_trip(cx) {
        let (a, b) = (device_memory(cx, 64), device_memory(cx, 64));
        // SAFETY: both buffers hold 64 bytes; the ranges lie inside them, aligned.
        unsafe {
            cx.driver.cuMemsetD32(a, 0x0403_0201, 16).unwrap();
            cx.driver.cuMemsetD16(a + 8, 0xabcd, 2).unwrap();
            cx.driver.cuMemcpyDtoD(b, a, 64).unwrap();
        }
        let mut expected: Vec<u8> = [1, 2, 3, 4].repeat(16);
        expected[8..12].copy_from_slice(&[0xcd, 0xab, 0xcd, 0xab]);
        assert_eq!(read(cx, b, 64), expected);
    }

    /// `cuMemcpy` tells the direction from the addresses (unified addressing): pageable host
    /// memory to device, device to page-locked host memory, host to host.
    fn unified_copies_tell_the_direction_from_the_addresses(cx) {
        let device = device_memory(cx, 16);
        let host = pinned(cx, 16);
        let input: Vec<u8> = (1..=16).collect();
        let mut output = vec![0u8; 16];
        // SAFETY: every buffer holds 16 bytes.
        unsafe {
            cx.driver.cuMemcpy(device, input.as_ptr() as CUdeviceptr, 16).unwrap();
            cx.driver.cuMemcpy(host as CUdeviceptr, device, 16).unwrap();
            assert_eq!(bytes(host, 16), input, "device to page-locked memory");
            cx.driver.cuMemcpy(output.as_mut_ptr() as CUdeviceptr, host as CUdeviceptr, 16).unwrap();
        }
        assert_eq!(output, input, "host to host");
    }

    /// Page-locked memory from `cuMemAllocHost` is device memory at its host address: a
    /// synchronous set through its device pointer is there when the call returns.
    fn page_locked_memory_is_reached_at_its_host_address(cx) {
        let mut host: *mut c_void = ptr::null_mut();
        let mut device: CUdeviceptr = 0;
        // SAFETY: valid out-pointers; 64 bytes.
        unsafe {
            cx.driver.cuMemAllocHost(&mut host, 64).unwrap();
            cx.driver.cuMemHostGetDevicePointer(&mut device, host, 0).unwrap();
            assert_eq!(device, host as CUdeviceptr);
            cx.driver.cuMemsetD8(device, 0x5a, 64).unwrap();
            assert_eq!(bytes(host.cast(), 64), vec![0x5a; 64]);
            cx.driver.cuMemFreeHost(host).unwrap();
        }
    }

    /// A copy that runs past the end of an allocation, and any use of freed memory (a second
    /// free, a copy, a set), is `CUDA_ERROR_INVALID_VALUE`.
    fn freed_and_out_of_range_addresses_are_invalid_values(cx) {
        let device = device_memory(cx, 64);
        let mut buffer = vec![0u8; 64];
        let invalid = Some(CUresult::CUDA_ERROR_INVALID_VALUE);
        // SAFETY: the buffer holds 64 bytes; the driver checks the device addresses.
        unsafe {
            let past_the_end = cx.driver.cuMemcpyDtoH(buffer.as_mut_ptr().cast(), device + 32, 64);
            assert_eq!(code(past_the_end), invalid, "a copy past the end");
            cx.driver.cuMemFree(device).unwrap();
            assert_eq!(code(cx.driver.cuMemFree(device)), invalid, "a second free");
            let copy = cx.driver.cuMemcpyHtoD(device, buffer.as_ptr().cast(), 8);
            assert_eq!(code(copy), invalid, "a copy into freed memory");
            assert_eq!(code(cx.driver.cuMemsetD8(device, 0, 8)), invalid, "a set of freed memory");
        }
    }

    /// `cuMemsetD16` and `cuMemsetD32` need an address aligned to the value's width.
    fn wide_sets_need_aligned_addresses(cx) {
        let device = device_memory(cx, 64);
        let invalid = Some(CUresult::CUDA_ERROR_INVALID_VALUE);
        // SAFETY: the ranges lie inside the 64 bytes; the driver checks the alignment.
        unsafe {
            assert_eq!(code(cx.driver.cuMemsetD16(device + 1, 7, 4)), invalid);
            assert_eq!(code(cx.driver.cuMemsetD32(device + 2, 7, 4)), invalid);
            cx.driver.cuMemsetD32(device + 4, 7, 4).unwrap();
            cx.driver.cuMemsetD16(device + 2, 7, 1).unwrap();
        }
    }

    /// Asking for more device memory than the device has is `CUDA_ERROR_OUT_OF_MEMORY`.
    fn an_allocation_beyond_the_devices_memory_is_out_of_memory(cx) {
        let mut total = 0;
        let mut device = 0;
        // SAFETY: valid out-pointers.
        unsafe {
            cx.driver.cuDeviceTotalMem(&mut total, cx.device).unwrap();
            let allocated = cx.driver.cuMemAlloc(&mut device, total + (1 << 30));
            assert_eq!(code(allocated), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        }
    }

    /// `cuMemGetInfo` reports the device's memory (`cuDeviceTotalMem`) and what is free of it: an
    /// allocation takes its size from the free memory, and its free gives it back.
    fn memory_info_counts_what_is_allocated(cx) {
        let info = || {
            let (mut free, mut total) = (0, 0);
            // SAFETY: valid out-pointers.
            unsafe { cx.driver.cuMemGetInfo(&mut free, &mut total) }.unwrap();
            (free, total)
        };
        let mut device_total = 0;
        // SAFETY: a valid out-pointer.
        unsafe { cx.driver.cuDeviceTotalMem(&mut device_total, cx.device) }.unwrap();
        let (before, total) = info();
        assert_eq!(total, device_total);
        assert!(before <= total);
        let size = 64 << 20;
        let device = device_memory(cx, size);
        let (during, _) = info();
        assert!(during + size <= before, "free {before} → {during} after allocating {size}");
        // SAFETY: allocated above, freed once.
        unsafe { cx.driver.cuMemFree(device) }.unwrap();
        let (after, _) = info();
        assert!(after > during, "free {during} → {after} after freeing {size}");
    }

    /// A context's allocations go with it: once it is destroyed, its memory is unknown to the
    /// driver (`CUDA_ERROR_INVALID_VALUE`).
    fn allocations_go_with_their_context(cx) {
        let context = created_context(cx);
        let device = device_memory(cx, 64);
        let input = [1u8; 8];
        // SAFETY: a context made here; the primary context is live.
        unsafe {
            cx.driver.cuCtxDestroy(context).unwrap();
            cx.driver.cuCtxSetCurrent(cx.context).unwrap();
            let invalid = Some(CUresult::CUDA_ERROR_INVALID_VALUE);
            assert_eq!(code(cx.driver.cuMemcpyHtoD(device, input.as_ptr().cast(), 8)), invalid);
            assert_eq!(code(cx.driver.cuMemFree(device)), invalid);
        }
    }

    /// `cuMemcpyPeer` copies from one context's memory to another's (two contexts of one device).
    fn peer_copies_cross_contexts(cx) {
        let context = created_context(cx);
        let source = device_memory(cx, 32);
        // SAFETY: 32 bytes; the created context is current, then popped.
        unsafe {
            cx.driver.cuMemsetD8(source, 0x77, 32).unwrap();
            cx.driver.cuCtxSynchronize().unwrap();
            cx.driver.cuCtxPopCurrent(&mut ptr::null_mut()).unwrap();
        }
        let target = device_memory(cx, 32);
        // SAFETY: both buffers hold 32 bytes, each in its context.
        unsafe {
            cx.driver.cuMemcpyPeer(target, cx.context, source, context, 32).unwrap();
        }
        assert_eq!(read(cx, target, 32), vec![0x77; 32]);
        // SAFETY: made here, not current.
        unsafe { cx.driver.cuCtxDestroy(context) }.unwrap();
    }

    /// The device reaches mapped host memory, shares one address space with the host (unified
    /// addressing) and has memory pools (the stream-ordered allocator): the attributes bindings
    /// read to choose their paths.
    fn the_device_has_mapped_memory_unified_addressing_and_pools(cx) {
        for attribute in [
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        ] {
            let mut value = 0;
            // SAFETY: a valid out-pointer.
            unsafe { cx.driver.cuDeviceGetAttribute(&mut value, attribute, cx.device) }.unwrap();
            assert_eq!(value, 1, "{attribute:?}");
        }
    }

    /// The fake runs no kernels: loading a module (the test kernels' PTX, from memory or from a
    /// file) is `CUDA_ERROR_NOT_SUPPORTED`.
    fn loading_a_module_is_not_supported(cx) {
        let ptx = std::ffi::CString::new(cuda_workspace::gpu::TEST_KERNELS_PTX).unwrap();
        let mut module = ptr::null_mut();
        // SAFETY: a NUL-terminated image and a valid out-pointer.
        let loaded = unsafe { cx.driver.cuModuleLoadData(&mut module, ptx.as_ptr().cast()) };
        assert_eq!(code(loaded), Some(CUresult::CUDA_ERROR_NOT_SUPPORTED));
        let file = std::env::temp_dir().join(format!("conformance-kernels-{}.ptx", std::process::id()));
        std::fs::write(&file, cuda_workspace::gpu::TEST_KERNELS_PTX).unwrap();
        let name = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path and a valid out-pointer.
        let loaded = unsafe { cx.driver.cuModuleLoad(&mut module, name.as_ptr()) };
        let _ = std::fs::remove_file(&file);
        assert_eq!(code(loaded), Some(CUresult::CUDA_ERROR_NOT_SUPPORTED));
    }
}
