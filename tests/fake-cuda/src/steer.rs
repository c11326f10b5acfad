//! The typed Rust API for tests that use the fake driver: find the library, point a binding at
//! it, configure it before it loads, and steer it while it runs.
//!
//! Everything here reaches the fake **through the shared library** (`libfake_cuda.so`), never
//! through this crate's own copy of the code: a test binary that links this crate as an `rlib`
//! also contains the driver's code, but the driver that the code under test calls is the one the
//! system loader mapped from the `cdylib`, and [`FakeCuda`] opens that same file again, so it sees
//! (and changes) that driver's state.
//!
//! ```no_run
//! use fake_cuda::steer::{self, FakeCuda};
//!
//! // Before the code under test first touches the driver:
//! let library = steer::locate().expect("cargo builds the cdylib beside the test binary");
//! // SAFETY: no other thread reads or writes the environment yet.
//! unsafe { std::env::set_var("CUDA_DL_SYS_LIBRARY", &library) }; // for cuda-dl-sys
//! // For a binding that opens `libcuda.so.1` by name (cudarc...), put this folder first on
//! // LD_LIBRARY_PATH of a child process (the loader reads it at process start):
//! let folder = steer::libcuda_folder(&library, &std::env::temp_dir().join("fake-libcuda"))?;
//!
//! let fake = FakeCuda::open(&library)?;
//! fake.set_version(12040); // report CUDA 12.4
//! fake.set_fault("cuLaunchHostFunc", 2, 2); // the 2nd launch from now: CUDA_ERROR_OUT_OF_MEMORY
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::ffi::{CString, OsString, c_char, c_void};
use std::fmt;
use std::path::{Path, PathBuf};

use cuda_dl_sys::types::{CUcontext, CUresult, CUstream};

/// The environment variable that, when set, names the fake library's path for [`locate`].
pub const LIBRARY_ENV: &str = "FAKE_CUDA_LIBRARY";

/// The fake driver's file name on this platform: `libfake_cuda.so` on Linux.
pub fn library_file_name() -> String {
    format!(
        "{}fake_cuda{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// Why the fake could not be found or opened.
#[derive(Debug)]
pub enum FakeError {
    /// Not at any of these paths.
    NotFound {
        /// Every path looked at.
        tried: Vec<PathBuf>,
    },
    /// Found, but the system loader refused it, or it lacks a control function (an older fake).
    Open {
        /// The library.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The `libcuda.so.1` link could not be made.
    Io(std::io::Error),
    /// This platform is not Linux: the fake builds everywhere (so that a crate with `fake-cuda`
    /// in its dev-dependencies builds its tests on any platform), but runs on Linux only.
    Unsupported,
}

impl fmt::Display for FakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FakeError::NotFound { tried } => write!(
                f,
                "the fake CUDA driver ({}) was not found; looked at {}. Add `fake-cuda` to your \
                 [dev-dependencies] (Cargo then builds the library beside your test binaries), \
                 build it with `cargo build -p fake-cuda` (target/<profile>/{}), or set \
                 {LIBRARY_ENV} to its path",
                library_file_name(),
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                library_file_name(),
            ),
            FakeError::Open { path, message } => {
                write!(
                    f,
                    "cannot open the fake driver {}: {message}",
                    path.display()
                )
            }
            FakeError::Io(e) => write!(f, "cannot make the libcuda.so.1 link: {e}"),
            FakeError::Unsupported => write!(
                f,
                "the fake CUDA driver runs on Linux only, and this is {}: run these tests on \
                 Linux (or skip them here with #[cfg(target_os = \"linux\")])",
                std::env::consts::OS
            ),
        }
    }
}

impl std::error::Error for FakeError {}

