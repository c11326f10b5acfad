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
//! unsafe { std::env::set_var("CUDA_SYS_LIBRARY", &library) }; // for cuda-sys
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

use cuda_sys::types::{CUcontext, CUresult, CUstream};

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
}

impl fmt::Display for FakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FakeError::NotFound { tried } => write!(
                f,
                "the fake CUDA driver ({}) was not found; looked at {}. Add `fake-cuda` to your \
                 [dev-dependencies] (Cargo then builds the library beside your test binaries), or \
                 set {LIBRARY_ENV} to its path",
                library_file_name(),
                tried
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            FakeError::Open { path, message } => {
                write!(
                    f,
                    "cannot open the fake driver {}: {message}",
                    path.display()
                )
            }
            FakeError::Io(e) => write!(f, "cannot make the libcuda.so.1 link: {e}"),
        }
    }
}

impl std::error::Error for FakeError {}

/// The fake library: [`LIBRARY_ENV`] if set, else beside the running executable, in its `deps/`,
/// or in `../deps/` (Cargo puts test binaries in `target/<profile>/deps/`, examples in
/// `target/<profile>/examples/`, and a dependency's `cdylib` in `target/<profile>/deps/`).
///
/// # Errors
/// [`FakeError::NotFound`] if it is in none of those places.
pub fn locate() -> Result<PathBuf, FakeError> {
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
    let tried = vec![
        dir.join(&name),
        dir.join("deps").join(&name),
        dir.join("..").join("deps").join(&name),
    ];
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
/// [`FakeError::Io`] if the folder or the links cannot be made.
#[cfg(unix)]
pub fn libcuda_folder(library: &Path, folder: &Path) -> Result<PathBuf, FakeError> {
    std::fs::create_dir_all(folder).map_err(FakeError::Io)?;
    for name in ["libcuda.so.1", "libcuda.so"] {
        let link = folder.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(library, &link).map_err(FakeError::Io)?;
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
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.fake.release_hold(self.token);
    }
}

/// The loaded fake driver's control functions, through the shared library.
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

fn c_name(name: &str) -> CString {
    CString::new(name.replace('\0', "")).unwrap_or_default()
}

impl FakeCuda {
    /// The export `name` (NUL-terminated) as a function pointer of type `F`.
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
                String::from_utf8_lossy(name)
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

    /// Changes the version `cuDriverGetVersion` reports and `cuGetProcAddress` gates on (a
    /// binding that read it at load keeps its copy: set it before, or through [`Config`]).
    pub fn set_version(&self, version: i32) {
        // SAFETY: the signature of fake_cuda_set_version (src/control.rs).
        let f = unsafe { self.get::<extern "C" fn(i32)>(b"fake_cuda_set_version\0") };
        f(version)
    }

    /// Changes the number of devices.
    pub fn set_device_count(&self, count: i32) {
        // SAFETY: the signature of fake_cuda_set_device_count (src/control.rs).
        let f = unsafe { self.get::<extern "C" fn(i32)>(b"fake_cuda_set_device_count\0") };
        f(count)
    }

    /// Turns stub behaviour (every driver call returns 34, `CUDA_ERROR_STUB_LIBRARY`) on or off.
    pub fn set_stub(&self, on: bool) {
        // SAFETY: the signature of fake_cuda_set_stub (src/control.rs).
        let f = unsafe { self.get::<extern "C" fn(u32)>(b"fake_cuda_set_stub\0") };
        f(u32::from(on))
    }

    /// Replaces the list of base symbols `cuGetProcAddress` claims not to know (every function
    /// stays exported: `dlsym` still finds it).
    pub fn set_missing(&self, symbols: &[&str]) {
        let list = c_name(&symbols.join(","));
        // SAFETY: a NUL-terminated list.
        unsafe {
            self.get::<unsafe extern "C" fn(*const c_char)>(b"fake_cuda_set_missing\0")(
                list.as_ptr(),
            )
        }
    }

    /// Makes the `nth` call of `name` from now (1-based; 0: every call) return `code` and do
    /// nothing else. `name` is a base symbol (`cuLaunchHostFunc`: every variant) or an export name
    /// (`cuLaunchHostFunc_v2`: that one).
    pub fn set_fault(&self, name: &str, nth: u64, code: u32) {
        let name = c_name(name);
        // SAFETY: a NUL-terminated name.
        unsafe {
            self.get::<unsafe extern "C" fn(*const c_char, u64, u32)>(b"fake_cuda_set_fault\0")(
                name.as_ptr(),
                nth,
                code,
            )
        }
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        // SAFETY: the signature of fake_cuda_clear_faults (src/control.rs).
        let f = unsafe { self.get::<extern "C" fn()>(b"fake_cuda_clear_faults\0") };
        f()
    }

    /// Blocks `stream` (null: the current context's legacy stream) with "device work" until the
    /// hold is released, like a spinning kernel; other streams keep running. `None` if the stream
    /// is invalid or capturing.
    pub fn hold_stream(&self, stream: CUstream) -> Option<Hold<'_>> {
        // SAFETY: the signature of fake_cuda_hold_stream (src/control.rs).
        let token =
            unsafe { self.get::<extern "C" fn(CUstream) -> u64>(b"fake_cuda_hold_stream\0") }(
                stream,
            );
        (token != 0).then_some(Hold { fake: self, token })
    }

    /// Lets a held stream continue (unknown tokens are ignored).
    pub fn release_hold(&self, token: u64) {
        // SAFETY: the signature of fake_cuda_release_hold (src/control.rs).
        let f = unsafe { self.get::<extern "C" fn(u64)>(b"fake_cuda_release_hold\0") };
        f(token)
    }

    /// Gives `ctx` (null: the current context) a sticky error, as a trapping kernel does: its host
    /// functions never run again (pending ones included), launches still return success,
    /// synchronize and query calls return 719. Cleared by a reset or the last release of a
    /// primary context.
    ///
    /// # Errors
    /// The driver's code for an invalid context (201).
    pub fn poison_context(&self, ctx: CUcontext) -> Result<(), CUresult> {
        // SAFETY: the signature of fake_cuda_poison_context (src/control.rs).
        let code = unsafe {
            self.get::<extern "C" fn(CUcontext) -> CUresult>(b"fake_cuda_poison_context\0")
        }(ctx);
        if code == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(code)
        }
    }

    /// Host functions of `ctx` (null: every context) enqueued and not yet finished.
    pub fn pending_host_functions(&self, ctx: CUcontext) -> u64 {
        // SAFETY: the signature of fake_cuda_pending_host_functions (src/control.rs).
        let f = unsafe {
            self.get::<extern "C" fn(CUcontext) -> u64>(b"fake_cuda_pending_host_functions\0")
        };
        f(ctx)
    }

    /// Calls so far of `name`: a base symbol counts every variant, an export name only itself.
    pub fn call_count(&self, name: &str) -> u64 {
        let name = c_name(name);
        // SAFETY: a NUL-terminated name.
        unsafe {
            self.get::<unsafe extern "C" fn(*const c_char) -> u64>(b"fake_cuda_call_count\0")(
                name.as_ptr(),
            )
        }
    }

    /// Calls of `name` (`""`: of any function) made on the fake's own threads (inside a host
    /// function, or in a user-object destructor), where the real driver forbids CUDA calls.
    pub fn driver_thread_call_count(&self, name: &str) -> u64 {
        let name = c_name(name);
        // SAFETY: a NUL-terminated name.
        unsafe {
            self.get::<unsafe extern "C" fn(*const c_char) -> u64>(
                b"fake_cuda_driver_thread_call_count\0",
            )(name.as_ptr())
        }
    }

    /// Every call counted since the last [`reset_call_counts`](Self::reset_call_counts), by
    /// export name.
    pub fn call_counts(&self) -> BTreeMap<String, u64> {
        type Counts = unsafe extern "C" fn(*mut c_char, usize) -> usize;
        // SAFETY: the signature of fake_cuda_call_counts (src/control.rs).
        let counts = unsafe { self.get::<Counts>(b"fake_cuda_call_counts\0") };
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
                let (export, _base, count) = (fields.next()?, fields.next()?, fields.next()?);
                Some((export.to_string(), count.parse().ok()?))
            })
            .collect()
    }

    /// Sets every call counter back to 0.
    pub fn reset_call_counts(&self) {
        // SAFETY: the signature of fake_cuda_reset_call_counts (src/control.rs).
        let f = unsafe { self.get::<extern "C" fn()>(b"fake_cuda_reset_call_counts\0") };
        f()
    }

    /// Live driver objects of `kind`: `streams`, `events`, `graphs`, `graph_execs`,
    /// `graph_nodes`, `contexts` (created ones), `primary_retains`, `holds`,
    /// `host_registrations`. For leak checks.
    pub fn live_objects(&self, kind: &str) -> u64 {
        let kind = c_name(kind);
        // SAFETY: a NUL-terminated kind.
        unsafe {
            self.get::<unsafe extern "C" fn(*const c_char) -> u64>(b"fake_cuda_live_objects\0")(
                kind.as_ptr(),
            )
        }
    }

    /// User objects whose destructor has not returned yet.
    pub fn live_user_objects(&self) -> u64 {
        // SAFETY: the signature of fake_cuda_live_user_objects (src/control.rs).
        let f = unsafe { self.get::<extern "C" fn() -> u64>(b"fake_cuda_live_user_objects\0") };
        f()
    }

    /// Driver threads (one per context that has had stream work) running now.
    pub fn driver_thread_count(&self) -> u64 {
        // SAFETY: the signature of fake_cuda_driver_thread_count (src/control.rs).
        let f = unsafe { self.get::<extern "C" fn() -> u64>(b"fake_cuda_driver_thread_count\0") };
        f()
    }
}
