//! The loaded driver: opened once per process, never unloaded, shared by every thread, with one
//! table of functions per default-stream mode.

use std::cell::Cell;
use std::ffi::{CString, OsString, c_void};
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use crate::error::{CallError, DriverError, Error, MissingReason};
use crate::library::{self, Bootstrap, LibraryKind, LibraryOrigin, LoadAttempt};
use crate::resolve::{self, Loaded, Lookup, ResolutionPath, SLOT_LAST_SENTINEL};
use crate::streams::DefaultStream;
use crate::table::{FUNCTION_COUNT, Function, FunctionInfo};
use crate::types::CUresult;
use crate::version::DriverVersion;

/// The environment variable that selects per-thread default-stream semantics: `1`, `true`, `yes` or
/// `on` select them; `0`, `false`, `no`, `off` or unset keep the legacy default stream.
pub const PER_THREAD_ENV: &str = "CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM";

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
    /// [`Error::InvalidEnvironment`] if `CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM` holds something other
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

/// The CUDA driver, loaded: its library, its version and a table of its functions for one
/// default-stream mode.
///
/// There is one library per process ([`driver`] or [`Driver::load`] opens it); it lives until the
/// process exits and is never unloaded, so every function pointer handed out stays valid. It has two
/// tables side by side, one per [`DefaultStream`] mode: [`Driver::legacy`] and
/// [`Driver::per_thread`] reach either from the other, and [`driver`] returns the process's default
/// (the mode of the first load: `CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM`, or [`LoadOptions`]).
/// Each function of a table is resolved the first time it is called there and cached; later calls
/// cost one atomic load and a branch. A function the driver lacks or is too old for returns an error
/// and affects no other function.
///
/// Every driver function (and every older ABI variant of one, such as `cuCtxCreate_v2`) is a
/// method, in two forms:
/// - `driver.cuStreamSynchronize(stream)`: `unsafe`, returns `Result<(), CallError>` (12 bytes,
///   `Copy`; `?` turns it into [`Error`] where the caller returns that);
/// - `driver.raw().cuStreamSynchronize()`: the resolved C function pointer, with its exact signature,
///   for binding authors who want the raw `CUresult`.
///
/// The [`functions`](crate::functions) module lists them all, one typed entry per function with its
/// ABI version, and [`Driver::newest_variant`] picks the newest variant a driver has (a
/// [`ChosenFunction`](crate::ChosenFunction), called checked with errors that name it).
pub struct Driver {
    loaded: &'static Loaded,
    mode: DefaultStream,
    /// One slot per table entry: null (not yet resolved), a small sentinel (resolved to an error) or
    /// the function's address.
    slots: [AtomicPtr<c_void>; FUNCTION_COUNT],
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.loaded.path)
            .field("version", &self.loaded.version)
            .field("default_stream", &self.mode)
            .field("resolution", &self.loaded.resolution)
            .finish_non_exhaustive()
    }
}

/// The process's driver: one table per default-stream mode over one library.
struct Tables {
    legacy: Driver,
    per_thread: Driver,
    /// The mode of the first load, which [`driver`] returns.
    default: DefaultStream,
}

impl Tables {
    fn get(&self, mode: DefaultStream) -> &Driver {
        match mode {
            DefaultStream::Legacy => &self.legacy,
            DefaultStream::PerThread => &self.per_thread,
        }
    }
}

static TABLES: OnceLock<Tables> = OnceLock::new();

/// The process whose thread is loading the driver now, if any: held only to read or change it,
/// never across the load itself. A process forked during a load inherits its parent's id here,
/// for a loader that does not exist in it.
static LOADING: Mutex<Option<u32>> = Mutex::new(None);
/// Signalled when a load ends (published or failed): threads that found another loading wait here.
static LOAD_ENDED: Condvar = Condvar::new();

