//! The GPU every library shares: the driver our crates loaded, device 0's primary context, the
//! streams (made once, wrapped by each library), mapped host words and the hold that keeps a stream
//! waiting until the host opens it.

use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{CUdeviceptr, CUstream};
use cuda_host_launch::{Device, PrimaryContext, Stream};

/// The driver, the device and its primary context, as our crates see them.
pub struct Gpu {
    pub driver: &'static Driver,
    pub device: Device,
    pub context: Arc<PrimaryContext>,
}

impl Gpu {
    /// Loads the driver and retains device 0's primary context (current on the calling thread).
    pub fn open() -> Result<Gpu, String> {
        let driver = cuda_dl_sys::driver().map_err(|e| format!("no CUDA driver: {e}"))?;
        let count = Device::count().map_err(|e| format!("no CUDA device: {e}"))?;
        if count == 0 {
            return Err("no CUDA device: the driver reports 0 devices".into());
        }
        let device = Device::get(0).map_err(|e| format!("device 0: {e}"))?;
        let context =
            PrimaryContext::retain(device).map_err(|e| format!("primary context: {e}"))?;
        context
            .set_current()
            .map_err(|e| format!("primary context: {e}"))?;
        Ok(Gpu {
            driver,
            device,
            context,
        })
    }

    /// A non-blocking stream of the primary context (cuda-core's streams are non-blocking too).
    pub fn stream(&self) -> Result<Stream, String> {
        Stream::new_non_blocking(&self.context).map_err(|e| format!("cuStreamCreate: {e}"))
    }

    /// Makes the primary context current on the calling thread.
    pub fn bind(&self) {
        self.context.set_current().expect("cuCtxSetCurrent");
    }

    /// What the header prints: the GPU's name, the driver's CUDA version, and the kernel module's
    /// version where /proc tells it.
    pub fn describe(&self) -> String {
        let name = self
            .device
            .name()
            .unwrap_or_else(|e| format!("(name unknown: {e})"));
        let module = std::fs::read_to_string("/proc/driver/nvidia/version")
            .ok()
            .and_then(|text| text.lines().next().map(str::to_owned))
            .unwrap_or_else(|| "(no /proc/driver/nvidia/version)".into());
        format!(
            "GPU: {name}; driver API {} (cuDriverGetVersion), library {}; kernel module: {module}",
            self.driver.version(),
            self.driver.path().display()
        )
    }
}

/// Host words mapped into the device (`cuMemHostAlloc(DEVICEMAP | PORTABLE)`).
pub struct MappedWords {
    driver: &'static Driver,
    host: *mut AtomicU32,
    device: CUdeviceptr,
    len: usize,
}

// SAFETY: the host side is accessed only as atomics; the allocation is freed once, on drop.
unsafe impl Send for MappedWords {}
// SAFETY: as above.
unsafe impl Sync for MappedWords {}

impl MappedWords {
    /// `len` zeroed words; a context must be current.
    pub fn new(gpu: &Gpu, len: usize) -> Result<MappedWords, String> {
        const PORTABLE: u32 = 0x01;
        const DEVICEMAP: u32 = 0x02;
        let mut host = ptr::null_mut();
        // SAFETY: `host` is a valid place for the pointer; the primary context is current.
        unsafe {
            gpu.driver
                .cuMemHostAlloc(&mut host, len * 4, PORTABLE | DEVICEMAP)
        }
        .map_err(|e| format!("cuMemHostAlloc: {e}"))?;
        // SAFETY: freshly allocated, `len * 4` bytes, aligned for u32.
        unsafe { ptr::write_bytes(host.cast::<u8>(), 0, len * 4) };
        let mut device = 0;
        // SAFETY: `host` was allocated with DEVICEMAP; `device` is a valid place to write.
        unsafe { gpu.driver.cuMemHostGetDevicePointer(&mut device, host, 0) }
            .map_err(|e| format!("cuMemHostGetDevicePointer: {e}"))?;
        Ok(MappedWords {
            driver: gpu.driver,
            host: host.cast(),
            device,
            len,
        })
    }

    /// The host view of word `i`.
    pub fn host(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.len);
        // SAFETY: in bounds of a live, zero-initialised allocation of u32s; AtomicU32 has u32's layout.
        unsafe { &*self.host.add(i) }
    }

    /// The device address of word `i`.
    pub fn device(&self, i: usize) -> CUdeviceptr {
        assert!(i < self.len);
        self.device + 4 * i as u64
    }

    /// Enqueues a write of `value` into word `i` on `stream`: the small piece of GPU work each
    /// throughput item carries.
    pub fn write_on(&self, stream: CUstream, i: usize, value: u32) -> Result<(), String> {
        // SAFETY: a live stream and a mapped word that outlives the stream's work (the runs
        // synchronize their streams before dropping this).
        unsafe {
            self.driver
                .cuStreamWriteValue32(stream, self.device(i), value, 0)
        }
        .map_err(|e| format!("cuStreamWriteValue32: {e}"))
    }
}

impl Drop for MappedWords {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once; no stream uses it any more.
        let _ = unsafe { self.driver.cuMemFreeHost(self.host.cast()) };
    }
}

/// A stream held by `cuStreamWaitValue32` on a mapped host word until the host opens it: each
/// close waits for a new, larger value (`CU_STREAM_WAIT_VALUE_GEQ`), so the word never goes back.
pub struct Hold {
    word: MappedWords,
    next: u32,
}

impl Hold {
    pub fn new(gpu: &Gpu) -> Result<Hold, String> {
        Ok(Hold {
            word: MappedWords::new(gpu, 1)?,
            next: 0,
        })
    }

    /// Enqueues the wait on `stream`: work enqueued after it waits for [`Hold::open`].
    pub fn close(&mut self, stream: CUstream) -> Result<(), String> {
        self.next += 1;
        // SAFETY: a live stream; the word outlives the wait (opened before the hold is dropped).
        unsafe {
            self.word
                .driver
                .cuStreamWaitValue32(stream, self.word.device(0), self.next, 0)
        }
        .map_err(|e| format!("cuStreamWaitValue32: {e}"))
    }

    /// Opens the last close: the GPU sees the word's new value and the stream moves on.
    pub fn open(&self) {
        self.word.host(0).store(self.next, Ordering::Release);
    }
}
