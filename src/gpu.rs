//! Support for the tests and benchmarks that run on a real GPU: the embedded PTX kernels and
//! host-mapped memory, through `cuda-dl-sys` alone.
//!
//! Test support, not library code: a failure panics with a message, which fails the test. That is
//! the point on a machine without a driver, where the GPU tests are run on purpose (`--ignored`).

use std::ffi::{CString, c_void};
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{CUdeviceptr, CUfunction, CUmodule, CUstream};
use cuda_host_launch::{Device, PrimaryContext};

/// The PTX of `tests/kernels/test_kernels.ptx`.
pub const TEST_KERNELS_PTX: &str = include_str!("../tests/kernels/test_kernels.ptx");

/// The driver, device 0's primary context (current on the calling thread) and the test kernels.
pub struct Gpu {
    /// The real driver.
    pub driver: &'static Driver,
    /// Device 0's primary context.
    pub context: Arc<PrimaryContext>,
    /// The test kernels, loaded into `context`.
    pub kernels: Kernels,
}

impl Gpu {
    /// Loads the real driver (never the fake: `CUDA_DL_SYS_LIBRARY` must not point at it), retains
    /// device 0's primary context, makes it current and loads the kernels.
    pub fn open() -> Gpu {
        let driver = cuda_dl_sys::driver().unwrap_or_else(|e| {
            panic!("GPU test without a usable NVIDIA driver: {e}");
        });
        assert!(
            !driver.path().to_string_lossy().contains("fake"),
            "GPU tests must run on the real driver, not {}",
            driver.path().display()
        );
        let context = PrimaryContext::retain(Device::get(0).expect("device 0")).expect("context");
        context.set_current().expect("cuCtxSetCurrent");
        let kernels = Kernels::load(driver);
        Gpu {
            driver,
            context,
            kernels,
        }
    }

    /// Makes the context current on the calling thread (each new thread needs this).
    pub fn bind_thread(&self) {
        self.context.set_current().expect("cuCtxSetCurrent");
    }
}

/// The kernels of [`TEST_KERNELS_PTX`].
pub struct Kernels {
    driver: &'static Driver,
    _module: CUmodule,
    spin_then_write: CUfunction,
    copy_u32: CUfunction,
    trap_now: CUfunction,
}

// SAFETY: module and function handles are opaque driver tokens, usable from any thread.
unsafe impl Send for Kernels {}
// SAFETY: as above.
unsafe impl Sync for Kernels {}

impl Kernels {
    /// Loads the kernels into the calling thread's current context.
    pub fn load_current(driver: &'static Driver) -> Kernels {
        Self::load(driver)
    }

    fn load(driver: &'static Driver) -> Kernels {
        let ptx = CString::new(TEST_KERNELS_PTX).expect("PTX has no NUL");
        let mut module = ptr::null_mut();
        // SAFETY: `ptx` is a NUL-terminated PTX image; a context is current.
        unsafe { driver.cuModuleLoadData(&mut module, ptx.as_ptr().cast()) }
            .expect("cuModuleLoadData (JIT of the test PTX)");
        let function = |name: &str| {
            let name = CString::new(name).expect("name");
            let mut f = ptr::null_mut();
            // SAFETY: `module` is loaded; `name` is NUL-terminated.
            unsafe { driver.cuModuleGetFunction(&mut f, module, name.as_ptr()) }
                .expect("cuModuleGetFunction");
            f
        };
        Kernels {
            driver,
            spin_then_write: function("spin_then_write"),
            copy_u32: function("copy_u32"),
            trap_now: function("trap_now"),
            _module: module,
        }
    }

