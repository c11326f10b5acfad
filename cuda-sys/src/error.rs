//! Every way a driver call can fail, each saying what happened and what to do about it.

use std::fmt;
use std::path::PathBuf;

use crate::library::{
    DEFAULT_NAMES, DriverLibrary, LIBRARY_ENV, LibraryKind, LibraryOrigin, LoadAttempt,
};
use crate::table::Function;
use crate::types::CUresult;
use crate::version::DriverVersion;

/// An error from loading the driver, resolving one of its functions, or a function's own result.
///
/// Library code never panics on any of these: each is returned to the caller.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No candidate library could be opened as the driver. `tried` lists every name or path, with
    /// the loader's message for each; `origin` says where they came from (the default names, or
    /// the one path `CUDA_DL_SYS_LIBRARY` or the caller named), which decides what to fix.
    #[error("{}", library_not_found(tried, *origin))]
    LibraryNotFound {
        /// Each name or path tried, in order, with why it failed.
        tried: Vec<LoadAttempt>,
        /// Where the candidates came from.
        origin: LibraryOrigin,
    },

    /// The library that opened is the CUDA toolkit's link-time stub, not the driver.
    #[error(
        "{} is the CUDA toolkit's stub library (cuInit returned CUDA_ERROR_STUB_LIBRARY, 34): it \
         exists only for linking and cannot run anything. {}",
        path.display(),
        stub_advice(*origin)
    )]
    StubLibrary {
        /// The stub's path, as the loader reported it.
        path: PathBuf,
        /// Where the stub's name or path came from.
        origin: LibraryOrigin,
    },

    /// The loaded library does not provide a function at the ABI version the table binds, though
    /// its version number says it could. Other functions are unaffected. The message says which
    /// library was loaded; if it is not NVIDIA's driver (see [`LibraryKind`]), it says so rather
    /// than advising a driver upgrade.
    #[error("{}", symbol_missing(function, *required, *found, *reason, library.as_ref()))]
    SymbolMissing {
        /// The table name of the function.
        function: &'static str,
        /// The ABI version the table binds.
        required: u32,
        /// The installed driver's version.
        found: DriverVersion,
        /// What the lookup said.
        reason: MissingReason,
        /// The library it was looked up in (`None` only for an error made without a loaded
        /// driver).
        library: Option<DriverLibrary>,
    },

    /// The function's ABI version is newer than the installed driver. Nothing was called. The
    /// message advises a driver upgrade only if the loaded library is NVIDIA's driver (see
    /// [`LibraryKind`]); for another library (a test double such as the workspace's fake) it says
    /// so instead.
    #[error("{}", driver_too_old(function, *required, *found, library.as_ref()))]
    DriverTooOld {
        /// The table name of the function.
        function: &'static str,
        /// The version the function's signature binds (`1000 * major + 10 * minor`: 13010 is
        /// CUDA 13.1). A `u32`, as the generated table's and [`FunctionInfo::version`](crate::FunctionInfo::version)
        /// are (a version is never negative); [`DriverVersion`] wraps the driver's own `int`.
        required: u32,
        /// The installed driver's version.
        found: DriverVersion,
        /// The library the driver was loaded from (`None` only for an error made without a
        /// loaded driver).
        library: Option<DriverLibrary>,
    },

    /// The driver ran the function and returned a code other than `CUDA_SUCCESS`.
    #[error(transparent)]
    Driver(#[from] DriverError),

    /// The driver is already loaded from another library; it is loaded once per process.
    #[error(
        "the CUDA driver is already loaded from {loaded}; it is loaded once per process and never \
         unloaded, so {requested} cannot be opened now. Load the same library everywhere, or name \
         it before the first call"
    )]
    AlreadyLoaded {
        /// What was loaded first.
        loaded: String,
        /// What was asked for now.
        requested: String,
    },

    /// The driver was asked for from inside its own first load, on the thread loading it: from
    /// the library's `cuInit` or `cuDriverGetVersion`, or something they called (a hook of a test
    /// double, an interposer). That load cannot wait for itself; it goes on, and the driver is
    /// there once it returns.
    #[error(
        "the CUDA driver was asked for while this thread is loading it (from inside the library's \
         cuInit or cuDriverGetVersion, or something they called): a load cannot wait for itself. \
         Call the driver only after the first load has returned"
    )]
    LoadReentered,

    /// This process was forked while a thread of its parent was loading the driver: that load
    /// never finishes in this process, and the driver cannot be loaded here.
    #[error(
        "this process was forked while its parent was loading the CUDA driver; the load cannot \
         finish in this process, and CUDA cannot be used here. Load the driver before forking \
         (and use it only in the parent), or in the child only (the CUDA driver does not support \
         a child of a process that initialised it), or start the child with exec"
    )]
    ForkedDuringLoad,

    /// An environment variable this crate reads holds a value it does not understand.
    #[error("{variable}={value:?} is not understood; set it to {expected}, or unset it")]
    InvalidEnvironment {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What it may hold.
        expected: &'static str,
    },

    /// A symbol name given to [`Driver::get_proc_address`](crate::Driver::get_proc_address) is not a
    /// valid C string.
    #[error("{0:?} is not a valid symbol name: it contains a NUL byte")]
    InvalidSymbolName(String),
}