/// The fake library: [`LIBRARY_ENV`] if set, else where Cargo builds it for the running
/// executable: beside it, in its `deps/`, in `../deps/` or in `..` (Cargo puts test binaries in
/// `target/<profile>/deps/` and examples in `target/<profile>/examples/`; it builds the library
/// into `target/<profile>/deps/` when `fake-cuda` is a dependency, and also into
/// `target/<profile>/` with `cargo build -p fake-cuda`); else in a folder of `LD_LIBRARY_PATH`
/// (where Cargo puts `target/<profile>/deps/` for doc tests, which run from a temporary folder).
///
/// # Errors
/// [`FakeError::NotFound`] if it is in none of those places; [`FakeError::Unsupported`] on a
/// platform other than Linux, where the fake does not run.
pub fn locate() -> Result<PathBuf, FakeError> {
    if !cfg!(target_os = "linux") {
        return Err(FakeError::Unsupported);
    }
    if let Some(path) = std::env::var_os(LIBRARY_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(FakeError::NotFound { tried: vec![path] })
        };
    }
    let exe = std::env::current_exe().map_err(FakeError::Io)?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let name = library_file_name();
    let mut tried = vec![
        dir.join(&name),
        dir.join("deps").join(&name),
        dir.join("..").join("deps").join(&name),
        dir.join("..").join(&name),
    ];
    // Doc tests run from a temporary folder, with Cargo's `target/<profile>/deps` on the loader's
    // path.
    if let Some(search) = std::env::var_os("LD_LIBRARY_PATH") {
        tried.extend(
            std::env::split_paths(&search)
                .filter(|folder| !folder.as_os_str().is_empty())
                .map(|folder| folder.join(&name)),
        );
    }
    match tried.iter().find(|p| p.is_file()) {
        Some(found) => Ok(found.canonicalize().unwrap_or_else(|_| found.clone())),
        None => Err(FakeError::NotFound { tried }),
    }
}

/// Makes `folder` (created if needed) hold `libcuda.so.1` and `libcuda.so`, symbolic links to
/// `library`, and returns it: put it first on `LD_LIBRARY_PATH` of a process (the loader reads the
/// variable when the process starts, so a child process) and any binding that opens the driver by
/// name loads the fake.
///
/// # Errors
/// [`FakeError::Io`] if the folder or the links cannot be made; [`FakeError::Unsupported`] on a
/// platform other than Linux, where the fake does not run.
///
/// Processes may make the same folder at once: each link is made under a name of its own and
/// renamed into place.
pub fn libcuda_folder(library: &Path, folder: &Path) -> Result<PathBuf, FakeError> {
    #[cfg(target_os = "linux")]
    return linux_libcuda_folder(library, folder);
    #[cfg(not(target_os = "linux"))]
    return {
        let _ = (library, folder);
        Err(FakeError::Unsupported)
    };
}

/// [`libcuda_folder`], on Linux.
#[cfg(target_os = "linux")]
fn linux_libcuda_folder(library: &Path, folder: &Path) -> Result<PathBuf, FakeError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    std::fs::create_dir_all(folder).map_err(FakeError::Io)?;
    for name in ["libcuda.so.1", "libcuda.so"] {
        let own = folder.join(format!(
            ".{name}.{}.{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&own);
        std::os::unix::fs::symlink(library, &own).map_err(FakeError::Io)?;
        std::fs::rename(&own, folder.join(name)).map_err(FakeError::Io)?;
    }
    Ok(folder.to_path_buf())
}

/// The fake's configuration at load, as environment variables for a process that has not loaded
/// it yet (a child, or this one before its first driver call). Unset fields keep the defaults.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// `cuDriverGetVersion`'s answer, `1000 * major + 10 * minor` (default 13000).
    pub version: Option<i32>,
    /// Devices (default 1).
    pub devices: Option<i32>,
    /// Behave like the toolkit's stub `libcuda.so`: every call returns 34.
    pub stub: bool,
    /// Base symbols `cuGetProcAddress` claims not to know.
    pub missing: Vec<String>,
    /// Faults: `(name, nth call or 0 for every call, result code)`.
    pub faults: Vec<(String, u64, u32)>,
}

impl Config {
    /// The variables: `FAKE_CUDA_VERSION`, `FAKE_CUDA_DEVICES`, `FAKE_CUDA_STUB`,
    /// `FAKE_CUDA_MISSING`, `FAKE_CUDA_FAIL`.
    pub fn vars(&self) -> Vec<(&'static str, OsString)> {
        let mut vars = Vec::new();
        if let Some(version) = self.version {
            vars.push(("FAKE_CUDA_VERSION", version.to_string().into()));
        }
        if let Some(devices) = self.devices {
            vars.push(("FAKE_CUDA_DEVICES", devices.to_string().into()));
        }
        if self.stub {
            vars.push(("FAKE_CUDA_STUB", "1".into()));
        }
        if !self.missing.is_empty() {
            vars.push(("FAKE_CUDA_MISSING", self.missing.join(",").into()));
        }
        if !self.faults.is_empty() {
            let faults: Vec<String> = self
                .faults
                .iter()
                .map(|(name, nth, code)| format!("{name}@{nth}={code}"))
                .collect();
            vars.push(("FAKE_CUDA_FAIL", faults.join(",").into()));
        }
        vars
    }