thread_local! {
    /// Whether this thread is the one loading: a load reached from inside its own load (a
    /// `cuInit` that calls back into this crate) then fails instead of waiting for itself.
    static LOADING_HERE: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is loading the driver now.
fn loading_here() -> bool {
    // A const thread-local without a destructor is never destroyed: `try_with` always succeeds.
    LOADING_HERE.try_with(Cell::get).unwrap_or(false)
}

/// Marks this thread as the loader, or no longer.
fn set_loading_here(on: bool) {
    let _ = LOADING_HERE.try_with(|here| here.set(on));
}

/// `LOADING`, locked; a panic while holding it (none can: it guards plain stores) leaves a usable
/// value, so a poisoned lock is used as it is.
fn loading() -> MutexGuard<'static, Option<u32>> {
    LOADING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Ends this thread's load when dropped (also if the load unwinds): clears `LOADING` and wakes the
/// threads waiting for it.
struct LoadTurn;

impl Drop for LoadTurn {
    fn drop(&mut self) {
        set_loading_here(false);
        *loading() = None;
        LOAD_ENDED.notify_all();
    }
}

/// The process's driver, loaded on first use with the options the environment gives
/// ([`LoadOptions::from_env`]); once loaded, the table of the first load's default-stream mode.
///
/// Loading initialises the driver: it calls `cuInit(0)` and `cuDriverGetVersion`, so the caller
/// has no `cuInit` to call first (calling it again is harmless).
///
/// # Safety
/// A safe function, but one that trusts the process's environment: the library it opens is
/// trusted to be the CUDA driver (see [`Driver::load`]'s Safety section for what that covers).
/// Setting [`LIBRARY_ENV`](crate::LIBRARY_ENV) (`CUDA_DL_SYS_LIBRARY`) to a path makes the process
/// trust the library at that path, exactly as an `unsafe` [`Driver::load`] of it would; unset, the
/// system loader's search for [`DEFAULT_NAMES`](crate::DEFAULT_NAMES) is trusted, as for any library
/// the program links (on Windows only the system folder is searched, as a driver install places
/// `nvcuda.dll` there). Whoever sets a process's environment (its launcher, a test harness; inside
/// the program `std::env::set_var`, which is `unsafe` itself) is responsible for it.
///
/// # Errors
/// [`Error::LibraryNotFound`], [`Error::StubLibrary`], [`Error::Driver`] (from `cuInit`),
/// [`Error::AlreadyLoaded`] or [`Error::InvalidEnvironment`]. A failed load is not remembered: a later
/// call tries again. [`Error::LoadReentered`] if called from inside the first load on the thread
/// loading (from the library's `cuInit`), which then goes on; [`Error::ForkedDuringLoad`] in a
/// process forked while its parent was loading. (A fork in the instant a thread reads or writes
/// who is loading, a few instructions, not the load itself, can still leave the child's first
/// load waiting for ever: fork before the first load or after it.)
///
/// # Examples
/// ```no_run
/// # fn main() -> Result<(), cuda_dl_sys::Error> {
/// let driver = cuda_dl_sys::driver()?;
/// println!("CUDA {} driver at {}", driver.version(), driver.path().display());
/// let mut count = 0;
/// // SAFETY: `count` is a valid place for the driver to write an int.
/// unsafe { driver.cuDeviceGetCount(&mut count)? };
/// # Ok(()) }
/// ```
#[inline]
pub fn driver() -> Result<&'static Driver, Error> {
    match TABLES.get() {
        Some(tables) => Ok(tables.get(tables.default)),
        None => load_from_env(),
    }
}

#[cold]
fn load_from_env() -> Result<&'static Driver, Error> {
    let options = LoadOptions::from_env()?;
    let origin = match options.library_path {
        Some(_) => LibraryOrigin::Environment,
        None => LibraryOrigin::DefaultNames,
    };
    // The path, if any, is the one `CUDA_DL_SYS_LIBRARY` names, which whoever set the process's
    // environment vouches for (see `driver`'s Safety section): as `Driver::load` of it would.
    Driver::load_from(
        Source::Search(options.library_path, origin),
        options.default_stream,
    )
}

/// Where a library to load comes from.
enum Source {
    /// A path (from the environment or the caller: the origin says which), or the default names.
    Search(Option<PathBuf>, LibraryOrigin),
    /// A library the caller opened, with the name to report for it.
    Adopted(libloading::Library, OsString),
}