/// [`Error::DriverTooOld`]'s message: upgrade the driver, unless the library is not NVIDIA's.
fn driver_too_old(
    function: &str,
    required: u32,
    found: DriverVersion,
    library: Option<&DriverLibrary>,
) -> String {
    let needs = format!(
        "{function} needs a driver that supports CUDA {}; the loaded driver supports CUDA {found}",
        DriverVersion(required as i32)
    );
    match library.filter(|l| l.kind != LibraryKind::NvidiaDriver) {
        Some(library) => format!(
            "{needs}. The loaded library {} is not NVIDIA's driver (its file name is not \
             libcuda.so*), so upgrading the NVIDIA driver will not change it: make that library \
             report CUDA {} or newer (the workspace's fake driver: FAKE_CUDA_VERSION or \
             set_version), or load NVIDIA's driver",
            library.path.display(),
            DriverVersion(required as i32)
        ),
        None => format!("{needs}. Upgrade the NVIDIA driver"),
    }
}

/// [`Error::LibraryNotFound`]'s message: what was tried, and what to fix for where it came from.
fn library_not_found(tried: &[LoadAttempt], origin: LibraryOrigin) -> String {
    let tried_text = LoadAttempt::list(tried);
    let driver = DEFAULT_NAMES[0];
    match origin {
        LibraryOrigin::Environment => format!(
            "{LIBRARY_ENV} is set, so only the library it names was tried, and it could not be \
             loaded as the CUDA driver: {tried_text}. Fix {LIBRARY_ENV} to name the NVIDIA driver \
             library ({driver}, with its full path), or unset it to search for the installed driver"
        ),
        LibraryOrigin::Given => format!(
            "the library path given to Driver::load could not be loaded as the CUDA driver: \
             {tried_text}. Give the path of the NVIDIA driver library ({driver}), or load without a \
             path to search for the installed driver"
        ),
        LibraryOrigin::Adopted => format!(
            "the library given to Driver::adopt is not a CUDA driver: {tried_text}. Adopt the \
             NVIDIA driver library ({driver})"
        ),
        LibraryOrigin::DefaultNames => format!(
            "the NVIDIA CUDA driver library could not be loaded; tried {tried_text}. Install the \
             NVIDIA driver (it provides {driver}), or set {LIBRARY_ENV} to the library's full path"
        ),
    }
}

/// What to do about the stub, for where its name or path came from.
fn stub_advice(origin: LibraryOrigin) -> String {
    let driver = DEFAULT_NAMES[0];
    match origin {
        LibraryOrigin::Environment => format!(
            "{LIBRARY_ENV} names it: set {LIBRARY_ENV} to the NVIDIA driver's {driver} (install the \
             NVIDIA driver if there is none), or unset it"
        ),
        LibraryOrigin::Given | LibraryOrigin::Adopted => format!(
            "Load the NVIDIA driver's {driver} instead (install the NVIDIA driver if there is none)"
        ),
        LibraryOrigin::DefaultNames => format!(
            "Install the NVIDIA driver, take the toolkit's lib64/stubs folder off LD_LIBRARY_PATH, \
             or set {LIBRARY_ENV} to the real {driver}"
        ),
    }
}