    /// Sets [`vars`](Self::vars) on `command`.
    pub fn apply(&self, command: &mut std::process::Command) {
        command.envs(self.vars());
    }
}

/// A hold on a stream: "device work" that blocks it until [`FakeCuda::release_hold`] (or
/// [`Hold::release`]). Dropping it releases it.
#[derive(Debug)]
pub struct Hold<'a> {
    fake: &'a FakeCuda,
    token: u64,
}

impl Hold<'_> {
    /// The fake's token for it.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// Lets the stream continue.
    pub fn release(self) {}

    /// Gives up the guard but not the hold: the stream stays held until
    /// [`FakeCuda::release_hold`] with the returned token, or for good (a test that leaves work
    /// pending at process exit, say).
    pub fn into_token(self) -> u64 {
        std::mem::ManuallyDrop::new(self).token
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.fake.release_hold(self.token);
    }
}

/// Calls of one export name, as [`FakeCuda::export_calls`] lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportCalls {
    /// The base symbol it is a variant of (`cuLaunchHostFunc` for `cuLaunchHostFunc_v2`): a fault
    /// or a hook set on the base name hits every variant, one set on the export name only this one.
    pub base: String,
    /// Calls so far.
    pub count: u64,
}

/// The loaded fake driver's control functions, through the shared library.
///
/// Holding one also keeps the fake mapped when a binding's loader rejects the library and closes
/// its own handle (the stub, a failing `cuInit`): open it first in such a test, or the fake's
/// state (its counters, say) goes with the library.
pub struct FakeCuda {
    library: libloading::Library,
    path: PathBuf,
}

impl fmt::Debug for FakeCuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeCuda")
            .field("path", &self.path)
            .finish()
    }
}

/// `name` as a C string (any NUL byte in it dropped).
fn c_name(name: &str) -> CString {
    CString::new(name.replace('\0', "")).unwrap_or_default()
}

/// The control function `$export` of `$fake`'s library, as a function pointer of type `$f`.
///
/// `$f` is checked at compile time to be the type of this crate's own `control::$export`: the
/// library is this crate built as a `cdylib`, so the export has that signature.
///
/// # Panics
/// If the library has no such export (a fake older than this crate).
macro_rules! control {
    ($fake:expr, $export:ident: $f:ty) => {{
        const _: $f = crate::control::$export;
        // SAFETY: `$f` is the signature of `control::$export` (the constant above does not compile
        // otherwise), which the library exports under that name.
        unsafe { $fake.get::<$f>(concat!(stringify!($export), "\0").as_bytes()) }
    }};
}

/// Defines methods of [`FakeCuda`] that call a control function with their arguments and return
/// its result, both as they are: `fn name(arguments) -> result = export;`.
macro_rules! plain_controls {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? = $export:ident;
    )*) => {
        impl FakeCuda {$(
            $(#[$doc])*
            pub fn $name(&self, $($arg: $ty),*) $(-> $ret)? {
                control!(self, $export: extern "C" fn($($ty),*) $(-> $ret)?)($($arg),*)
            }
        )*}
    };
}

