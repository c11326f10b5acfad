//! Support for the tests that run against the fake CUDA driver (`tests/fake-cuda`).
//!
//! - [`fake_driver_path`] finds the fake driver (a `cdylib` that `cargo test` builds because this
//!   package dev-depends on it), and [`load_fake_driver`] loads it as the process's driver.
//! - [`FakeCuda`] (through [`fake`]) reaches the fake's `fake_cuda_*` control functions: fault
//!   injection, call counters, holds (stand-ins for long-running kernels), sticky errors.
//! - [`owners`]: for the `cuda-host-launch` tests: the process's primary context, owners that
//!   record where and when they are dropped ([`Drops`]), and where a host function ran;
//!   [`drop_counts`]: one counter per owner for load tests ([`DropCounts`]); [`probe`]: a counting
//!   host function and its owners ([`Probe`]); [`thread_set`]: the threads that ran host functions
//!   or dropped owners ([`ThreadSet`]). The last three serve the GPU tests as well.
//! - [`in_own_process`] and [`isolated_test!`](crate::isolated_test) run a test in a process of its
//!   own, with its own environment: the driver is loaded once per process and reads its
//!   configuration (`CUDA_SYS_*`, `FAKE_CUDA_*`) once, so a test that needs a particular driver
//!   version, a stub or a fault from the first call on needs a fresh process.
//!
//! Test support, not library code: a failure panics with a message, which fails the test.
//!
//! ```no_run
//! use cuda_workspace::isolated_test;
//! use cuda_workspace::testing::{fake, fake_driver_path};
//!
//! isolated_test! {
//!     /// A driver reporting 11.8 resolves through `cuGetProcAddress` (v1).
//!     fn old_driver_uses_v1(FAKE_CUDA_VERSION = "11080", CUDA_SYS_LIBRARY = fake_driver_path()) {
//!         let driver = cuda_sys::driver().unwrap();
//!         assert_eq!(driver.version().0, 11080);
//!         assert_eq!(fake().proc_address_calls(2), 0);
//!     }
//! }
//! # fn main() {}
//! ```

pub mod drop_counts;
pub mod owners;
pub mod probe;
pub mod thread_set;

pub use drop_counts::{CountedOwner, DropCounts};
pub use owners::{
    DropRecord, Drops, Owner, PATIENCE, REAPER_NAME, RanOn, ThreadInfo, fake_primary_context,
    threads_named,
};
pub use probe::{Probe, address_bytes, bump, bump_from_bytes};
pub use thread_set::{ThreadSet, thread_id};

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, c_char, c_void};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cuda_sys::types::{CUcontext, CUdevice, CUresult, CUstream};
use cuda_sys::{Driver, LoadOptions};