/// [`Error::SymbolMissing`]'s message: which library lacks the function, and what to do, which is
/// to upgrade only where the library is NVIDIA's driver.
fn symbol_missing(
    function: &str,
    required: u32,
    found: DriverVersion,
    reason: MissingReason,
    library: Option<&DriverLibrary>,
) -> String {
    let required = DriverVersion(required as i32);
    let not_nvidia = library.filter(|l| l.kind != LibraryKind::NvidiaDriver);
    match not_nvidia {
        Some(library) if reason != MissingReason::NoPerThreadVariant => {
            let why = match library.kind {
                LibraryKind::MissingProcAddress if found.0 >= 12000 => format!(
                    "it reports CUDA {found} but does not export cuGetProcAddress_v2, which every \
                     NVIDIA driver since 12.0 does"
                ),
                LibraryKind::MissingProcAddress => format!(
                    "it reports CUDA {found} but does not export cuGetProcAddress, which every \
                     NVIDIA driver since 11.3 does"
                ),
                _ if cfg!(windows) => "its file name is not nvcuda.dll".to_string(),
                _ => "its file name is not libcuda.so*".to_string(),
            };
            let instead = match library.origin {
                LibraryOrigin::Environment => format!(
                    "set {LIBRARY_ENV} to the NVIDIA driver's {} or unset it",
                    DEFAULT_NAMES[0]
                ),
                _ => format!("load the NVIDIA driver ({}) instead", DEFAULT_NAMES[0]),
            };
            format!(
                "the loaded library {} (reporting CUDA {found}) lacks {function} (ABI version \
                 {required}): {reason}. That library is not NVIDIA's driver ({why}), so upgrading \
                 the driver will not help: use a library that provides {function}, or {instead}",
                library.path.display()
            )
        }
        _ => {
            let at = library
                .map(|l| format!(", {}", l.path.display()))
                .unwrap_or_default();
            format!(
                "the installed driver (CUDA {found}{at}) does not provide {function} (ABI version \
                 {required}): {reason}. {}",
                reason.advice()
            )
        }
    }
}

impl Error {
    /// The driver's result code, when this error is one.
    pub fn code(&self) -> Option<CUresult> {
        match self {
            Error::Driver(e) => Some(e.code()),
            _ => None,
        }
    }
}

/// Why a lookup found no function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MissingReason {
    /// `cuGetProcAddress` returned no pointer: `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND` or, on
    /// 11.3–11.8 drivers, `CUDA_ERROR_NOT_FOUND`.
    NotFound,
    /// `cuGetProcAddress` returned `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
    VersionNotSufficient,
    /// `cuGetProcAddress` rejected the request with `CUDA_ERROR_INVALID_VALUE`.
    Rejected,
    /// The library does not export the symbol (drivers older than 11.3 are looked up by export).
    NotExported,
    /// The driver is loaded for per-thread default-stream semantics, and this ABI version of the
    /// function has no per-thread variant: the driver offers one only for newer ABI versions of
    /// the function (`cuMemcpyAtoA` at 2.0; `cuGetProcAddress` answers
    /// `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`). Known from the table, the same on every
    /// driver: the driver is not asked, and an older driver's legacy export is never used.
    NoPerThreadVariant,
    /// `cuGetProcAddress` returned a pointer that is not the library's export of this ABI variant
    /// (`cuLaunchHostFunc_v2`), for an entry whose `cudaTypedefs.h` version is a placeholder
    /// ([`FunctionInfo::placeholder_version`](crate::FunctionInfo::placeholder_version)): the
    /// driver registers the variant at another version than the table asks for, so the pointer
    /// is another ABI (an older one, with other parameters) and is never called.
    OtherVariant,
}

impl MissingReason {
    /// What to do about it.
    pub fn advice(self) -> &'static str {
        match self {
            MissingReason::NoPerThreadVariant => {
                "Call the function's newest variant, or this one through `Driver::legacy()` \
                 (legacy default-stream semantics)"
            }
            MissingReason::OtherVariant => {
                "Call the function's older variant (without what this one adds) meanwhile, and \
                 report the driver's version to cuda-dl-sys: its table asks for this variant at a \
                 version this driver registers another one at"
            }
            _ => "Upgrade the NVIDIA driver, or do without this function",
        }
    }
}

