//! Finding and opening the driver library, and the few exports read before the table exists.

use std::ffi::{CStr, OsStr, OsString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use crate::types::{CUdriverProcAddressQueryResult, CUresult, cuuint64_t};
use crate::version::DriverVersion;

/// The environment variable that names the driver library's path explicitly. Setting it makes the
/// process trust that library as the CUDA driver (see [`driver`](crate::driver)'s Safety section).
pub const LIBRARY_ENV: &str = "CUDA_DL_SYS_LIBRARY";

/// The names tried, in order, when no explicit path is given.
#[cfg(windows)]
pub const DEFAULT_NAMES: &[&str] = &["nvcuda.dll"];
/// The names tried, in order, when no explicit path is given: the name the driver installs first,
/// then the development link name (which may be the toolkit's stub, reported as such).
#[cfg(not(windows))]
pub const DEFAULT_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

/// Where the library to load came from: what an error about it advises to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LibraryOrigin {
    /// The standard search for [`DEFAULT_NAMES`].
    DefaultNames,
    /// The path [`LIBRARY_ENV`] (`CUDA_DL_SYS_LIBRARY`) names: the only candidate while it is set.
    Environment,
    /// A path given to [`Driver::load`](crate::Driver::load) in
    /// [`LoadOptions::library_path`](crate::LoadOptions::library_path).
    Given,
    /// A library given to [`Driver::adopt`](crate::Driver::adopt).
    Adopted,
}

/// What the loaded library is, as far as its file name and exports tell: NVIDIA's driver, or
/// something else with the driver's entry points (a test double such as the workspace's fake, a
/// shim, a renamed copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LibraryKind {
    /// Its file name (as the loader found it: `libcuda.so.1`, before links are followed) is the
    /// driver's (`libcuda.so*`; `nvcuda.dll` on Windows) and it exports the
    /// lookups its version promises (`cuGetProcAddress` from 11.3, `cuGetProcAddress_v2` from 12.0).
    NvidiaDriver,
    /// Its file name is not the driver's.
    OtherName,
    /// It reports a version whose drivers export `cuGetProcAddress` (11.3+) or
    /// `cuGetProcAddress_v2` (12.0+), and lacks that export.
    MissingProcAddress,
}

impl LibraryKind {
    /// Judges the library mapped at `path` that reported `version` and exports `bootstrap`.
    pub(crate) fn judge(path: &Path, version: DriverVersion, bootstrap: &Bootstrap) -> LibraryKind {
        if !has_driver_file_name(path) {
            LibraryKind::OtherName
        } else if (version.0 >= 11030 && bootstrap.cu_get_proc_address.is_none())
            || (version.0 >= 12000 && bootstrap.cu_get_proc_address_v2.is_none())
        {
            LibraryKind::MissingProcAddress
        } else {
            LibraryKind::NvidiaDriver
        }
    }
}

/// Whether `path`'s file name is one NVIDIA's driver installs.
fn has_driver_file_name(path: &Path) -> bool {
    let Some(name) = path.file_name() else {
        return false;
    };
    let name = name.to_string_lossy().to_ascii_lowercase();
    if cfg!(windows) {
        name == "nvcuda.dll"
    } else {
        name.starts_with("libcuda.so")
    }
}

/// The library the process's driver was loaded from, as errors name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverLibrary {
    /// The file the loader mapped (see [`Driver::path`](crate::Driver::path)).
    pub path: PathBuf,
    /// What it is, as far as its name and exports tell.
    pub kind: LibraryKind,
    /// Where it came from.
    pub origin: LibraryOrigin,
}

/// One library name or path the loader tried, and why it did not open.
#[derive(Debug, Clone)]
pub struct LoadAttempt {
    /// The name or path passed to the system loader.
    pub candidate: String,
    /// The loader's message.
    pub message: String,
}