/// The fake driver's file name on this platform (`libfake_cuda.so`, `fake_cuda.dll`, ...).
pub fn fake_driver_file_name() -> String {
    format!(
        "{}fake_cuda{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// The fake driver library built beside the running test or example: in its folder, its `deps/`,
/// or `../deps/` (Cargo puts test binaries in `target/<profile>/deps/`, examples in
/// `target/<profile>/examples/`, and a dependency's `cdylib` in `target/<profile>/deps/`).
///
/// # Panics
/// If it is not there (build it with `cargo test`, or `cargo build -p fake-cuda` into the same
/// target folder).
pub fn fake_driver_path() -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running test binary");
    let dir = exe.parent().unwrap_or(Path::new("."));
    let name = fake_driver_file_name();
    let candidates = [
        dir.join(&name),
        dir.join("deps").join(&name),
        dir.join("..").join("deps").join(&name),
    ];
    match candidates.iter().find(|p| p.is_file()) {
        Some(found) => found.canonicalize().unwrap_or_else(|_| found.clone()),
        None => panic!(
            "the fake CUDA driver ({name}) is not beside {}: looked at {}. It is built by `cargo \
             test` (the root package dev-depends on tests/fake-cuda); otherwise run `cargo build \
             -p fake-cuda` with the same target folder",
            exe.display(),
            candidates
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Loads the fake driver as this process's driver (legacy default stream), or returns it if it is
/// already loaded.
///
/// # Panics
/// If it cannot be loaded, or another driver was loaded first.
pub fn load_fake_driver() -> &'static Driver {
    // SAFETY: the fake driver implements the driver's C ABI with cuda.h's signatures, as its tests
    // check; it is built with this workspace.
    unsafe { Driver::load(LoadOptions::with_library_path(fake_driver_path())) }
        .unwrap_or_else(|e| panic!("the fake CUDA driver did not load: {e}"))
}

/// The calling thread as the operating system knows it: its id and name.
///
/// Threads the fake driver starts belong to the fake's own copy of the Rust standard library, so
/// `std::thread::current()` in a test knows neither their name nor their id (just as for the real
/// driver's C threads); ask the system instead. On Linux the name is cut to 15 bytes
/// (`fake-cuda-drive` for the fake's `fake-cuda-driver-<n>` threads).
pub fn os_thread() -> (String, String) {
    #[cfg(target_os = "linux")]
    {
        let id = std::fs::read_link("/proc/thread-self")
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let name = std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default();
        (id, name.trim_end().to_string())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let thread = std::thread::current();
        (
            format!("{:?}", thread.id()),
            thread.name().unwrap_or("").to_string(),
        )
    }
}

/// The error of `result`, which must be one. (`Result::unwrap_err` needs `T: Debug`, which
/// [`Driver`] is not.)
///
/// # Panics
/// If `result` is `Ok`.
#[track_caller]
pub fn expect_error<T>(result: Result<T, cuda_sys::Error>) -> cuda_sys::Error {
    match result {
        Ok(_) => panic!("expected an error, got Ok"),
        Err(e) => e,
    }
}

/// Retains device 0's primary context and makes it current on the calling thread.
///
/// # Panics
/// If the driver refuses.
pub fn current_primary_context(driver: &Driver) -> CUcontext {
    let mut device: CUdevice = 0;
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: both out-pointers are valid locals; the handles come from the driver.
    unsafe {
        driver.cuDeviceGet(&mut device, 0).expect("cuDeviceGet");
        driver
            .cuDevicePrimaryCtxRetain(&mut context, device)
            .expect("cuDevicePrimaryCtxRetain");
        driver.cuCtxSetCurrent(context).expect("cuCtxSetCurrent");
    }
    context
}

/// The fake driver's control functions (see `tests/fake-cuda/src/control.rs`), reached by opening
/// the fake library again: the system loader hands back the copy already mapped, so these see the
/// state the driver calls change.
///
/// Holding it also keeps the fake mapped when the driver loader rejects it and closes its handle
/// (a stub, a failing `cuInit`): open it first in such tests, or the fake's state goes with it.
pub struct FakeCuda {
    library: libloading::Library,
}

/// Calls of one export name, as [`FakeCuda::call_counts`] lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportCalls {
    /// The base symbol it is a variant of (`cuLaunchHostFunc` for `cuLaunchHostFunc_v2`); faults
    /// set on the base name hit every variant, faults set on the export name only this one.
    pub base: String,
    /// Calls so far.
    pub count: u64,
}

/// The fake's control functions, opened once per process.
///
/// # Panics
/// If the fake library cannot be found or opened.
pub fn fake() -> &'static FakeCuda {
    static FAKE: OnceLock<FakeCuda> = OnceLock::new();
    FAKE.get_or_init(|| FakeCuda::open(&fake_driver_path()))
}

fn c_name(name: &str) -> CString {
    CString::new(name).expect("a function name without NUL bytes")
}

impl FakeCuda {
    /// Opens the fake library at `path`.
    ///
    /// # Panics
    /// If it cannot be opened.
    pub fn open(path: &Path) -> FakeCuda {
        // SAFETY: the fake's initialisers are Rust statics with no preconditions.
        let library = unsafe { libloading::Library::new(path) }
            .unwrap_or_else(|e| panic!("cannot open the fake driver {}: {e}", path.display()));
        FakeCuda { library }
    }

    /// The export `name` as a function pointer of type `F`.
    ///
    /// # Safety
    /// `F` must be the export's C signature.
    unsafe fn get<F: Copy>(&self, name: &[u8]) -> F {
        // SAFETY: the caller names the right type; the library stays open as long as `self`.
        match unsafe { self.library.get::<F>(name) } {
            Ok(f) => *f,
            Err(e) => panic!(
                "the fake driver has no {}: {e}",
                String::from_utf8_lossy(name)
            ),
        }
    }

    /// The address of the export `name`, as `dlsym` finds it.
    pub fn export_address(&self, name: &str) -> Option<usize> {
        let name = c_name(name);
        // SAFETY: the address is only returned as a number, never called or read here.
        let symbol = unsafe { self.library.get::<*mut c_void>(name.as_bytes_with_nul()) };
        symbol.ok().map(|s| s.addr())
    }

    /// Calls so far of `name`: a base symbol (`cuLaunchHostFunc`) counts every exported variant,
    /// an export name (`cuLaunchHostFunc_v2`, `cuStreamSynchronize_ptsz`) only itself.
    pub fn call_count(&self, name: &str) -> u64 {
        let name = c_name(name);
        // SAFETY: the signature of fake_cuda_call_count; `name` is NUL-terminated.
        unsafe {
            self.get::<unsafe extern "C" fn(*const c_char) -> u64>(b"fake_cuda_call_count")(
                name.as_ptr(),
            )
        }
    }

    /// Calls so far of `name` (as for [`call_count`](Self::call_count); `""` for every function)
    /// made on one of the fake's driver threads: a context's worker (inside a host function) or
    /// the user-object destructor thread, where the real driver does not allow CUDA calls.
    pub fn driver_thread_call_count(&self, name: &str) -> u64 {
        let name = c_name(name);
        // SAFETY: the signature of fake_cuda_driver_thread_call_count; `name` is NUL-terminated.
        unsafe {
            self.get::<unsafe extern "C" fn(*const c_char) -> u64>(
                b"fake_cuda_driver_thread_call_count",
            )(name.as_ptr())
        }
    }

    /// Every call counted so far (since the last [`reset_call_counts`](Self::reset_call_counts)),
    /// by export name: the export's base symbol and its count. What an operation called is the
    /// difference between two of these, or this after a reset.
    pub fn call_counts(&self) -> BTreeMap<String, ExportCalls> {
        type CallCounts = unsafe extern "C" fn(*mut c_char, usize) -> usize;
        // SAFETY: the signature of fake_cuda_call_counts.
        let counts = unsafe { self.get::<CallCounts>(b"fake_cuda_call_counts") };
        let mut buffer = vec![0u8; 4096];
        let len = loop {
            // SAFETY: `buffer` has `buffer.len()` writable bytes.
            let needed = unsafe { counts(buffer.as_mut_ptr().cast(), buffer.len()) };
            if needed < buffer.len() {
                break needed;
            }
            buffer.resize(needed + 1, 0);
        };
        String::from_utf8_lossy(&buffer[..len])
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(' ');
                let (export, base, count) = (fields.next()?, fields.next()?, fields.next()?);
                let calls = ExportCalls {
                    base: base.to_string(),
                    count: count.parse().ok()?,
                };
                Some((export.to_string(), calls))
            })
            .collect()
    }

    /// With `on`, only the calling thread's driver calls are counted ([`FakeCuda::call_counts`])
    /// and may meet a fault ([`FakeCuda::set_fault`]); the library's reaper and poller call the
    /// driver at moments of their own. With `!on`, every thread's again.
    pub fn focus_calls_on_this_thread(&self, on: bool) {
        // SAFETY: the signature of fake_cuda_focus_calls_on_this_thread.
        unsafe { self.get::<extern "C" fn(bool)>(b"fake_cuda_focus_calls_on_this_thread")(on) }
    }

    /// Live driver objects of `kind` in the fake: `streams`, `events`, `graphs`, `graph_execs`,
    /// `graph_nodes`, `contexts` (made with `cuCtxCreate`), `primary_retains` (of device 0),
    /// `holds`, `host_registrations` (`cuMemHostRegister`). For leak checks.
    pub fn live_objects(&self, kind: &str) -> u64 {
        let kind = c_name(kind);
        // SAFETY: the signature of fake_cuda_live_objects; `kind` is NUL-terminated.
        unsafe {
            self.get::<unsafe extern "C" fn(*const c_char) -> u64>(b"fake_cuda_live_objects")(
                kind.as_ptr(),
            )
        }
    }

    /// The depth of the calling thread's current-context stack in the fake.
    pub fn context_stack_depth(&self) -> u64 {
        // SAFETY: the signature of fake_cuda_context_stack_depth.
        unsafe { self.get::<extern "C" fn() -> u64>(b"fake_cuda_context_stack_depth")() }
    }

    /// Sets every call counter back to 0.
    pub fn reset_call_counts(&self) {
        // SAFETY: the signature of fake_cuda_reset_call_counts.
        unsafe { self.get::<extern "C" fn()>(b"fake_cuda_reset_call_counts")() }
    }

    /// Makes the `nth` call of `name` from now (1-based; 0 = every call) return `code` and do
    /// nothing else.
    pub fn set_fault(&self, name: &str, nth: u64, code: u32) {
        let name = c_name(name);
        // SAFETY: the signature of fake_cuda_set_fault; `name` is NUL-terminated.
        unsafe {
            self.get::<unsafe extern "C" fn(*const c_char, u64, u32)>(b"fake_cuda_set_fault")(
                name.as_ptr(),
                nth,
                code,
            )
        }
    }

    /// Makes the `nth` call of `name` from now (1-based; 0 = every call) first run `hook`, on the
    /// calling thread, before the call does anything else (an injected fault included); the hook
    /// may call the driver. Replaces an earlier hook of that name. (The hook is never freed: tests
    /// set few.)
    pub fn set_hook(&self, name: &str, nth: u64, hook: impl FnMut() + Send + 'static) {
        self.set_hook_at(b"fake_cuda_set_hook", name, nth, hook);
    }

    /// As [`FakeCuda::set_hook`], but the hook runs at the end of the call, once it has done
    /// everything but return.
    pub fn set_hook_after(&self, name: &str, nth: u64, hook: impl FnMut() + Send + 'static) {
        self.set_hook_at(b"fake_cuda_set_hook_after", name, nth, hook);
    }

    fn set_hook_at(
        &self,
        setter: &[u8],
        name: &str,
        nth: u64,
        hook: impl FnMut() + Send + 'static,
    ) {
        type Hook = Box<dyn FnMut() + Send>;
        extern "C" fn run(arg: *mut c_void) {
            // SAFETY: `arg` is the leaked `Hook` below, called by one driver call at a time (a test
            // sets a hook for calls it makes itself).
            let hook = unsafe { &mut *arg.cast::<Hook>() };
            hook();
        }
        /// Every hook set, kept reachable (a hook removed by the fake once it ran is not freed, and
        /// LeakSanitizer must not report it).
        static SET: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
        let hook: *mut Hook = Box::into_raw(Box::new(Box::new(hook)));
        SET.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(hook.expose_provenance());
        let name = c_name(name);
        type SetHook =
            unsafe extern "C" fn(*const c_char, u64, extern "C" fn(*mut c_void), *mut c_void);
        // SAFETY: the signature of both setters; `name` is NUL-terminated; `hook` lives for ever.
        unsafe { self.get::<SetHook>(setter)(name.as_ptr(), nth, run, hook.cast()) }
    }

    /// Removes every hook.
    pub fn clear_hooks(&self) {
        // SAFETY: the signature of fake_cuda_clear_hooks.
        unsafe { self.get::<extern "C" fn()>(b"fake_cuda_clear_hooks")() }
    }

    /// Removes every injected fault.
    pub fn clear_faults(&self) {
        // SAFETY: the signature of fake_cuda_clear_faults.
        unsafe { self.get::<extern "C" fn()>(b"fake_cuda_clear_faults")() }
    }

    /// Calls of `cuGetProcAddress` (`which` = 1) or `cuGetProcAddress_v2` (`which` = 2).
    pub fn proc_address_calls(&self, which: u32) -> u64 {
        // SAFETY: the signature of fake_cuda_proc_address_calls.
        unsafe { self.get::<extern "C" fn(u32) -> u64>(b"fake_cuda_proc_address_calls")(which) }
    }

    /// The flags of the last `cuGetProcAddress*` call: 1 legacy stream, 2 per-thread.
    pub fn last_proc_address_flags(&self) -> u64 {
        // SAFETY: the signature of fake_cuda_last_proc_address_flags.
        unsafe { self.get::<extern "C" fn() -> u64>(b"fake_cuda_last_proc_address_flags")() }
    }

    /// The `syncMode` the last `cuLaunchHostFunc_v2` call got (0 `CU_HOST_TASK_BLOCKING`, 1
    /// `CU_HOST_TASK_SPINWAIT`); `None` before any.
    pub fn last_launch_sync_mode(&self) -> Option<u32> {
        self.last_sync_mode(0)
    }

    /// The `syncMode` of the last host node added through `cuGraphAddNode`; `None` before any.
    pub fn last_host_node_sync_mode(&self) -> Option<u32> {
        self.last_sync_mode(1)
    }

    fn last_sync_mode(&self, which: u32) -> Option<u32> {
        // SAFETY: the signature of fake_cuda_last_sync_mode.
        let mode =
            unsafe { self.get::<extern "C" fn(u32) -> u32>(b"fake_cuda_last_sync_mode")(which) };
        (mode != u32::MAX).then_some(mode)
    }

    /// The `cudaVersion` of the last `cuGetProcAddress*` call.
    pub fn last_proc_address_version(&self) -> i32 {
        // SAFETY: the signature of fake_cuda_last_proc_address_version.
        unsafe { self.get::<extern "C" fn() -> i32>(b"fake_cuda_last_proc_address_version")() }
    }

    /// Blocks `stream` (0 / `CU_STREAM_LEGACY`: the current context's legacy stream) behind "device
    /// work" until [`release_hold`](Self::release_hold): the stand-in for a long-running kernel.
    /// Returns the token (0 if the stream is invalid or capturing).
    pub fn hold_stream(&self, stream: CUstream) -> u64 {
        // SAFETY: the signature of fake_cuda_hold_stream.
        unsafe { self.get::<extern "C" fn(CUstream) -> u64>(b"fake_cuda_hold_stream")(stream) }
    }

    /// The next `count` capture queries of a capturing stream answer "not capturing" (a capture
    /// begun by another thread just after the query).
    pub fn hide_capture(&self, count: u64) {
        // SAFETY: the signature of fake_cuda_hide_capture.
        unsafe { self.get::<extern "C" fn(u64)>(b"fake_cuda_hide_capture")(count) }
    }

    /// Whether `cuCtxCreate` reuses the handle of the context destroyed last.
    pub fn reuse_context_handles(&self, on: bool) {
        // SAFETY: the signature of fake_cuda_reuse_context_handles.
        unsafe { self.get::<extern "C" fn(u32)>(b"fake_cuda_reuse_context_handles")(u32::from(on)) }
    }

    /// Lets a held stream continue.
    pub fn release_hold(&self, token: u64) {
        // SAFETY: the signature of fake_cuda_release_hold.
        unsafe { self.get::<extern "C" fn(u64)>(b"fake_cuda_release_hold")(token) }
    }

    /// A sticky error in `ctx` (null: the current context), as after a trapping kernel: its host
    /// functions never run again, pending ones included; synchronize and query calls return 719.
    pub fn poison_context(&self, ctx: CUcontext) -> CUresult {
        // SAFETY: the signature of fake_cuda_poison_context.
        unsafe {
            self.get::<extern "C" fn(CUcontext) -> CUresult>(b"fake_cuda_poison_context")(ctx)
        }
    }

    /// Host functions of `ctx` (null: every context) enqueued and not yet finished.
    pub fn pending_host_functions(&self, ctx: CUcontext) -> u64 {
        // SAFETY: the signature of fake_cuda_pending_host_functions.
        unsafe {
            self.get::<extern "C" fn(CUcontext) -> u64>(b"fake_cuda_pending_host_functions")(ctx)
        }
    }

    /// User objects whose destructor has not returned yet.
    pub fn live_user_objects(&self) -> u64 {
        // SAFETY: the signature of fake_cuda_live_user_objects.
        unsafe { self.get::<extern "C" fn() -> u64>(b"fake_cuda_live_user_objects")() }
    }

    /// User objects that still have a reference: their destructor has not been queued yet. Drops
    /// with the call that releases the last reference (unlike
    /// [`live_user_objects`](Self::live_user_objects), which waits for the destructor to return).
    pub fn referenced_user_objects(&self) -> u64 {
        // SAFETY: the signature of fake_cuda_referenced_user_objects.
        unsafe { self.get::<extern "C" fn() -> u64>(b"fake_cuda_referenced_user_objects")() }
    }

    /// Driver threads (one per context that has had stream work) running now.
    pub fn driver_thread_count(&self) -> u64 {
        // SAFETY: the signature of fake_cuda_driver_thread_count.
        unsafe { self.get::<extern "C" fn() -> u64>(b"fake_cuda_driver_thread_count")() }
    }

    /// The calling thread's stream-capture interaction mode, as the fake keeps it: 0 `GLOBAL` (the
    /// default), 1 `THREAD_LOCAL`, 2 `RELAXED`.
    pub fn capture_interaction_mode(&self) -> u32 {
        // SAFETY: the signature of fake_cuda_capture_interaction_mode.
        unsafe { self.get::<extern "C" fn() -> u32>(b"fake_cuda_capture_interaction_mode")() }
    }

    /// Driver calls made after the fake's teardown at process exit (an exit handler registered at
    /// the first `cuInit`; see `tests/fake-cuda/src/teardown.rs`).
    pub fn calls_after_teardown(&self) -> u64 {
        // SAFETY: the signature of fake_cuda_calls_after_teardown.
        unsafe { self.get::<extern "C" fn() -> u64>(b"fake_cuda_calls_after_teardown")() }
    }

    /// Whether the fake's teardown at process exit has run.
    pub fn torn_down(&self) -> bool {
        // SAFETY: the signature of fake_cuda_torn_down.
        unsafe { self.get::<extern "C" fn() -> u32>(b"fake_cuda_torn_down")() != 0 }
    }

    /// Changes the version the fake reports and gates `cuGetProcAddress` on.
    pub fn set_version(&self, version: i32) {
        // SAFETY: the signature of fake_cuda_set_version.
        unsafe { self.get::<extern "C" fn(i32)>(b"fake_cuda_set_version")(version) }
    }

    /// Replaces the list of base symbols `cuGetProcAddress` claims not to know.
    pub fn set_missing(&self, symbols: &[&str]) {
        let list = c_name(&symbols.join(","));
        // SAFETY: the signature of fake_cuda_set_missing; `list` is NUL-terminated.
        unsafe {
            self.get::<unsafe extern "C" fn(*const c_char)>(b"fake_cuda_set_missing")(list.as_ptr())
        }
    }

    /// Turns stub behaviour (every driver call returns 34) on or off.
    pub fn set_stub(&self, on: bool) {
        // SAFETY: the signature of fake_cuda_set_stub.
        unsafe { self.get::<extern "C" fn(u32)>(b"fake_cuda_set_stub")(u32::from(on)) }
    }

    /// Waits until `done()` holds, or panics after `timeout` with `what`.
    pub fn wait_until(&self, what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The environment variable that tells a re-executed test binary which test it is to run itself.
pub const ISOLATED_TEST_ENV: &str = "CUDA_WORKSPACE_ISOLATED_TEST";

/// How long an isolated test may run before it is killed: `CUDA_WORKSPACE_TEST_TIMEOUT_SECS`, or
/// 120 seconds.
fn child_timeout() -> Duration {
    let secs = std::env::var("CUDA_WORKSPACE_TEST_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    Duration::from_secs(secs)
}

/// Whether the environment variable is one the driver or the fake reads, which an isolated test
/// must not inherit by accident.
fn driver_variable(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with("CUDA_SYS_") || name.starts_with("FAKE_CUDA_")
}

/// Runs `body` in a process of its own with `envs` set (and no other `CUDA_SYS_*` or
/// `FAKE_CUDA_*` variable), and fails if it fails.
///
/// The test binary runs itself again with `<test_name> --exact --nocapture --test-threads=1` and
/// [`ISOLATED_TEST_ENV`] set to `test_name`; in that child, this same call sees the marker and
/// runs `body`. `test_name` must be the test's full path in its binary (`module::name`, without
/// the crate name): [`isolated_test!`](crate::isolated_test) gets it right by construction. The parent shows the child's
/// output if it fails, and kills it after two minutes (`CUDA_WORKSPACE_TEST_TIMEOUT_SECS`).
///
/// # Panics
/// In the parent, if the child fails, times out, or did not run exactly that test.
pub fn in_own_process<K, V>(test_name: &str, envs: &[(K, V)], body: impl FnOnce())
where
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    if std::env::var_os(ISOLATED_TEST_ENV).is_some_and(|marker| marker == test_name) {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the path of the running test binary");
    let mut command = Command::new(&exe);
    command
        .args([
            test_name,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, _) in std::env::vars_os().filter(|(name, _)| driver_variable(name)) {
        command.env_remove(name);
    }
    command.env(ISOLATED_TEST_ENV, test_name);
    for (name, value) in envs {
        command.env(name, value);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {} for {test_name}: {e}", exe.display()));
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + child_timeout();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    let ran_it = stdout.contains("running 1 test") && stdout.contains(" 1 passed");
    let verdict = match status {
        None => Some(format!("timed out after {:?}", child_timeout())),
        Some(status) if !status.success() => Some(format!("failed ({status})")),
        Some(_) if !ran_it => {
            Some("did not run exactly this test (is the name its full path in the binary?)".into())
        }
        Some(_) => None,
    };
    if let Some(verdict) = verdict {
        panic!(
            "isolated test {test_name:?} {verdict}; env {:?}\n--- child stdout ---\n{stdout}\n--- child \
             stderr ---\n{stderr}",
            envs.iter()
                .map(|(k, v)| format!("{}={}", k.as_ref().display(), v.as_ref().display()))
                .collect::<Vec<_>>()
        );
    }
    print!("{stdout}");
    eprint!("{stderr}");
}

/// The path libtest knows a test by: `module_path` without the crate name, then `name`.
pub fn test_path(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_crate, rest)) => format!("{rest}::{name}"),
        None => name.to_string(),
    }
}

/// Defines a `#[test]` that runs in a process of its own (see [`in_own_process`]), with the
/// environment variables written as its "parameters":
///
/// ```no_run
/// # use cuda_workspace::isolated_test;
/// # use cuda_workspace::testing::fake_driver_path;
/// isolated_test! {
///     /// The stub is recognised.
///     fn stub_is_reported(FAKE_CUDA_STUB = "1", CUDA_SYS_LIBRARY = fake_driver_path()) {
///         assert!(cuda_sys::driver().is_err());
///     }
/// }
/// # fn main() {}
/// ```
///
/// Each value is any expression with `AsRef<OsStr>`, evaluated in the parent process.
#[macro_export]
macro_rules! isolated_test {
    ($(
        $(#[$attr:meta])*
        fn $name:ident($($key:ident = $value:expr),* $(,)?) $body:block
    )*) => {$(
        $(#[$attr])*
        #[test]
        fn $name() {
            let envs: &[(&str, ::std::ffi::OsString)] = &[$((
                stringify!($key),
                ::std::ffi::OsString::from(::std::convert::AsRef::<::std::ffi::OsStr>::as_ref(&$value)),
            )),*];
            $crate::testing::in_own_process(
                &$crate::testing::test_path(module_path!(), stringify!($name)),
                envs,
                || $body,
            );
        }
    )*};
}

#[cfg(test)]
mod tests {
    use super::test_path;

    #[test]
    fn test_paths_drop_the_crate_name() {
        assert_eq!(test_path("driver_loading", "loads"), "loads");
        assert_eq!(test_path("driver_loading::inner", "loads"), "inner::loads");
    }
}