impl Driver {
    /// Loads the driver with these options, or returns the one already loaded if it is the same
    /// library (no path named, or a path or name the system loader maps to the library already
    /// loaded: `libcuda.so`, `libcuda.so.1` and `libcuda.so.580.xx` are one file), as the table
    /// of `options.default_stream`.
    ///
    /// Many threads may call this at once: one of them loads, the others wait for it. A call
    /// from inside that load on the loading thread (from the library's `cuInit`) returns
    /// [`Error::LoadReentered`] instead of waiting for itself; in a process forked while its
    /// parent was loading, [`Error::ForkedDuringLoad`].
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
    /// as [`driver`] does, and [`Driver::load_default`] is its safe form.
    ///
    /// # Errors
    /// As for [`driver`]; [`Error::AlreadyLoaded`] if another file was loaded first.
    ///
    /// # Examples
    /// Loading a library by path is a promise about that library, so it takes `unsafe`:
    /// ```compile_fail,E0133
    /// let options = cuda_dl_sys::LoadOptions::with_library_path("/opt/driver/libcuda.so.1");
    /// let _ = cuda_dl_sys::Driver::load(options);
    /// ```
    /// ```no_run
    /// # fn main() -> Result<(), cuda_dl_sys::Error> {
    /// let options = cuda_dl_sys::LoadOptions::with_library_path("/opt/driver/libcuda.so.1");
    /// // SAFETY: /opt/driver holds the NVIDIA driver this program was deployed with.
    /// let driver = unsafe { cuda_dl_sys::Driver::load(options)? };
    /// # let _ = driver; Ok(()) }
    /// ```
    pub unsafe fn load(options: LoadOptions) -> Result<&'static Driver, Error> {
        let origin = match options.library_path {
            Some(_) => LibraryOrigin::Given,
            None => LibraryOrigin::DefaultNames,
        };
        Driver::load_from(
            Source::Search(options.library_path, origin),
            options.default_stream,
        )
    }

    /// Loads the driver from the standard search ([`DEFAULT_NAMES`](crate::DEFAULT_NAMES): the
    /// system loader's search on Linux, the system folder on Windows), with `default_stream` as the
    /// process's default mode, or returns the one already loaded as the table of that mode.
    ///
    /// # Errors
    /// As for [`driver`].
    pub fn load_default(default_stream: DefaultStream) -> Result<&'static Driver, Error> {
        // SAFETY: no path is named: only the standard names are searched, which is what a safe
        // `driver()` does (see its Safety section).
        unsafe {
            Driver::load(LoadOptions {
                library_path: None,
                default_stream,
            })
        }
    }

    /// Adopts a library the caller has already opened as the process's driver (for a driver loaded
    /// with flags or from a place of the caller's choosing), or returns the one already loaded if
    /// `library` is the same file.
    ///
    /// `name` is what errors and [`Driver::path`] call it where the platform cannot say.
    ///
    /// # Safety
    /// As for [`Driver::load`] with a path: `library` must be a CUDA driver library (or a faithful
    /// implementation of its C ABI); every function of it that this crate calls is trusted to have
    /// `cuda.h`'s signature and behaviour. It stays loaded for the life of the process.
    ///
    /// # Errors
    /// As for [`Driver::load`]; [`Error::LibraryNotFound`] (naming `name`) if it lacks `cuInit` or
    /// `cuDriverGetVersion`.
    pub unsafe fn adopt(
        library: libloading::Library,
        name: impl Into<OsString>,
        default_stream: DefaultStream,
    ) -> Result<&'static Driver, Error> {
        Driver::load_from(Source::Adopted(library, name.into()), default_stream)
    }

    fn load_from(source: Source, mode: DefaultStream) -> Result<&'static Driver, Error> {
        if let Some(tables) = TABLES.get() {
            return Driver::compatible(tables, source, mode);
        }
        let me = std::process::id();
        let mut state = loading();
        loop {
            if let Some(tables) = TABLES.get() {
                drop(state);
                return Driver::compatible(tables, source, mode);
            }
            match *state {
                None => break,
                // The loader is in the process this one was forked from: its load never ends here.
                Some(process) if process != me => return Err(Error::ForkedDuringLoad),
                // Reached from inside this thread's own load (from the library's cuInit, say):
                // waiting would wait for ever.
                Some(_) if loading_here() => return Err(Error::LoadReentered),
                Some(_) => {
                    state = LOAD_ENDED
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            }
        }
        *state = Some(me);
        drop(state);
        set_loading_here(true);
        let turn = LoadTurn;
        // Leaked: the library is never unloaded, and both tables point at it for ever.
        let opened = open(source);
        let loaded: &'static Loaded = match opened {
            Ok(loaded) => Box::leak(Box::new(loaded)),
            Err(e) => {
                drop(turn);
                return Err(e);
            }
        };
        let table = |mode| Driver {
            loaded,
            mode,
            slots: [const { AtomicPtr::new(ptr::null_mut()) }; FUNCTION_COUNT],
        };
        let tables = Tables {
            legacy: table(DefaultStream::Legacy),
            per_thread: table(DefaultStream::PerThread),
            default: mode,
        };
        // This thread is the loader (LOADING names it) and saw TABLES empty, so this stores
        // `tables`; the turn ends after, so that a waiter woken finds them.
        let published = TABLES.get_or_init(move || tables).get(mode);
        drop(turn);
        Ok(published)
    }

    /// The driver if it is already loaded, without loading it: the process's default table.
    pub fn get() -> Option<&'static Driver> {
        TABLES.get().map(|tables| tables.get(tables.default))
    }

    /// The table of `mode` if `source` is the library loaded, else [`Error::AlreadyLoaded`];
    /// `source` is dropped (an adopted library's reference closed).
    fn compatible(
        tables: &'static Tables,
        source: Source,
        mode: DefaultStream,
    ) -> Result<&'static Driver, Error> {
        let loaded = tables.legacy.loaded;
        let (same, requested) = match source {
            Source::Search(None, _) => (true, String::new()),
            Source::Search(Some(p), _) => (
                p.as_os_str() == loaded.opened_as
                    || p == loaded.path
                    || library::is_loaded_as(p.as_os_str(), loaded.handle),
                p.display().to_string(),
            ),
            Source::Adopted(library, name) => {
                let path = library::followed(library::loaded_path(&library, &name));
                let (_, handle) = library::with_handle(library);
                let same = path == loaded.path || (handle != 0 && handle == loaded.handle);
                (same, path.display().to_string())
            }
        };
        if same {
            Ok(tables.get(mode))
        } else {
            Err(Error::AlreadyLoaded {
                loaded: loaded.path.display().to_string(),
                requested,
            })
        }
    }

    /// The table of the legacy default stream (`CU_GET_PROC_ADDRESS_LEGACY_STREAM`) over the same
    /// library, whatever this one's mode.
    pub fn legacy(&self) -> &Driver {
        self.with_default_stream(DefaultStream::Legacy)
    }

    /// The table of the per-thread default stream (`CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`,
    /// the `_ptsz`/`_ptds` variants) over the same library, whatever this one's mode: a library
    /// can call per-thread variants while the application uses the legacy default stream.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), cuda_dl_sys::Error> {
    /// let driver = cuda_dl_sys::driver()?;
    /// // SAFETY: the per-thread default stream (null) of the calling thread, with a current context.
    /// unsafe { driver.per_thread().cuStreamSynchronize(std::ptr::null_mut())? };
    /// # Ok(()) }
    /// ```
    pub fn per_thread(&self) -> &Driver {
        self.with_default_stream(DefaultStream::PerThread)
    }

    /// The table of `mode` over the same library.
    pub fn with_default_stream(&self, mode: DefaultStream) -> &Driver {
        match TABLES.get() {
            Some(tables) => tables.get(mode),
            // Unreachable: every `Driver` lives in `TABLES`. Answering with this table keeps it
            // a non-panicking function.
            None => self,
        }
    }

    /// The driver's version, as `cuDriverGetVersion` reported it at load.
    pub fn version(&self) -> DriverVersion {
        self.loaded.version
    }

    /// The file the loader mapped (symlinks such as `libcuda.so.1` followed, where the platform can).
    pub fn path(&self) -> &Path {
        &self.loaded.path
    }

    /// The default-stream mode this table resolves stream-ordered functions for.
    pub fn default_stream(&self) -> DefaultStream {
        self.mode
    }

    /// How this driver's functions are looked up: `cuGetProcAddress_v2` (12.0+),
    /// `cuGetProcAddress` (11.3–11.8) or the versioned exports (older drivers).
    pub fn resolution_path(&self) -> ResolutionPath {
        self.loaded.resolution
    }

    /// A [`DriverError`] for `code`, named and described by the driver where it can, else from the
    /// pinned header.
    pub fn describe(&self, code: CUresult, function: Option<&'static str>) -> DriverError {
        self.loaded.describe(code, function)
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

    /// The address of `function`, resolved now if this is its first use in this table.
    ///
    /// The fast path is one atomic load and a branch.
    #[inline(always)]
    pub(crate) fn entry(&self, function: Function) -> Result<*mut c_void, CallError> {
        let slot = &self.slots[function as usize];
        let p = slot.load(Ordering::Acquire);
        if p.addr() > SLOT_LAST_SENTINEL {
            Ok(p)
        } else {
            self.loaded.resolve_slot(slot, function, self.mode)
        }
    }

    /// Resolves `function` in this table (or returns why it cannot be), caching the outcome.
    ///
    /// # Errors
    /// [`Error::DriverTooOld`] if its ABI version is newer than the driver; [`Error::SymbolMissing`]
    /// if the driver does not provide it; [`Error::Driver`] if the lookup itself failed.
    pub fn resolve(&self, function: Function) -> Result<NonNull<c_void>, Error> {
        let p = self.entry(function)?;
        NonNull::new(p).ok_or_else(|| {
            let (required, _) = resolve::variant(function.info(), self.mode);
            self.loaded.lookup_error(
                Lookup::Missing(MissingReason::NotFound),
                function.name(),
                required,
            )
        })
    }

    /// Looks a driver symbol up directly, uncached and ungated: through `cuGetProcAddress_v2` or
    /// `cuGetProcAddress` with `version` and the flag for `mode`, which answer with the newest
    /// variant at or below `version`. On drivers older than 11.3, which have no
    /// `cuGetProcAddress`, the same variant's export is looked up where the table knows the
    /// symbol: its newest variant at or below `version` (`cuMemAlloc` at any `version` from 3020
    /// is 3.2's export `cuMemAlloc_v2`; per-thread, `cuStreamSynchronize` from 7000 is
    /// `cuStreamSynchronize_ptsz`), else the export named `symbol` itself (which must then be an
    /// export's full name). `version` is numbered as the driver numbers versions
    /// (`1000 * major + 10 * minor`).
    ///
    /// For binding authors who need a symbol the table does not have; for one it has, the typed
    /// entries ([`functions`](crate::functions), [`Driver::function`]) are safer.
    ///
    /// # Errors
    /// [`Error::InvalidSymbolName`] for a name with a NUL byte; [`Error::SymbolMissing`] (with
    /// `function` `"(lookup)"`) if nothing is found; [`Error::Driver`] if the lookup call failed.
    pub fn get_proc_address(
        &self,
        symbol: &str,
        version: u32,
        mode: DefaultStream,
    ) -> Result<NonNull<c_void>, Error> {
        let name =
            CString::new(symbol).map_err(|_| Error::InvalidSymbolName(symbol.to_string()))?;
        let export = export_of(&name, version, mode);
        match self.loaded.lookup(&name, version, export, mode) {
            Lookup::Found(p) => Ok(p),
            other => Err(self.loaded.lookup_error(other, "(lookup)", version)),
        }
    }
}