impl fmt::Display for MissingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MissingReason::NotFound => "cuGetProcAddress found no such symbol",
            MissingReason::VersionNotSufficient => {
                "cuGetProcAddress has the symbol only in a newer ABI version"
            }
            MissingReason::Rejected => {
                "cuGetProcAddress rejected the request (CUDA_ERROR_INVALID_VALUE)"
            }
            MissingReason::NotExported => "the library does not export it",
            MissingReason::NoPerThreadVariant => {
                "this ABI version has no per-thread default-stream variant (the driver has one \
                 only for newer ABI versions of the function)"
            }
            MissingReason::OtherVariant => {
                "cuGetProcAddress returned another ABI variant, not the library's export of this \
                 one"
            }
        })
    }
}

/// A `CUresult` other than `CUDA_SUCCESS`, with the driver's own name and description of it.
///
/// The name and description come from `cuGetErrorName`/`cuGetErrorString`, or from the pinned
/// header's table when the driver cannot answer (an old driver, or a code it does not know).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DriverError {
    code: CUresult,
    function: Option<&'static str>,
    name: &'static str,
    description: &'static str,
}

impl DriverError {
    pub(crate) fn new(
        code: CUresult,
        function: Option<&'static str>,
        name: &'static str,
        description: &'static str,
    ) -> Self {
        DriverError {
            code,
            function,
            name,
            description,
        }
    }

    /// A `DriverError` described from the built-in table alone (no driver needed).
    pub fn from_code(code: CUresult) -> Self {
        let (name, description) = builtin_description(code);
        DriverError {
            code,
            function: None,
            name,
            description,
        }
    }

    /// The raw result code.
    pub fn code(&self) -> CUresult {
        self.code
    }

    /// The table name of the function that returned it, when known.
    pub fn function(&self) -> Option<&'static str> {
        self.function
    }

    /// The code's name, such as `CUDA_ERROR_INVALID_HANDLE`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The driver's description of the code.
    pub fn description(&self) -> &'static str {
        self.description
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(function) = self.function {
            write!(f, "{function} failed: ")?;
        }
        write!(f, "{} ({}): {}", self.name, self.code.0, self.description)
    }
}

impl fmt::Debug for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DriverError")
            .field("code", &self.code.0)
            .field("name", &self.name)
            .field("function", &self.function)
            .finish()
    }
}

impl std::error::Error for DriverError {}

/// Name and description of a code from the pinned header, or a generic pair for unknown codes.
pub(crate) fn builtin_description(code: CUresult) -> (&'static str, &'static str) {
    match crate::generated_result_codes::RESULT_CODES
        .iter()
        .find(|(c, _, _)| *c == code.0)
    {
        Some((_, name, description)) => (name, description),
        None => (
            "CUDA_ERROR_UNRECOGNIZED",
            "a result code that neither the driver nor this crate's header knows",
        ),
    }
}

/// Why a checked call failed, in 12 bytes and `Copy`: the error of the call layer
/// (`driver.cuStreamSynchronize(stream)` and every other function's method).
///
/// It names the function and holds the driver's `CUresult` (or why the function could not be
/// called); [`Error::from`] turns it into the rich [`Error`], with the code's name and description,
/// when someone wants to read it. `?` does that conversion where the caller returns [`Error`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CallError {
    /// The `CUresult` for [`CallErrorKind::Driver`] and [`CallErrorKind::LookupFailed`]; the driver's
    /// version otherwise.
    value: i32,
    /// The ABI version the function was looked up at (0 for a driver result).
    required: u32,
    function: Function,
    kind: CallErrorKind,
}

/// What kind of failure a [`CallError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CallErrorKind {
    /// The driver ran the function and returned a code other than `CUDA_SUCCESS`.
    Driver,
    /// The function's ABI version is newer than the driver ([`Error::DriverTooOld`]).
    DriverTooOld,
    /// The driver does not provide the function ([`Error::SymbolMissing`]).
    SymbolMissing(MissingReason),
    /// Looking the function up failed with a `CUresult` that may pass (`CUDA_ERROR_NOT_INITIALIZED`,
    /// say); nothing was cached.
    LookupFailed,
}

impl CallError {
    /// The function returned `code`.
    pub(crate) fn driver(function: Function, code: CUresult) -> CallError {
        CallError {
            value: code.0 as i32,
            required: 0,
            function,
            kind: CallErrorKind::Driver,
        }
    }

    /// The function could not be called: `kind` is not [`CallErrorKind::Driver`].
    pub(crate) fn unavailable(
        function: Function,
        kind: CallErrorKind,
        required: u32,
        found: DriverVersion,
    ) -> CallError {
        CallError {
            value: found.0,
            required,
            function,
            kind,
        }
    }