impl LoadAttempt {
    /// The attempts as one line: `name (message), name (message)`, or `nothing`.
    pub(crate) fn list(tried: &[LoadAttempt]) -> String {
        if tried.is_empty() {
            return "nothing".to_string();
        }
        tried
            .iter()
            .map(|a| format!("{} ({})", a.candidate, a.message))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One library to try: a path the caller named, or one of the standard names.
pub(crate) struct Candidate {
    pub(crate) name: OsString,
    /// A standard name, searched where the driver installs it.
    pub(crate) standard: bool,
}

/// The candidates to try: the explicit path alone, or the default names.
pub(crate) fn candidates(explicit: Option<&Path>) -> Vec<Candidate> {
    match explicit {
        Some(path) => vec![Candidate {
            name: path.as_os_str().to_owned(),
            standard: false,
        }],
        None => DEFAULT_NAMES
            .iter()
            .map(|name| Candidate {
                name: OsString::from(name),
                standard: true,
            })
            .collect(),
    }
}

/// Opens one candidate with the system loader: a standard name by the search a driver install
/// serves (on Windows, the system folder only: `nvcuda.dll` is installed in System32, and neither
/// the program's folder nor the current one nor `PATH` is searched, so no `CUDA_PATH` is needed and
/// no other `nvcuda.dll` can be planted), a named path as given.
pub(crate) fn open(candidate: &Candidate) -> Result<libloading::Library, LoadAttempt> {
    let result = if candidate.standard {
        open_standard(&candidate.name)
    } else {
        // SAFETY: opening a library runs its initialisers. The path is vouched for as a CUDA driver
        // (`Driver::load`'s contract; for `CUDA_DL_SYS_LIBRARY`, `driver`'s Safety section); the
        // driver's initialisers have no preconditions that this process could violate.
        unsafe { libloading::Library::new(&candidate.name) }
    };
    result.map_err(|e| LoadAttempt {
        candidate: candidate.name.to_string_lossy().into_owned(),
        message: with_sources(&e),
    })
}

#[cfg(windows)]
fn open_standard(name: &OsString) -> Result<libloading::Library, libloading::Error> {
    use libloading::os::windows::{LOAD_LIBRARY_SEARCH_SYSTEM32, Library};
    // SAFETY: opening the NVIDIA driver's own DLL from the system folder runs its initialisers,
    // which have no preconditions that this process could violate.
    unsafe { Library::load_with_flags(name, LOAD_LIBRARY_SEARCH_SYSTEM32) }.map(Into::into)
}

#[cfg(not(windows))]
fn open_standard(name: &OsString) -> Result<libloading::Library, libloading::Error> {
    // SAFETY: opening the NVIDIA driver's own library by the name it installs (the system
    // loader's search, as for any library the program links) runs its initialisers, which have no
    // preconditions that this process could violate.
    unsafe { libloading::Library::new(name) }
}

/// An error's message followed by those of its sources (libloading keeps `dlerror`'s text there).
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        message.push_str(": ");
        message.push_str(&e.to_string());
        source = e.source();
    }
    message
}

pub(crate) type CuInit = unsafe extern "C" fn(c_uint) -> CUresult;
pub(crate) type CuDriverGetVersion = unsafe extern "C" fn(*mut c_int) -> CUresult;
pub(crate) type CuGetProcAddressV2 = unsafe extern "C" fn(
    *const c_char,
    *mut *mut c_void,
    c_int,
    cuuint64_t,
    *mut CUdriverProcAddressQueryResult,
) -> CUresult;
pub(crate) type CuGetProcAddressV1 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, cuuint64_t) -> CUresult;
pub(crate) type CuGetErrorText = unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult;

/// The exports read by name before the table exists. Their signatures have not changed since the
/// versions that introduced them, so the plain export is the right ABI on every driver.
#[derive(Clone, Copy)]
pub(crate) struct Bootstrap {
    pub(crate) cu_init: CuInit,
    pub(crate) cu_driver_get_version: CuDriverGetVersion,
    pub(crate) cu_get_proc_address_v2: Option<CuGetProcAddressV2>,
    pub(crate) cu_get_proc_address: Option<CuGetProcAddressV1>,
    pub(crate) cu_get_error_name: Option<CuGetErrorText>,
    pub(crate) cu_get_error_string: Option<CuGetErrorText>,
}