impl FakeCuda {
    /// The export `name` (NUL-terminated) as a function pointer of type `F` (through `control!`,
    /// which checks `F`).
    ///
    /// # Safety
    /// `F` must be the export's C signature (see `src/control.rs`).
    ///
    /// # Panics
    /// If the library has no such export (a fake older than this crate).
    unsafe fn get<F: Copy>(&self, name: &[u8]) -> F {
        // SAFETY: the caller names the right type; the library stays open as long as `self`.
        match unsafe { self.library.get::<F>(name) } {
            Ok(f) => *f,
            Err(e) => panic!(
                "the fake driver has no {}: {e}",
                String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name))
            ),
        }
    }

    /// Opens the fake library at `path` (the copy already loaded, if the process loaded it:
    /// open the same path the binding loads).
    ///
    /// # Errors
    /// [`FakeError::Open`] if the loader refuses it or it is not the fake.
    pub fn open(path: &Path) -> Result<FakeCuda, FakeError> {
        let open_error = |message: String| FakeError::Open {
            path: path.to_path_buf(),
            message,
        };
        // SAFETY: the fake's initialisers are Rust statics with no preconditions.
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|e| open_error(e.to_string()))?;
        // SAFETY: only checks that the symbol exists.
        unsafe { library.get::<*mut c_void>(b"fake_cuda_set_fault\0") }
            .map_err(|_| open_error("not the fake driver (no fake_cuda_set_fault)".into()))?;
        Ok(FakeCuda {
            library,
            path: path.to_path_buf(),
        })
    }

    /// [`locate`], then [`open`](Self::open).
    ///
    /// # Errors
    /// As both.
    pub fn locate_and_open() -> Result<FakeCuda, FakeError> {
        FakeCuda::open(&locate()?)
    }

    /// The library's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The address of the export `name` (a driver function such as `cuLaunchHostFunc_v2`, or a
    /// control function) as `dlsym` finds it, to compare with what a binding resolved; `None` if
    /// the library does not export it.
    pub fn export_address(&self, name: &str) -> Option<usize> {
        let name = c_name(name);
        // SAFETY: the address is only returned as a number, never called or read here.
        let symbol = unsafe { self.library.get::<*mut c_void>(name.as_bytes_with_nul()) };
        symbol.ok().map(|s| s.addr())
    }

    /// Turns stub behaviour (every driver call returns 34, `CUDA_ERROR_STUB_LIBRARY`) on or off.
    pub fn set_stub(&self, on: bool) {
        control!(self, fake_cuda_set_stub: extern "C" fn(u32))(u32::from(on))
    }

    /// Replaces the list of base symbols `cuGetProcAddress` claims not to know (every function
    /// stays exported: `dlsym` still finds it).
    pub fn set_missing(&self, symbols: &[&str]) {
        let list = c_name(&symbols.join(","));
        let f = control!(self, fake_cuda_set_missing: unsafe extern "C" fn(*const c_char));
        // SAFETY: a NUL-terminated list.
        unsafe { f(list.as_ptr()) }
    }

    /// Makes the `nth` call of `name` from now (1-based; 0: every call) return `code` and do
    /// nothing else. `name` is a base symbol (`cuLaunchHostFunc`: every variant) or an export name
    /// (`cuLaunchHostFunc_v2`: that one). Replaces an earlier fault of that name.
    pub fn set_fault(&self, name: &str, nth: u64, code: u32) {
        let name = c_name(name);
        let f = control!(self, fake_cuda_set_fault: unsafe extern "C" fn(*const c_char, u64, u32));
        // SAFETY: a NUL-terminated name.
        unsafe { f(name.as_ptr(), nth, code) }
    }

    /// Makes `cuGetProcAddress*` register the variant of `symbol` (a base symbol) that the fake
    /// lists at ABI `version` at `registered` instead: a driver that registers a variant at
    /// another version than the headers' typedef says. `register_variant_at("cuLaunchHostFunc",
    /// 13020, 13030)` on a 13.3 driver answers a request at 13020 with the three-argument 10.0
    /// variant. `registered` = `version` undoes it, as does
    /// [`reset_steering`](Self::reset_steering).
    pub fn register_variant_at(&self, symbol: &str, version: i32, registered: i32) {
        let set = control!(self, fake_cuda_register_variant_at: unsafe extern "C" fn(*const c_char, i32, i32));
        let symbol = c_name(symbol);
        // SAFETY: `symbol` is NUL-terminated.
        unsafe { set(symbol.as_ptr(), version, registered) }
    }

    /// Makes the `nth` call of `name` from now (1-based; 0: every call) first run `hook`, on the
    /// calling thread, before the call does anything else (an injected fault included). `name`
    /// is a base symbol or an export name, as for [`set_fault`](Self::set_fault). Replaces an
    /// earlier hook of that name; a hook for one call is removed once it ran.
    ///
    /// The hook runs with no lock of the fake held, so it may call the driver (the code under
    /// test's next step, another thread's capture beginning inside a launch...). It must not
    /// panic: it is called from C, and a panic there aborts the process. It is never freed (a
    /// test sets few); it stays reachable, so leak checkers do not report it.
    pub fn set_hook(&self, name: &str, nth: u64, hook: impl Fn() + Send + Sync + 'static) {
        let setter = control!(self, fake_cuda_set_hook: SetHook);
        set_hook_with(setter, name, nth, hook);
    }

    /// As [`set_hook`](Self::set_hook), but the hook runs at the end of the call, once it has done
    /// everything but return, whatever it returns; a call refused by an injected fault does not
    /// reach it.
    pub fn set_hook_after(&self, name: &str, nth: u64, hook: impl Fn() + Send + Sync + 'static) {
        let setter = control!(self, fake_cuda_set_hook_after: SetHook);
        set_hook_with(setter, name, nth, hook);
    }

    /// Blocks `stream` (null or `CU_STREAM_LEGACY`: the current context's legacy stream;
    /// `CU_STREAM_PER_THREAD`: the calling thread's) with "device work" until the hold is released
    /// (dropped, or [`release_hold`](Self::release_hold) with its [`Hold::into_token`]), like a
    /// spinning kernel; other streams keep running. `None` if the stream is invalid or capturing.
    pub fn hold_stream(&self, stream: CUstream) -> Option<Hold<'_>> {
        let token = control!(self, fake_cuda_hold_stream: extern "C" fn(CUstream) -> u64)(stream);
        (token != 0).then_some(Hold { fake: self, token })
    }

    /// With `on`, `cuCtxCreate` from now on gives a new context the handle of the context most
    /// recently destroyed with `cuCtxDestroy`, as the real driver may (its handles are heap
    /// addresses); with `!on`, fresh handles again. The new context is a different context all
    /// the same: its own streams, its own `cuCtxGetId`.
    pub fn reuse_context_handles(&self, on: bool) {
        control!(self, fake_cuda_reuse_context_handles: extern "C" fn(u32))(u32::from(on))
    }

    /// Gives `ctx` (null: the current context) a sticky error, as a trapping kernel does: its host
    /// functions never run again (pending ones included), synchronize and query calls return
    /// 719, and launches return success until one of those has reported the error, 719 after.
    /// Cleared by a reset or the last release of a primary context.
    ///
    /// # Errors
    /// The driver's code for an invalid context (201).
    pub fn poison_context(&self, ctx: CUcontext) -> Result<(), CUresult> {
        let poison = control!(self, fake_cuda_poison_context: extern "C" fn(CUcontext) -> CUresult);
        match poison(ctx) {
            CUresult::CUDA_SUCCESS => Ok(()),
            code => Err(code),
        }
    }

    /// Calls so far of `name`: a base symbol (`cuLaunchHostFunc`) counts every exported variant,
    /// an export name (`cuLaunchHostFunc_v2`, `cuStreamSynchronize_ptsz`) only itself. Faulted
    /// and stub calls count.
    pub fn call_count(&self, name: &str) -> u64 {
        let name = c_name(name);
        let f = control!(self, fake_cuda_call_count: unsafe extern "C" fn(*const c_char) -> u64);
        // SAFETY: a NUL-terminated name.
        unsafe { f(name.as_ptr()) }
    }

    /// Calls of `name` (as for [`call_count`](Self::call_count); `""`: of any function) made on
    /// the fake's own threads (a context's worker, inside a host function, or the user-object
    /// destructor thread), where the real driver forbids CUDA calls.
    pub fn driver_thread_call_count(&self, name: &str) -> u64 {
        let name = c_name(name);
        let f = control!(
            self,
            fake_cuda_driver_thread_call_count: unsafe extern "C" fn(*const c_char) -> u64
        );
        // SAFETY: a NUL-terminated name.
        unsafe { f(name.as_ptr()) }
    }

    /// Every call counted since the last [`reset_call_counts`](Self::reset_call_counts), by
    /// export name. What an operation called is the difference between two of these, or this
    /// after a reset.
    pub fn call_counts(&self) -> BTreeMap<String, u64> {
        self.export_calls()
            .into_iter()
            .map(|(export, calls)| (export, calls.count))
            .collect()
    }

    /// As [`call_counts`](Self::call_counts), with the base symbol of each export name.
    pub fn export_calls(&self) -> BTreeMap<String, ExportCalls> {
        let counts = control!(
            self,
            fake_cuda_call_counts: unsafe extern "C" fn(*mut c_char, usize) -> usize
        );
        read_text(counts)
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

    /// The `syncMode` the last `cuLaunchHostFunc_v2` call got (0 `CU_HOST_TASK_BLOCKING`, 1
    /// `CU_HOST_TASK_SPINWAIT`); `None` before any.
    pub fn last_launch_sync_mode(&self) -> Option<u32> {
        self.last_sync_mode(0)
    }

    /// The `syncMode` of the last host node added through `cuGraphAddNode` (as for
    /// [`last_launch_sync_mode`](Self::last_launch_sync_mode)); `None` before any.
    pub fn last_host_node_sync_mode(&self) -> Option<u32> {
        self.last_sync_mode(1)
    }

    /// `fake_cuda_last_sync_mode(which)`, with `None` for its "none yet".
    fn last_sync_mode(&self, which: u32) -> Option<u32> {
        let mode = control!(self, fake_cuda_last_sync_mode: extern "C" fn(u32) -> u32)(which);
        (mode != u32::MAX).then_some(mode)
    }

    /// Live driver objects of `kind`: `streams`, `events`, `graphs`, `graph_execs`,
    /// `graph_nodes`, `contexts` (made with `cuCtxCreate`), `primary_retains` (of device 0),
    /// `holds`, `host_registrations` (`cuMemHostRegister`), `device_allocations` (`cuMemAlloc`,
    /// `cuMemAllocAsync`: a `cuMemFreeAsync` counts once the stream got to it),
    /// `host_allocations` (page-locked: `cuMemHostAlloc`, `cuMemAllocHost`), `user_objects`; 0
    /// for an unknown kind. For leak checks ([`fixture::LiveObjects`](crate::fixture::LiveObjects)
    /// takes them all at once; with `cuda-host-launch`, after its `quiesce`).
    pub fn live_objects(&self, kind: &str) -> u64 {
        let kind = c_name(kind);
        let f = control!(self, fake_cuda_live_objects: unsafe extern "C" fn(*const c_char) -> u64);
        // SAFETY: a NUL-terminated kind.
        unsafe { f(kind.as_ptr()) }
    }

    /// Whether the fake's teardown at process exit has run (see
    /// [`calls_after_teardown`](Self::calls_after_teardown)).
    pub fn torn_down(&self) -> bool {
        control!(self, fake_cuda_torn_down: extern "C" fn() -> u32)() != 0
    }

    /// How far the stream with `cuStreamGetId` `stream_id` got, for an oracle: operations
    /// enqueued in stream order and completed by its driver thread (see [`StreamProgress`]).
    /// `None` if it never had work. Kept after the stream is destroyed.
    pub fn stream_progress(&self, stream_id: u64) -> Option<StreamProgress> {
        let f = control!(self, fake_cuda_stream_progress: unsafe extern "C" fn(u64, *mut u64, *mut u64) -> u32);
        let (mut enqueued, mut completed) = (0, 0);
        // SAFETY: valid places to write.
        let known = unsafe { f(stream_id, &mut enqueued, &mut completed) } != 0;
        known.then_some(StreamProgress {
            enqueued,
            completed,
        })
    }

    /// Driver calls made after the fake's teardown at process exit by threads whose name, as the
    /// operating system knows it (15 bytes on Linux), starts with `prefix`.
    pub fn calls_after_teardown_by(&self, prefix: &str) -> u64 {
        let prefix = c_name(prefix);
        let f = control!(self, fake_cuda_calls_after_teardown_by: unsafe extern "C" fn(*const c_char) -> u64);
        // SAFETY: a NUL-terminated prefix.
        unsafe { f(prefix.as_ptr()) }
    }

    /// The driver calls made after the fake's teardown, as text: one line `thread export` per
    /// call (the first 1000), then the stack of the first one by a thread whose name starts with
    /// `cuda-h` (`cuda-host-launch`'s threads). For the message of a failed exit check.
    pub fn after_teardown_report(&self) -> String {
        let report = control!(
            self,
            fake_cuda_after_teardown_report: unsafe extern "C" fn(*mut c_char, usize) -> usize
        );
        read_text(report)
    }

    /// Whether the context with `cuCtxGetId` `id` has had a sticky error (see
    /// [`poison_context`](Self::poison_context)): it lives with it, or died with it (a reset or
    /// destroy does not make the answer `false`; the context made again has another id).
    pub fn context_poisoned(&self, id: u64) -> bool {
        control!(self, fake_cuda_context_poisoned: extern "C" fn(u64) -> u32)(id) != 0
    }

    /// Whether a usable context has the `cuCtxGetId` `id`. A context destroyed, or a primary
    /// context released for the last time or reset, lives no more: made again, it has another id.
    pub fn context_alive(&self, id: u64) -> bool {
        control!(self, fake_cuda_context_alive: extern "C" fn(u64) -> u32)(id) != 0
    }

    /// How many prohibited calls invalidated a capture (see the crate docs on capture-interaction
    /// modes) from a thread whose name, as the operating system knows it (15 bytes on Linux),
    /// starts with `prefix`: for checks that a library's own threads never break a user's capture.
    pub fn invalidations_by(&self, prefix: &str) -> u64 {
        let prefix = c_name(prefix);
        let f =
            control!(self, fake_cuda_invalidations_by: unsafe extern "C" fn(*const c_char) -> u64);
        // SAFETY: a NUL-terminated prefix.
        unsafe { f(prefix.as_ptr()) }
    }
}

