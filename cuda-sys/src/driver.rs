//! The loaded driver: opened once per process, never unloaded, shared by every thread.

use std::ffi::{CStr, OsString, c_char, c_void};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::AtomicPtr;
use std::sync::{Mutex, OnceLock};

use crate::error::{DriverError, Error, LoadAttempt, builtin_description};
use crate::library::{self, Bootstrap};
use crate::resolve::ResolutionPath;
use crate::table::FUNCTION_COUNT;
use crate::types::CUresult;
use crate::version::DriverVersion;

/// The environment variable that selects per-thread default-stream semantics: `1`, `true`, `yes` or
/// `on` select them; `0`, `false`, `no`, `off` or unset keep the legacy default stream.
pub const PER_THREAD_ENV: &str = "CUDA_SYS_PER_THREAD_DEFAULT_STREAM";

/// Which default stream the handle `0` (the "null stream") means in stream-ordered calls.
///
/// The choice picks which variant of every stream-ordered function the table resolves (through
/// `cuGetProcAddress`'s `CU_GET_PROC_ADDRESS_LEGACY_STREAM` or `..._PER_THREAD_DEFAULT_STREAM` flag,
/// or the `_ptsz`/`_ptds` export on old drivers), exactly as `nvcc --default-stream` does for C++.
/// The explicit handles [`CU_STREAM_LEGACY`](crate::CU_STREAM_LEGACY) and
/// [`CU_STREAM_PER_THREAD`](crate::CU_STREAM_PER_THREAD) mean the same in either mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DefaultStream {
    /// The legacy default stream, which synchronizes with other blocking streams (the default).
    #[default]
    Legacy,
    /// A default stream per host thread, which does not synchronize with other streams.
    PerThread,
}

/// How to load the driver: [`Driver::load`] takes these (a library path is a promise about that
/// library, hence `unsafe`), [`driver`] reads them from the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Open this file instead of searching for [`DEFAULT_NAMES`](crate::DEFAULT_NAMES).
    pub library_path: Option<PathBuf>,
    /// Which default stream stream-ordered functions use.
    pub default_stream: DefaultStream,
}

impl LoadOptions {
    /// The options the environment asks for: [`LIBRARY_ENV`](crate::LIBRARY_ENV) names an explicit
    /// library path, [`PER_THREAD_ENV`] selects per-thread default-stream semantics.
    ///
    /// # Errors
    /// [`Error::InvalidEnvironment`] if `CUDA_SYS_PER_THREAD_DEFAULT_STREAM` holds something other
    /// than a yes or a no.
    pub fn from_env() -> Result<LoadOptions, Error> {
        let library_path = std::env::var_os(library::LIBRARY_ENV)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        let default_stream = match std::env::var(PER_THREAD_ENV) {
            Err(std::env::VarError::NotPresent) => DefaultStream::Legacy,
            Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => DefaultStream::PerThread,
                "" | "0" | "false" | "no" | "off" => DefaultStream::Legacy,
                _ => return Err(invalid_env(v)),
            },
            Err(std::env::VarError::NotUnicode(v)) => {
                return Err(invalid_env(v.to_string_lossy().into_owned()));
            }
        };
        Ok(LoadOptions {
            library_path,
            default_stream,
        })
    }

    /// Options that open `path` instead of searching the default names.
    pub fn with_library_path(path: impl Into<PathBuf>) -> LoadOptions {
        LoadOptions {
            library_path: Some(path.into()),
            ..LoadOptions::default()
        }
    }
}

fn invalid_env(value: String) -> Error {
    Error::InvalidEnvironment {
        variable: PER_THREAD_ENV,
        value,
        expected: "1, true, yes or on (per-thread); 0, false, no or off (legacy)",
    }
}

