//! A CUDA device.

use std::ffi::c_char;

use cuda_dl_sys::types::CUdevice;

use crate::support::error::Error;

/// A CUDA device, by ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    raw: CUdevice,
    ordinal: i32,
}

impl Device {
    /// How many CUDA devices the driver sees.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the driver cannot be loaded or the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn count() -> Result<usize, Error> {
        crate::support::host_thread::refuse_inside_host_function("Device::count")?;
        let driver = cuda_dl_sys::driver()?;
        let mut count = 0;
        // SAFETY: `count` is a valid place to write an int.
        unsafe { driver.cuDeviceGetCount(&mut count)? };
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// The device with this ordinal (0-based).
    ///
    /// # Errors
    /// [`Error::Cuda`] (`CUDA_ERROR_INVALID_DEVICE` for an ordinal out of range).
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn get(ordinal: i32) -> Result<Device, Error> {
        crate::support::host_thread::refuse_inside_host_function("Device::get")?;
        let driver = cuda_dl_sys::driver()?;
        let mut raw = 0;
        // SAFETY: `raw` is a valid place to write a device handle.
        unsafe { driver.cuDeviceGet(&mut raw, ordinal)? };
        Ok(Device { raw, ordinal })
    }

    /// The device's name, such as `NVIDIA H200`.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn name(&self) -> Result<String, Error> {
        crate::support::host_thread::refuse_inside_host_function("Device::name")?;
        let driver = cuda_dl_sys::driver()?;
        let mut buffer = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes; the driver writes a NUL-terminated name into it.
        unsafe { driver.cuDeviceGetName(buffer.as_mut_ptr(), buffer.len() as i32, self.raw)? };
        let bytes: Vec<u8> = buffer
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The driver's handle.
    pub fn raw(&self) -> CUdevice {
        self.raw
    }

    /// The ordinal this device was opened with.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }
}