impl Bootstrap {
    /// Reads the bootstrap exports; `None` names the first required one that is missing.
    pub(crate) fn read(library: &libloading::Library) -> Result<Bootstrap, &'static str> {
        // SAFETY: (for each `symbol` call below) the type given is the export's C signature as
        // cuda.h/cudaTypedefs.h declare it (PFN_cuInit_v2000, PFN_cuDriverGetVersion_v2020,
        // PFN_cuGetProcAddress_v12000 for the `_v2` export, PFN_cuGetProcAddress_v11030 for the
        // plain one, PFN_cuGetErrorName_v6000, PFN_cuGetErrorString_v6000).
        unsafe {
            Ok(Bootstrap {
                cu_init: symbol(library, c"cuInit").ok_or("cuInit")?,
                cu_driver_get_version: symbol(library, c"cuDriverGetVersion")
                    .ok_or("cuDriverGetVersion")?,
                cu_get_proc_address_v2: symbol(library, c"cuGetProcAddress_v2"),
                cu_get_proc_address: symbol(library, c"cuGetProcAddress"),
                cu_get_error_name: symbol(library, c"cuGetErrorName"),
                cu_get_error_string: symbol(library, c"cuGetErrorString"),
            })
        }
    }
}

/// Looks an export up by name.
///
/// # Safety
/// `F` must be the C function pointer type of the export named `name`.
pub(crate) unsafe fn symbol<F: Copy>(library: &libloading::Library, name: &CStr) -> Option<F> {
    // SAFETY: the caller names the right type; a `Symbol<F>` of a function-pointer type derefs to
    // the function's address as `F`. The pointer stays valid because the library is never unloaded.
    unsafe { library.get::<F>(name).ok().map(|s| *s) }
}

/// Looks an export up by name, as an address.
pub(crate) fn address(library: &libloading::Library, name: &CStr) -> Option<NonNull<c_void>> {
    // SAFETY: reading a symbol's address as a data pointer makes no claim about its type; it is
    // only returned, never called here.
    let p = unsafe { library.get::<*mut c_void>(name).ok().map(|s| *s) }?;
    NonNull::new(p)
}

/// `library` and the system loader's handle of it: one handle per loaded object (`dlopen` of
/// another name of the same file, or of the same file again, gives the same handle); 0 where the
/// platform's handle is not compared ([`is_loaded_as`]).
#[cfg(unix)]
pub(crate) fn with_handle(library: libloading::Library) -> (libloading::Library, usize) {
    let raw = libloading::os::unix::Library::from(library).into_raw();
    // SAFETY: `raw` is the handle `into_raw` just took out of a library; it becomes that library
    // again, which closes it once (when dropped), as before.
    let library = unsafe { libloading::os::unix::Library::from_raw(raw) };
    (library.into(), raw.addr())
}

/// `library` and 0: handles are not compared on this platform.
#[cfg(not(unix))]
pub(crate) fn with_handle(library: libloading::Library) -> (libloading::Library, usize) {
    (library, 0)
}

/// Whether the system loader's `dlopen` of `name` (a path, or a name it searches for) gives the
/// object whose handle is `handle`, already loaded: `libcuda.so` or `libcuda.so.580.xx` for the
/// `libcuda.so.1` loaded (glibc matches a name, a soname or the file's device and inode). Loads
/// nothing (`RTLD_NOLOAD`).
#[cfg(unix)]
pub(crate) fn is_loaded_as(name: &OsStr, handle: usize) -> bool {
    use libloading::os::unix::{Library, RTLD_LAZY};
    if handle == 0 {
        return false;
    }
    // SAFETY: with RTLD_NOLOAD, dlopen never loads: it gives a new reference to an object already
    // loaded, or fails; no initialiser runs.
    let Ok(found) = (unsafe { Library::open(Some(name), RTLD_LAZY | libc::RTLD_NOLOAD) }) else {
        return false;
    };
    let raw = found.into_raw();
    // SAFETY: `raw` is the handle `into_raw` just took out of `found`; dropping the library made
    // of it again closes that one reference (the object stays loaded: the driver holds its own).
    drop(unsafe { Library::from_raw(raw) });
    raw.addr() == handle
}

/// Never: handles are not compared on this platform (names are, by the caller).
#[cfg(not(unix))]
pub(crate) fn is_loaded_as(_name: &OsStr, _handle: usize) -> bool {
    false
}

/// The file `path` names, with symlinks followed (`/usr/lib/x86_64-linux-gnu/libcuda.so.1` is a
/// link to `libcuda.so.580.xx`), or `path` itself where that fails.
pub(crate) fn followed(path: PathBuf) -> PathBuf {
    std::fs::canonicalize(&path).unwrap_or(path)
}

/// The file the loader mapped for `library` (found through its `cuInit`), or `name`.
pub(crate) fn loaded_path(library: &libloading::Library, name: &OsString) -> PathBuf {
    match address(library, c"cuInit") {
        Some(p) => mapped_path(p.as_ptr(), name),
        None => PathBuf::from(name),
    }
}