/// The CUDA driver, loaded: its library, its version and the table of its functions.
///
/// There is one per process ([`driver`] or [`Driver::load`] returns it); it lives until the process
/// exits and the library is never unloaded, so every function pointer it hands out stays valid.
/// Each function of the table is resolved the first time it is called and cached; later calls cost
/// one atomic load and a branch. A function the driver lacks or is too old for returns an error and
/// affects no other function.
///
/// Every driver function is a method, in two forms:
/// - `driver.cuStreamSynchronize(stream)`: `unsafe`, returns `Result<(), Error>`;
/// - `driver.raw().cuStreamSynchronize()`: the resolved C function pointer, with its exact signature,
///   for binding authors who want the raw `CUresult`.
pub struct Driver {
    /// Kept open for the life of the process; `Driver` lives in a `static`, which is never dropped.
    library: libloading::Library,
    pub(crate) opened_as: OsString,
    pub(crate) path: PathBuf,
    pub(crate) version: DriverVersion,
    pub(crate) default_stream: DefaultStream,
    pub(crate) resolution: ResolutionPath,
    pub(crate) bootstrap: Bootstrap,
    /// One slot per table entry: null (not yet resolved), a small sentinel (resolved to an error) or
    /// the function's address.
    pub(crate) slots: [AtomicPtr<c_void>; FUNCTION_COUNT],
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("default_stream", &self.default_stream)
            .field("resolution", &self.resolution)
            .finish_non_exhaustive()
    }
}

static DRIVER: OnceLock<Driver> = OnceLock::new();
static LOADING: Mutex<()> = Mutex::new(());

/// The process's driver, loaded on first use with the options the environment gives
/// ([`LoadOptions::from_env`]).
///
/// # Safety
/// A safe function, but one that trusts the process's environment: the library it opens is
/// trusted to be the CUDA driver (see [`Driver::load`]'s Safety section for what that covers).
/// Setting [`LIBRARY_ENV`](crate::LIBRARY_ENV) (`CUDA_SYS_LIBRARY`) to a path makes the process
/// trust the library at that path, exactly as an `unsafe` [`Driver::load`] of it would; unset, the
/// system loader's search for [`DEFAULT_NAMES`](crate::DEFAULT_NAMES) (`LD_LIBRARY_PATH`, ...) is
/// trusted, as for any library the program links. Whoever sets a process's environment (its
/// launcher, a test harness; inside the program `std::env::set_var`, which is `unsafe` itself) is
/// responsible for it.
///
/// # Errors
/// [`Error::LibraryNotFound`], [`Error::StubLibrary`], [`Error::Driver`] (from `cuInit`),
/// [`Error::AlreadyLoaded`] or [`Error::InvalidEnvironment`]. A failed load is not remembered: a later
/// call tries again.
///
/// # Examples
/// ```no_run
/// # fn main() -> Result<(), cuda_sys::Error> {
/// let driver = cuda_sys::driver()?;
/// println!("CUDA {} driver at {}", driver.version(), driver.path().display());
/// let mut count = 0;
/// // SAFETY: `count` is a valid place for the driver to write an int.
/// unsafe { driver.cuDeviceGetCount(&mut count)? };
/// # Ok(()) }
/// ```
#[inline]
pub fn driver() -> Result<&'static Driver, Error> {
    match DRIVER.get() {
        Some(driver) => Ok(driver),
        None => load_from_env(),
    }
}

#[cold]
fn load_from_env() -> Result<&'static Driver, Error> {
    let options = LoadOptions::from_env()?;
    // SAFETY: the path, if any, is the one `CUDA_SYS_LIBRARY` names, which whoever set the
    // process's environment vouches for (see `driver`'s Safety section).
    unsafe { Driver::load(options) }
}