/// The export to look up for `symbol` at ABI `version` in `mode` on drivers older than 11.3: as
/// `cuGetProcAddress` answers, the newest variant the table has at or below `version` (each as
/// its entries resolve, [`resolve::variant`]: `cuMemAlloc` at 11.2 is 3.2's `cuMemAlloc_v2`,
/// `cuStreamSynchronize` at 9.0 per-thread is 7.0's `cuStreamSynchronize_ptsz`); `None` if the
/// table has the symbol but no variant at or below `version`, or that variant has none in this
/// mode (a per-thread request of a version without a per-thread twin must not find the legacy
/// export of another ABI); `symbol` itself if the table does not know it.
fn export_of(symbol: &CString, version: u32, mode: DefaultStream) -> Option<&std::ffi::CStr> {
    let mut known = Function::ALL
        .iter()
        .map(|f| f.info())
        .filter(|info| info.symbol == symbol.as_c_str())
        .peekable();
    if known.peek().is_none() {
        return Some(symbol.as_c_str());
    }
    // Ties (two ABI versions whose per-thread twins share one version) go to the newer ABI.
    known
        .map(|info: &FunctionInfo| (resolve::variant(info, mode), info.version))
        .filter(|&((v, _), _)| v <= version)
        .max_by_key(|&((v, _), abi)| (v, abi))
        .and_then(|((_, export), _)| export)
}