/// How far a stream got ([`FakeCuda::stream_progress`]): operation `n` (counted from 1 in the
/// order of enqueue) has completed once `completed >= n`; every operation enqueued before a moment
/// when `enqueued` was `e` has completed once `completed >= e`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamProgress {
    /// Operations enqueued in stream order (not counting captured ones, which are graph nodes).
    pub enqueued: u64,
    /// Operations the driver thread finished (none after a sticky error).
    pub completed: u64,
}

/// The signature of `fake_cuda_set_hook` and `fake_cuda_set_hook_after`.
type SetHook = unsafe extern "C" fn(*const c_char, u64, extern "C" fn(*mut c_void), *mut c_void);

/// Sets `hook` for `name` and `nth` through `setter` (see [`FakeCuda::set_hook`]).
fn set_hook_with(setter: SetHook, name: &str, nth: u64, hook: impl Fn() + Send + Sync + 'static) {
    type Hook = Box<dyn Fn() + Send + Sync>;
    extern "C" fn run(arg: *mut c_void) {
        // SAFETY: `arg` is a leaked `Hook` below, never freed; only shared references to it are
        // made, and it is `Sync`, so calls on several threads at once are fine.
        let hook = unsafe { &*arg.cast::<Hook>() };
        hook();
    }
    /// Every hook set, kept reachable (a hook the fake removed once it ran is not freed, and a
    /// leak checker must not report it).
    static SET: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    let hook: *mut Hook = Box::into_raw(Box::new(Box::new(hook)));
    SET.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(hook.expose_provenance());
    let name = c_name(name);
    // SAFETY: `name` is NUL-terminated; the hook lives for ever.
    unsafe { setter(name.as_ptr(), nth, run, hook.cast()) }
}