impl Driver {
    /// Loads the driver with these options, or returns the one already loaded if it is compatible
    /// (the same default-stream mode, and the same path where one is named).
    ///
    /// Many threads may call this at once: one of them loads, the others wait for it.
    ///
    /// # Safety
    /// If `options.library_path` names a file (and no driver is loaded yet):
    /// - opening it runs its initialisers, which must be sound to run in this process (as for any
    ///   library opened with `dlopen`);
    /// - if it exports `cuInit` and `cuDriverGetVersion`, it must be a CUDA driver library (or a
    ///   faithful implementation of its C ABI, such as a test double). Every call this crate makes
    ///   trusts it: `cuInit`, `cuDriverGetVersion`, `cuGetProcAddress*` and every function they
    ///   hand out are called with the signatures `cuda.h` declares, and their results, pointers
    ///   included, are taken as the Driver API reference says. A library with exports of those
    ///   names but other signatures or behaviour makes the safe API of this crate, and of crates
    ///   built on it, undefined behaviour. (A file without them is refused, with
    ///   [`Error::LibraryNotFound`], before anything of it is called.)
    ///
    /// The library stays loaded for the life of the process.
    ///
    /// With no path (`library_path: None`) this searches [`DEFAULT_NAMES`](crate::DEFAULT_NAMES),
    /// as [`driver`] does: no more is asked of the caller than of [`driver`]'s.
    ///
    /// # Errors
    /// As for [`driver`]; [`Error::AlreadyLoaded`] if the driver was loaded with other options.
    ///
    /// # Examples
    /// Loading a library by path is a promise about that library, so it takes `unsafe`:
    /// ```compile_fail,E0133
    /// let options = cuda_sys::LoadOptions::with_library_path("/opt/driver/libcuda.so.1");
    /// let _ = cuda_sys::Driver::load(options);
    /// ```
    /// ```no_run
    /// # fn main() -> Result<(), cuda_sys::Error> {
    /// let options = cuda_sys::LoadOptions::with_library_path("/opt/driver/libcuda.so.1");
    /// // SAFETY: /opt/driver holds the NVIDIA driver this program was deployed with.
    /// let driver = unsafe { cuda_sys::Driver::load(options)? };
    /// # let _ = driver; Ok(()) }
    /// ```
    pub unsafe fn load(options: LoadOptions) -> Result<&'static Driver, Error> {
        if let Some(driver) = DRIVER.get() {
            return driver.compatible(&options);
        }
        // A panic while holding this lock cannot leave anything half-done (the driver is published
        // whole or not at all), so a poisoned lock is still usable.
        let _guard = LOADING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(driver) = DRIVER.get() {
            return driver.compatible(&options);
        }
        let driver = Driver::open(&options)?;
        // We hold LOADING and saw DRIVER empty, so this stores `driver`.
        Ok(DRIVER.get_or_init(move || driver))
    }

    /// The driver if it is already loaded, without loading it.
    pub fn get() -> Option<&'static Driver> {
        DRIVER.get()
    }

    fn compatible(&'static self, options: &LoadOptions) -> Result<&'static Driver, Error> {
        let path_ok = match &options.library_path {
            None => true,
            Some(p) => p.as_os_str() == self.opened_as || p == &self.path,
        };
        if path_ok && options.default_stream == self.default_stream {
            Ok(self)
        } else {
            Err(Error::AlreadyLoaded {
                loaded: self.path.display().to_string(),
                loaded_mode: self.default_stream,
                requested: format!(
                    "{} with {:?}",
                    options
                        .library_path
                        .as_deref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "the default library".into()),
                    options.default_stream
                ),
            })
        }
    }

    fn open(options: &LoadOptions) -> Result<Driver, Error> {
        let mut tried = Vec::new();
        let mut stub = None;
        for candidate in library::candidates(options.library_path.as_deref()) {
            let lib = match library::open(&candidate) {
                Ok(lib) => lib,
                Err(attempt) => {
                    tried.push(attempt);
                    continue;
                }
            };
            let bootstrap = match Bootstrap::read(&lib) {
                Ok(b) => b,
                Err(missing) => {
                    tried.push(LoadAttempt {
                        candidate: candidate.to_string_lossy().into_owned(),
                        message: format!(
                            "opened, but it is not a CUDA driver: no {missing} export"
                        ),
                    });
                    continue;
                }
            };
            let path = library::mapped_path(bootstrap.cu_init as *const c_void, &candidate);
            // SAFETY: cuInit(0) has no preconditions; 0 is the only valid flag value.
            let rc = unsafe { (bootstrap.cu_init)(0) };
            if rc == CUresult::CUDA_ERROR_STUB_LIBRARY {
                stub.get_or_insert(path);
                continue;
            }
            if rc != CUresult::CUDA_SUCCESS {
                let error = describe_with(&bootstrap, rc, Some("cuInit"));
                // The error's name and description point into the library's static strings: keep
                // it mapped (a driver is never unloaded anyway).
                std::mem::forget(lib);
                return Err(error.into());
            }
            let mut version = 0;
            // SAFETY: `version` is a valid place for an int.
            let rc = unsafe { (bootstrap.cu_driver_get_version)(&mut version) };
            if rc != CUresult::CUDA_SUCCESS {
                let error = describe_with(&bootstrap, rc, Some("cuDriverGetVersion"));
                // As above: the error points into the library.
                std::mem::forget(lib);
                return Err(error.into());
            }
            let version = DriverVersion(version);
            return Ok(Driver {
                resolution: ResolutionPath::for_driver(version, &bootstrap),
                opened_as: candidate,
                path,
                version,
                default_stream: options.default_stream,
                bootstrap,
                slots: [const { AtomicPtr::new(ptr::null_mut()) }; FUNCTION_COUNT],
                library: lib,
            });
        }
        match stub {
            Some(path) => Err(Error::StubLibrary { path }),
            None => Err(Error::LibraryNotFound { tried }),
        }
    }

    /// The driver's version, as `cuDriverGetVersion` reported it at load.
    pub fn version(&self) -> DriverVersion {
        self.version
    }

    /// The file the loader mapped (symlinks such as `libcuda.so.1` followed, where the platform can).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The default-stream mode the table resolves stream-ordered functions for.
    pub fn default_stream(&self) -> DefaultStream {
        self.default_stream
    }

    /// How this driver's functions are looked up: `cuGetProcAddress_v2` (12.0+),
    /// `cuGetProcAddress` (11.3–11.8) or the versioned exports (older drivers).
    pub fn resolution_path(&self) -> ResolutionPath {
        self.resolution
    }

    pub(crate) fn library(&self) -> &libloading::Library {
        &self.library
    }

    /// A [`DriverError`] for `code`, named and described by the driver where it can, else from the
    /// pinned header.
    pub fn describe(&self, code: CUresult, function: Option<&'static str>) -> DriverError {
        describe_with(&self.bootstrap, code, function)
    }

    /// `Ok(())` for `CUDA_SUCCESS`, else the described error.
    ///
    /// # Errors
    /// [`Error::Driver`] for any other code.
    #[inline]
    pub fn check(&self, code: CUresult, function: &'static str) -> Result<(), Error> {
        if code == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self.describe(code, Some(function)).into())
        }
    }
}

fn describe_with(
    bootstrap: &Bootstrap,
    code: CUresult,
    function: Option<&'static str>,
) -> DriverError {
    let (fallback_name, fallback_description) = builtin_description(code);
    let name = driver_text(bootstrap.cu_get_error_name, code).unwrap_or(fallback_name);
    let description =
        driver_text(bootstrap.cu_get_error_string, code).unwrap_or(fallback_description);
    DriverError::new(code, function, name, description)
}

/// `cuGetErrorName`/`cuGetErrorString` of `code`, when the driver knows it.
fn driver_text(
    f: Option<unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult>,
    code: CUresult,
) -> Option<&'static str> {
    let f = f?;
    let mut text: *const c_char = ptr::null();
    // SAFETY: `text` is a valid place for a pointer; the driver writes a pointer to a static string
    // or leaves it null.
    let rc = unsafe { f(code, &mut text) };
    if rc != CUresult::CUDA_SUCCESS || text.is_null() {
        return None;
    }
    // SAFETY: on success the driver points `text` at a NUL-terminated string in its own read-only
    // data, which stays mapped for the life of the process because the library is never unloaded.
    let text: &'static CStr = unsafe { CStr::from_ptr(text) };
    text.to_str().ok()
}