/// Opens the library (the first candidate that is a driver) and initialises it.
fn open(source: Source) -> Result<Loaded, Error> {
    let mut tried = Vec::new();
    let mut stub = None;
    let origin = match &source {
        Source::Search(_, origin) => *origin,
        Source::Adopted(..) => LibraryOrigin::Adopted,
    };
    // Lazily: a later candidate is opened only if the ones before it failed.
    let candidates: Box<dyn Iterator<Item = (Result<libloading::Library, LoadAttempt>, OsString)>> =
        match source {
            Source::Search(explicit, _) => Box::new(
                library::candidates(explicit.as_deref())
                    .into_iter()
                    .map(|c| (library::open(&c), c.name)),
            ),
            Source::Adopted(library, name) => Box::new(std::iter::once((Ok(library), name))),
        };
    for (lib, candidate) in candidates {
        let lib = match lib {
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
                    message: format!("opened, but it is not a CUDA driver: no {missing} export"),
                });
                continue;
            }
        };
        // The name the loader found (`libcuda.so.1`: what the library's kind is judged by), and
        // the file it is (symlinks followed: what `Driver::path` reports).
        let mapped = library::mapped_path(bootstrap.cu_init as *const c_void, &candidate);
        let path = library::followed(mapped.clone());
        // SAFETY: cuInit(0) has no preconditions; 0 is the only valid flag value.
        let rc = unsafe { (bootstrap.cu_init)(0) };
        if rc == CUresult::CUDA_ERROR_STUB_LIBRARY {
            stub.get_or_insert(path);
            continue;
        }
        if rc != CUresult::CUDA_SUCCESS {
            let error = resolve::describe_with(&bootstrap, rc, Some("cuInit"));
            // The error's name and description point into the library's static strings: keep
            // it mapped (a driver is never unloaded anyway).
            std::mem::forget(lib);
            return Err(error.into());
        }
        let mut version = 0;
        // SAFETY: `version` is a valid place for an int.
        let rc = unsafe { (bootstrap.cu_driver_get_version)(&mut version) };
        if rc != CUresult::CUDA_SUCCESS {
            let error = resolve::describe_with(&bootstrap, rc, Some("cuDriverGetVersion"));
            // As above: the error points into the library.
            std::mem::forget(lib);
            return Err(error.into());
        }
        let version = DriverVersion(version);
        let (lib, handle) = library::with_handle(lib);
        return Ok(Loaded {
            handle,
            resolution: ResolutionPath::for_driver(version, &bootstrap),
            kind: LibraryKind::judge(&mapped, version, &bootstrap),
            origin,
            opened_as: candidate,
            path,
            version,
            bootstrap,
            library: lib,
        });
    }
    match stub {
        Some(path) => Err(Error::StubLibrary { path, origin }),
        None => Err(Error::LibraryNotFound { tried, origin }),
    }
}

impl From<CallError> for Error {
    /// The rich error: the code's name and description from the loaded driver where it answers,
    /// else from the pinned header.
    fn from(error: CallError) -> Error {
        let via = match TABLES.get().map(|tables| tables.legacy.resolution_path()) {
            Some(ResolutionPath::ProcAddressV2) => "cuGetProcAddress_v2",
            _ => "cuGetProcAddress",
        };
        let library = || TABLES.get().map(|tables| tables.legacy.loaded.identity());
        error.to_error_with(via, library, |code, function| match TABLES.get() {
            Some(tables) => tables.legacy.describe(code, Some(function)),
            None => {
                let (name, description) = crate::error::builtin_description(code);
                DriverError::new(code, Some(function), name, description)
            }
        })
    }
}
