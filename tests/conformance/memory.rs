//! Memory and modules: what the fake does without a device.

use std::ptr;

use cuda_sys::types::{CUdeviceptr, CUresult};

use super::harness::{cases, code};

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

    /// The fake runs no kernels: loading a module (the test kernels' PTX) is
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    fn loading_a_module_is_not_supported(cx) {
        let ptx = std::ffi::CString::new(cuda_workspace::gpu::TEST_KERNELS_PTX).unwrap();
        let mut module = ptr::null_mut();
        // SAFETY: a NUL-terminated image and a valid out-pointer.
        let loaded = unsafe { cx.driver.cuModuleLoadData(&mut module, ptx.as_ptr().cast()) };
        assert_eq!(code(loaded), Some(CUresult::CUDA_ERROR_NOT_SUPPORTED));
    }
}