    /// Looking the function up failed with `code`.
    pub(crate) fn lookup_failed(function: Function, code: CUresult) -> CallError {
        CallError {
            value: code.0 as i32,
            required: 0,
            function,
            kind: CallErrorKind::LookupFailed,
        }
    }

    /// The function that failed or could not be called.
    pub fn function(&self) -> Function {
        self.function
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> CallErrorKind {
        self.kind
    }

    /// The driver's result code, when the function ran (or its lookup failed) with one.
    pub fn code(&self) -> Option<CUresult> {
        match self.kind {
            CallErrorKind::Driver | CallErrorKind::LookupFailed => Some(CUresult(self.value as _)),
            _ => None,
        }
    }

    /// The rich error, with the code's name and description from `describe`; a failed lookup is
    /// reported as `lookup_via`'s (`cuGetProcAddress_v2`, say); a missing symbol names `library`'s.
    pub(crate) fn to_error_with(
        self,
        lookup_via: &'static str,
        library: impl FnOnce() -> Option<DriverLibrary>,
        describe: impl FnOnce(CUresult, &'static str) -> DriverError,
    ) -> Error {
        let function = self.function.name();
        match self.kind {
            CallErrorKind::Driver => Error::Driver(describe(CUresult(self.value as _), function)),
            CallErrorKind::LookupFailed => {
                Error::Driver(describe(CUresult(self.value as _), lookup_via))
            }
            CallErrorKind::DriverTooOld => Error::DriverTooOld {
                function,
                required: self.required,
                found: DriverVersion(self.value),
                library: library(),
            },
            CallErrorKind::SymbolMissing(reason) => Error::SymbolMissing {
                function,
                required: self.required,
                found: DriverVersion(self.value),
                reason,
                library: library(),
            },
        }
    }
}

impl fmt::Debug for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallError")
            .field("function", &self.function)
            .field("kind", &self.kind)
            .field("code", &self.code().map(|c| c.0))
            .finish()
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Error::from(*self), f)
    }
}

impl std::error::Error for CallError {}

#[cfg(test)]
mod tests {
    use super::{CallError, CallErrorKind, Error, MissingReason};
    use crate::table::Function;
    use crate::types::CUresult;
    use crate::version::DriverVersion;

    #[test]
    fn a_checked_calls_error_is_at_most_16_bytes_and_so_is_its_result() {
        assert!(size_of::<CallError>() <= 16, "{}", size_of::<CallError>());
        assert!(size_of::<Result<(), CallError>>() <= 16);
        assert_eq!(size_of::<CallError>(), 12);
    }

    #[test]
    fn a_call_error_becomes_the_rich_error_with_the_same_function_code_and_versions() {
        let e = CallError::driver(
            Function::cuStreamSynchronize,
            CUresult::CUDA_ERROR_INVALID_HANDLE,
        );
        assert_eq!(e.code(), Some(CUresult::CUDA_ERROR_INVALID_HANDLE));
        match Error::from(e) {
            Error::Driver(d) => {
                assert_eq!(d.code(), CUresult::CUDA_ERROR_INVALID_HANDLE);
                assert_eq!(d.function(), Some("cuStreamSynchronize"));
                assert_eq!(d.name(), "CUDA_ERROR_INVALID_HANDLE");
            }
            other => panic!("{other:?}"),
        }
        let e = CallError::unavailable(
            Function::cuLaunchHostFunc_v2,
            CallErrorKind::DriverTooOld,
            13020,
            DriverVersion(12040),
        );
        assert_eq!(e.code(), None);
        assert!(matches!(
            Error::from(e),
            Error::DriverTooOld {
                function: "cuLaunchHostFunc_v2",
                required: 13020,
                found: DriverVersion(12040),
                library: None,
            }
        ));
        let e = CallError::unavailable(
            Function::cuInit,
            CallErrorKind::SymbolMissing(MissingReason::NotExported),
            2000,
            DriverVersion(10020),
        );
        assert!(matches!(
            Error::from(e),
            Error::SymbolMissing {
                function: "cuInit",
                required: 2000,
                reason: MissingReason::NotExported,
                ..
            }
        ));
        assert!(e.to_string().contains("cuInit"), "{e}");
    }
}