plain_controls! {
    /// Changes the version `cuDriverGetVersion` reports and `cuGetProcAddress` gates on (a
    /// binding that read it at load keeps its copy: set it before, or through [`Config`]).
    fn set_version(version: i32) = fake_cuda_set_version;

    /// Changes the number of devices.
    fn set_device_count(count: i32) = fake_cuda_set_device_count;

    /// Removes every fault (those of `FAKE_CUDA_FAIL` included).
    fn clear_faults() = fake_cuda_clear_faults;

    /// Removes every hook.
    fn clear_hooks() = fake_cuda_clear_hooks;

    /// Puts everything a test can steer back as it was at load: version, device count, stub mode
    /// and missing symbols as the environment gave them, faults as `FAKE_CUDA_FAIL` asked, no
    /// hooks, every thread's calls counted, no hidden capture queries, fresh context handles, and
    /// every hold released (see `control::fake_cuda_reset_steering`). What
    /// [`fixture`](crate::fixture)'s guard does when it drops.
    fn reset_steering() = fake_cuda_reset_steering;

    /// Calls since the fake was loaded that named an event it does not know: destroyed (also
    /// with its context, by a destroy, last release or reset) or never made. On the real driver
    /// such a handle may name another event made since: a library must never pass one.
    fn unknown_event_calls() -> u64 = fake_cuda_unknown_event_calls;

    /// Lets a held stream continue (unknown tokens are ignored).
    fn release_hold(token: u64) = fake_cuda_release_hold;

    /// Makes the next `count` capture queries (`cuStreamGetCaptureInfo`, `cuStreamIsCapturing`)
    /// of a capturing stream answer "not capturing": a stand-in for a capture that another thread
    /// begins just after the code under test looked (queries of streams that are not capturing do
    /// not count).
    fn hide_capture(count: u64) = fake_cuda_hide_capture;

    /// Host functions (and stream callbacks, and host nodes of launched graphs) of `ctx` (null:
    /// every context) enqueued and not yet finished, the one running now included.
    fn pending_host_functions(ctx: CUcontext) -> u64 = fake_cuda_pending_host_functions;

    /// Sets every call counter back to 0 (those of
    /// [`driver_thread_call_count`](FakeCuda::driver_thread_call_count) included).
    fn reset_call_counts() = fake_cuda_reset_call_counts;

    /// With `on`, only the calling thread's driver calls are counted and may meet an injected
    /// fault ([`set_fault`](FakeCuda::set_fault)): the code under test's own threads call the
    /// driver at moments of their own. With `!on`, every thread's again.
    fn focus_calls_on_this_thread(on: bool) = fake_cuda_focus_calls_on_this_thread;

    /// Calls of `cuGetProcAddress` (`which` = 1) or `cuGetProcAddress_v2` (`which` = 2); 0 for any
    /// other `which`.
    fn proc_address_calls(which: u32) -> u64 = fake_cuda_proc_address_calls;

    /// The `flags` of the last `cuGetProcAddress*` call (1 `CU_GET_PROC_ADDRESS_LEGACY_STREAM`, 2
    /// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`; 0 before any).
    fn last_proc_address_flags() -> u64 = fake_cuda_last_proc_address_flags;

    /// The `cudaVersion` of the last `cuGetProcAddress*` call (0 before any).
    fn last_proc_address_version() -> i32 = fake_cuda_last_proc_address_version;

    /// User objects whose destructor has not returned yet.
    fn live_user_objects() -> u64 = fake_cuda_live_user_objects;

    /// User objects that still have a reference (the user's, a graph's, an executable graph's or
    /// a launch's): their destructor has not been queued yet. Drops with the call that releases
    /// the last reference, unlike [`live_user_objects`](FakeCuda::live_user_objects), which
    /// waits for the destructor to return.
    fn referenced_user_objects() -> u64 = fake_cuda_referenced_user_objects;

    /// Driver threads (one per context that has had stream work) running now.
    fn driver_thread_count() -> u64 = fake_cuda_driver_thread_count;

    /// The depth of the calling thread's current-context stack (`cuCtxPushCurrent` pushes,
    /// `cuCtxPopCurrent` pops, `cuCtxSetCurrent` replaces the top): for checks that the code under
    /// test leaves the stack as it found it.
    fn context_stack_depth() -> u64 = fake_cuda_context_stack_depth;

    /// The calling thread's stream-capture interaction mode, as
    /// `cuThreadExchangeStreamCaptureMode` last set it: 0 `GLOBAL` (the default), 1
    /// `THREAD_LOCAL`, 2 `RELAXED`.
    fn capture_interaction_mode() -> u32 = fake_cuda_capture_interaction_mode;

    /// Driver calls made after the fake's teardown at process exit (an exit handler the fake
    /// registers at the first `cuInit`, after which every call returns 4,
    /// `CUDA_ERROR_DEINITIALIZED`): for an exit handler of a test, registered before the driver
    /// was initialised, so that it runs after the teardown.
    fn calls_after_teardown() -> u64 = fake_cuda_calls_after_teardown;
}

/// The text a control function that writes into a buffer (`fake_cuda_call_counts`, ...) returns,
/// asking again with a larger buffer until it fits.
fn read_text(write: unsafe extern "C" fn(*mut c_char, usize) -> usize) -> String {
    let mut buffer = vec![0u8; 4096];
    let len = loop {
        // SAFETY: `buffer` has `buffer.len()` writable bytes.
        let needed = unsafe { write(buffer.as_mut_ptr().cast(), buffer.len()) };
        if needed < buffer.len() {
            break needed;
        }
        buffer.resize(needed + 1, 0);
    };
    String::from_utf8_lossy(&buffer[..len]).into_owned()
}