/// The file the loader actually mapped for the function at `address` (following symlinks such as
/// `libcuda.so.1`), when the platform can say.
#[cfg(unix)]
pub(crate) fn mapped_path(address: *const c_void, fallback: &OsString) -> PathBuf {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `address` as a number and writes `info`, a valid `Dl_info`.
    let found = unsafe { libc::dladdr(address, info.as_mut_ptr()) };
    if found != 0 {
        // SAFETY: dladdr returned non-zero, so it filled `info`.
        let info = unsafe { info.assume_init() };
        if !info.dli_fname.is_null() {
            // SAFETY: dli_fname is a NUL-terminated path owned by the loader, valid while the object
            // is mapped (for ever: the driver is never unloaded); it is copied at once.
            let name = unsafe { CStr::from_ptr(info.dli_fname) };
            return PathBuf::from(name.to_string_lossy().into_owned());
        }
    }
    PathBuf::from(fallback)
}

/// The file the loader mapped (the name it was opened under, where the platform cannot say more).
#[cfg(not(unix))]
pub(crate) fn mapped_path(_address: *const c_void, fallback: &OsString) -> PathBuf {
    PathBuf::from(fallback)
}

#[cfg(test)]
mod tests {
    use std::ffi::{c_char, c_int, c_uint, c_void};
    use std::path::Path;

    use super::{Bootstrap, LibraryKind};
    use crate::types::{CUdriverProcAddressQueryResult, CUresult, cuuint64_t};
    use crate::version::DriverVersion;

    unsafe extern "C" fn init(_: c_uint) -> CUresult {
        CUresult::CUDA_SUCCESS
    }
    unsafe extern "C" fn version(_: *mut c_int) -> CUresult {
        CUresult::CUDA_SUCCESS
    }
    unsafe extern "C" fn v1(
        _: *const c_char,
        _: *mut *mut c_void,
        _: c_int,
        _: cuuint64_t,
    ) -> CUresult {
        CUresult::CUDA_SUCCESS
    }
    unsafe extern "C" fn v2(
        _: *const c_char,
        _: *mut *mut c_void,
        _: c_int,
        _: cuuint64_t,
        _: *mut CUdriverProcAddressQueryResult,
    ) -> CUresult {
        CUresult::CUDA_SUCCESS
    }

    fn exports(v1_export: bool, v2_export: bool) -> Bootstrap {
        Bootstrap {
            cu_init: init,
            cu_driver_get_version: version,
            cu_get_proc_address_v2: v2_export.then_some(v2 as _),
            cu_get_proc_address: v1_export.then_some(v1 as _),
            cu_get_error_name: None,
            cu_get_error_string: None,
        }
    }

    #[cfg(not(windows))]
    #[test]
    fn only_a_library_named_libcuda_with_the_lookups_its_version_promises_is_nvidias_driver() {
        let judge = |path: &str, v: i32, b: &Bootstrap| {
            LibraryKind::judge(Path::new(path), DriverVersion(v), b)
        };
        let full = exports(true, true);
        for name in [
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib/wsl/lib/libcuda.so.1",
            "libcuda.so.580.65.06",
            "/opt/LIBCUDA.SO",
        ] {
            assert_eq!(
                judge(name, 13000, &full),
                LibraryKind::NvidiaDriver,
                "{name}"
            );
        }
        for name in [
            "/target/debug/deps/libfake_cuda.so",
            "/opt/libcudart.so.13",
            "/",
        ] {
            assert_eq!(judge(name, 13000, &full), LibraryKind::OtherName, "{name}");
        }
        let libcuda = "/usr/lib/libcuda.so.1";
        // 12.0+ without cuGetProcAddress_v2, 11.3+ without cuGetProcAddress: not a driver's exports.
        assert_eq!(
            judge(libcuda, 12000, &exports(true, false)),
            LibraryKind::MissingProcAddress
        );
        assert_eq!(
            judge(libcuda, 11080, &exports(true, false)),
            LibraryKind::NvidiaDriver
        );
        assert_eq!(
            judge(libcuda, 11030, &exports(false, false)),
            LibraryKind::MissingProcAddress
        );
        assert_eq!(
            judge(libcuda, 11020, &exports(false, false)),
            LibraryKind::NvidiaDriver
        );
    }
}