    fn launch(&self, f: CUfunction, stream: CUstream, params: &mut [*mut c_void]) {
        // SAFETY: `params` points at one value per kernel parameter, of the kernel's types, alive for
        // the call; one block of one thread; the stream is valid (callers pass live streams).
        unsafe {
            self.driver.cuLaunchKernel(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        }
        .expect("cuLaunchKernel");
    }

    /// Enqueues: spin `cycles` GPU clock cycles, then `*addr = value` (and a system fence).
    pub fn spin_then_write(&self, stream: CUstream, addr: CUdeviceptr, value: u32, cycles: u64) {
        let (mut addr, mut value, mut cycles) = (addr, value, cycles);
        let mut params = [
            (&raw mut addr).cast::<c_void>(),
            (&raw mut value).cast(),
            (&raw mut cycles).cast(),
        ];
        self.launch(self.spin_then_write, stream, &mut params);
    }

    /// Enqueues `*dst = *src` (volatile, on mapped memory).
    pub fn copy_u32(&self, stream: CUstream, src: CUdeviceptr, dst: CUdeviceptr) {
        let (mut src, mut dst) = (src, dst);
        let mut params = [(&raw mut src).cast::<c_void>(), (&raw mut dst).cast()];
        self.launch(self.copy_u32, stream, &mut params);
    }

    /// Adds a `spin_then_write(addr, value, cycles)` kernel node to `graph` after `dependencies`.
    ///
    /// # Safety
    /// `graph` must be a live graph and `dependencies` nodes of it.
    pub unsafe fn add_spin_then_write_node(
        &self,
        graph: cuda_dl_sys::types::CUgraph,
        dependencies: &[cuda_dl_sys::types::CUgraphNode],
        addr: CUdeviceptr,
        value: u32,
        cycles: u64,
    ) -> cuda_dl_sys::types::CUgraphNode {
        // The parameter values must outlive the call only: the driver copies them.
        let (mut addr, mut value, mut cycles) = (addr, value, cycles);
        let mut args = [
            (&raw mut addr).cast::<c_void>(),
            (&raw mut value).cast(),
            (&raw mut cycles).cast(),
        ];
        let params = cuda_dl_sys::types::CUDA_KERNEL_NODE_PARAMS {
            func: self.spin_then_write,
            gridDimX: 1,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 1,
            blockDimY: 1,
            blockDimZ: 1,
            kernelParams: args.as_mut_ptr(),
            ..Default::default()
        };
        let mut node = ptr::null_mut();
        // SAFETY: live graph and dependencies (the caller's promise); `params` and `args` are valid
        // for the call.
        unsafe {
            self.driver.cuGraphAddKernelNode(
                &mut node,
                graph,
                dependencies.as_ptr(),
                dependencies.len(),
                &params,
            )
        }
        .expect("cuGraphAddKernelNode");
        node
    }

    /// Enqueues a kernel that traps: the context gets a sticky error (719).
    pub fn trap(&self, stream: CUstream) {
        self.launch(self.trap_now, stream, &mut []);
    }
}

/// `len` host-mapped, zeroed `u32`s: the host reads them as atomics, kernels through `device(i)`.
pub struct MappedU32s {
    driver: &'static Driver,
    host: *mut AtomicU32,
    device: CUdeviceptr,
    len: usize,
}

// SAFETY: the host side is accessed only as atomics; the allocation is freed once, on drop.
unsafe impl Send for MappedU32s {}
// SAFETY: as above.
unsafe impl Sync for MappedU32s {}

impl MappedU32s {
    /// Allocates with `cuMemHostAlloc(DEVICEMAP | PORTABLE)`.
    pub fn new(driver: &'static Driver, len: usize) -> MappedU32s {
        const PORTABLE: u32 = 0x01;
        const DEVICEMAP: u32 = 0x02;
        let mut host = ptr::null_mut();
        // SAFETY: `host` is a valid place for the pointer; a context is current.
        unsafe { driver.cuMemHostAlloc(&mut host, len * 4, PORTABLE | DEVICEMAP) }
            .expect("cuMemHostAlloc");
        // SAFETY: freshly allocated, `len * 4` bytes, aligned for u32.
        unsafe { ptr::write_bytes(host.cast::<u8>(), 0, len * 4) };
        let mut device = 0;
        // SAFETY: `host` was allocated with DEVICEMAP; `device` is a valid place to write.
        unsafe { driver.cuMemHostGetDevicePointer(&mut device, host, 0) }
            .expect("cuMemHostGetDevicePointer");
        MappedU32s {
            driver,
            host: host.cast(),
            device,
            len,
        }
    }

    /// The host view of element `i`.
    pub fn host(&self, i: usize) -> &AtomicU32 {
        assert!(i < self.len);
        // SAFETY: in bounds of a live, zero-initialised allocation of u32s; AtomicU32 has u32's layout.
        unsafe { &*self.host.add(i) }
    }

    /// Reads element `i` (acquire).
    pub fn get(&self, i: usize) -> u32 {
        self.host(i).load(Ordering::Acquire)
    }

    /// Writes element `i` (release).
    pub fn set(&self, i: usize, value: u32) {
        self.host(i).store(value, Ordering::Release)
    }

    /// The device address of element `i`.
    pub fn device(&self, i: usize) -> CUdeviceptr {
        assert!(i < self.len);
        self.device + 4 * i as u64
    }
}

impl Drop for MappedU32s {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        let _ = unsafe { self.driver.cuMemFreeHost(self.host.cast()) };
    }
}

/// Bytes of heap in use (glibc's `mallinfo2().uordblks`): for "memory is flat" checks.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 has no preconditions.
    unsafe { libc::mallinfo2() }.uordblks
}

/// Resident set size of this process in bytes, from /proc/self/statm.
#[cfg(target_os = "linux")]
pub fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
