//! Resolving one table entry: the version gate, the lookup through `cuGetProcAddress_v2`,
//! `cuGetProcAddress` or the versioned export, and the per-entry cache.

use std::ffi::{CStr, OsString, c_char, c_void};
use std::path::PathBuf;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::error::{
    CallError, CallErrorKind, DriverError, Error, MissingReason, builtin_description,
};
use crate::library::{self, Bootstrap, DriverLibrary, LibraryKind, LibraryOrigin};
use crate::streams::DefaultStream;
use crate::table::{Function, FunctionInfo};
use crate::types::{CUdriverProcAddressQueryResult, CUresult};
use crate::version::DriverVersion;

/// How a driver's functions are looked up, chosen once from its version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResolutionPath {
    /// `cuGetProcAddress_v2(symbol, &pfn, version, flags, &status)`: drivers 12.0 and newer.
    ProcAddressV2,
    /// `cuGetProcAddress(symbol, &pfn, version, flags)`: drivers 11.3 to 11.8.
    ProcAddress,
    /// The versioned export (`cuMemAlloc_v2`, `cuStreamSynchronize_ptsz`) by name: older drivers.
    Exports,
}

impl ResolutionPath {
    pub(crate) fn for_driver(version: DriverVersion, bootstrap: &Bootstrap) -> ResolutionPath {
        if version.0 >= 12000 && bootstrap.cu_get_proc_address_v2.is_some() {
            ResolutionPath::ProcAddressV2
        } else if version.0 >= 11030 && bootstrap.cu_get_proc_address.is_some() {
            ResolutionPath::ProcAddress
        } else {
            ResolutionPath::Exports
        }
    }
}

/// The opened driver library and what was learnt at load: shared by both default-stream tables.
pub(crate) struct Loaded {
    /// Kept open for the life of the process: a `Loaded` is leaked at load, never dropped.
    pub(crate) library: libloading::Library,
    /// The system loader's handle of `library` (`library::with_handle`): how another name of the
    /// same file is recognised.
    pub(crate) handle: usize,
    pub(crate) opened_as: OsString,
    pub(crate) path: PathBuf,
    pub(crate) version: DriverVersion,
    pub(crate) resolution: ResolutionPath,
    pub(crate) bootstrap: Bootstrap,
    /// NVIDIA's driver or another library, as its name and exports tell.
    pub(crate) kind: LibraryKind,
    pub(crate) origin: LibraryOrigin,
}

/// The errors a slot caches once its entry resolved to one: the slot holds `1 + ` the error's
/// index here; any value above [`SLOT_LAST_SENTINEL`] is the function's address. No function lives
/// in the first page of the address space, so these never collide with one.
const CACHED_ERRORS: [CallErrorKind; 7] = [
    CallErrorKind::DriverTooOld,
    CallErrorKind::SymbolMissing(MissingReason::NotFound),
    CallErrorKind::SymbolMissing(MissingReason::VersionNotSufficient),
    CallErrorKind::SymbolMissing(MissingReason::Rejected),
    CallErrorKind::SymbolMissing(MissingReason::NotExported),
    CallErrorKind::SymbolMissing(MissingReason::NoPerThreadVariant),
    CallErrorKind::SymbolMissing(MissingReason::OtherVariant),
];
const _: () = assert!(CACHED_ERRORS.len() <= SLOT_LAST_SENTINEL);

/// The slot value that caches `kind` (one of [`CACHED_ERRORS`]).
fn sentinel(kind: CallErrorKind) -> *mut c_void {
    let index = CACHED_ERRORS.iter().position(|k| *k == kind);
    // Not cached (never: each caller passes a listed kind) reads as "not yet resolved".
    ptr::without_provenance_mut(index.map_or(0, |i| i + 1))
}

/// Slot values up to this one are sentinels (`0` = not yet resolved).
pub(crate) const SLOT_LAST_SENTINEL: usize = 15;

/// Stores `value` (an address or a sentinel, never null) in `slot` if it is still unresolved, and
/// returns what the slot holds then: `value`, or the outcome another thread cached first.
fn cache(slot: &AtomicPtr<c_void>, value: *mut c_void) -> *mut c_void {
    // AcqRel: publishes `value` to later readers; Acquire on failure, as the fast path's load,
    // to read another thread's address.
    match slot.compare_exchange(ptr::null_mut(), value, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => value,
        Err(current) => current,
    }
}

/// What a resolved slot's value means: the function's address, or the kind of error cached.
fn outcome(value: *mut c_void) -> Result<*mut c_void, CallErrorKind> {
    if value.addr() > SLOT_LAST_SENTINEL {
        return Ok(value);
    }
    let kind = value
        .addr()
        .checked_sub(1)
        .and_then(|i| CACHED_ERRORS.get(i).copied());
    // Unset (never passed here: `cache` stores no null) reads as nothing found.
    Err(kind.unwrap_or(CallErrorKind::SymbolMissing(MissingReason::NotFound)))
}

/// What one lookup found.
pub(crate) enum Lookup {
    Found(NonNull<c_void>),
    Missing(MissingReason),
    /// The lookup itself failed with this code, in a way that may pass (`CUDA_ERROR_NOT_INITIALIZED`,
    /// say): reported, not cached.
    Failed(CUresult, &'static str),
}

/// The ABI version to ask for and the export to look up, for a default-stream mode. The export is
/// `None` where that ABI version has no variant in the mode: a per-thread lookup of a version
/// without a per-thread twin, of a function that has per-thread variants in other ABI versions.
/// `cuGetProcAddress` then answers `VERSION_NOT_SUFFICIENT` (a 13.0 driver does for
/// `cuMemcpyAtoA` at 2.0), and the exports of older drivers are not looked up either: their
/// legacy export would give the legacy default stream's semantics in per-thread mode.
pub(crate) fn variant(info: &FunctionInfo, mode: DefaultStream) -> (u32, Option<&'static CStr>) {
    match (mode, info.per_thread_export, info.per_thread_version) {
        (DefaultStream::PerThread, Some(export), Some(version)) => (version, Some(export)),
        (DefaultStream::PerThread, _, _) if has_per_thread_variants(info) => (info.version, None),
        _ => (info.version, Some(info.export)),
    }
}

/// Whether `info`'s symbol has a per-thread variant in some ABI version of the table.
fn has_per_thread_variants(info: &FunctionInfo) -> bool {
    Function::ALL
        .iter()
        .any(|f| f.info().symbol == info.symbol && f.info().per_thread_export.is_some())
}

impl Loaded {
    /// Resolves `function` into `slot` (or returns why it cannot be), caching the outcome. The
    /// caller's fast path has already seen the slot hold no address.
    ///
    /// The first outcome cached wins: threads resolving the same entry at once each look it up,
    /// but only one stores (a compare-exchange from "not yet resolved"), and every one returns
    /// what the slot holds then. So a lookup that fails after another thread's succeeded (a
    /// transient `CUDA_ERROR_NOT_FOUND`, say) never replaces the cached function.
    #[cold]
    #[inline(never)]
    pub(crate) fn resolve_slot(
        &self,
        slot: &AtomicPtr<c_void>,
        function: Function,
        mode: DefaultStream,
    ) -> Result<*mut c_void, CallError> {
        let info = function.info();
        let (version, export) = variant(info, mode);
        let unavailable = |kind| CallError::unavailable(function, kind, version, self.version);
        let cached = slot.load(Ordering::Acquire);
        if !cached.is_null() {
            // Another thread resolved it since the caller looked.
            return outcome(cached).map_err(unavailable);
        }
        let value = if version > self.version.0 as u32 {
            sentinel(CallErrorKind::DriverTooOld)
        } else if let Some(export) = export {
            match self.lookup(info.symbol, version, Some(export), mode) {
                Lookup::Found(p) if info.placeholder_version.is_some() => {
                    if self.is_the_export(p, export) {
                        p.as_ptr()
                    } else {
                        sentinel(CallErrorKind::SymbolMissing(MissingReason::OtherVariant))
                    }
                }
                Lookup::Found(p) => p.as_ptr(),
                Lookup::Missing(reason) => sentinel(CallErrorKind::SymbolMissing(reason)),
                Lookup::Failed(code, _) => return Err(CallError::lookup_failed(function, code)),
            }
        } else {
            // No variant at this ABI version in this mode (see `variant`), and no newer driver
            // will change that: not asked of the driver, whose lookup paths answer it differently
            // (`VERSION_NOT_SUFFICIENT`, or not found through `cuGetProcAddress` before 12.0).
            sentinel(CallErrorKind::SymbolMissing(
                MissingReason::NoPerThreadVariant,
            ))
        };
        outcome(cache(slot, value)).map_err(unavailable)
    }

    /// Whether `found` (what `cuGetProcAddress` returned for an entry whose typedef's version is
    /// a placeholder) is the library's export `export` of that variant. A library without that
    /// export cannot be checked, and is believed.
    fn is_the_export(&self, found: NonNull<c_void>, export: &CStr) -> bool {
        library::address(&self.library, export).is_none_or(|e| e == found)
    }

    /// One lookup of `symbol` at `version` with `mode`'s flag; on drivers older than 11.3, of the
    /// export `export` (`None`: that version has no export in this mode, as `cuGetProcAddress`'s
    /// `VERSION_NOT_SUFFICIENT`).
    pub(crate) fn lookup(
        &self,
        symbol: &CStr,
        version: u32,
        export: Option<&CStr>,
        mode: DefaultStream,
    ) -> Lookup {
        let flags = mode.proc_address_flag();
        let version = version as i32;
        match self.resolution {
            ResolutionPath::ProcAddressV2 => {
                let Some(get) = self.bootstrap.cu_get_proc_address_v2 else {
                    return Lookup::Missing(MissingReason::NotFound);
                };
                // Both are left unwritten when the driver rejects the request: start from values that
                // read as "nothing found".
                let mut pfn: *mut c_void = ptr::null_mut();
                let mut status =
                    CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
                // SAFETY: `symbol` is NUL-terminated; `pfn` and `status` are valid places to write.
                let rc = unsafe { get(symbol.as_ptr(), &mut pfn, version, flags, &mut status) };
                interpret(rc, pfn, Some(status), "cuGetProcAddress_v2")
            }
            ResolutionPath::ProcAddress => {
                let Some(get) = self.bootstrap.cu_get_proc_address else {
                    return Lookup::Missing(MissingReason::NotFound);
                };
                let mut pfn: *mut c_void = ptr::null_mut();
                // SAFETY: `symbol` is NUL-terminated; `pfn` is a valid place to write.
                let rc = unsafe { get(symbol.as_ptr(), &mut pfn, version, flags) };
                interpret(rc, pfn, None, "cuGetProcAddress")
            }
            ResolutionPath::Exports => match export {
                None => Lookup::Missing(MissingReason::VersionNotSufficient),
                Some(e) => library::address(&self.library, e)
                    .map_or(Lookup::Missing(MissingReason::NotExported), Lookup::Found),
            },
        }
    }

    /// The library, as errors name it.
    pub(crate) fn identity(&self) -> DriverLibrary {
        DriverLibrary {
            path: self.path.clone(),
            kind: self.kind,
            origin: self.origin,
        }
    }

    /// A [`DriverError`] for `code`, named and described by the driver where it can, else from the
    /// pinned header.
    pub(crate) fn describe(&self, code: CUresult, function: Option<&'static str>) -> DriverError {
        describe_with(&self.bootstrap, code, function)
    }

    /// The rich error for a lookup outcome that is not `Found`.
    pub(crate) fn lookup_error(
        &self,
        lookup: Lookup,
        function: &'static str,
        required: u32,
    ) -> Error {
        match lookup {
            Lookup::Found(_) => Error::SymbolMissing {
                function,
                required,
                found: self.version,
                reason: MissingReason::NotFound,
                library: Some(self.identity()),
            },
            Lookup::Missing(reason) => Error::SymbolMissing {
                function,
                required,
                found: self.version,
                reason,
                library: Some(self.identity()),
            },
            Lookup::Failed(code, via) => self.describe(code, Some(via)).into(),
        }
    }
}

fn interpret(
    rc: CUresult,
    pfn: *mut c_void,
    status: Option<CUdriverProcAddressQueryResult>,
    via: &'static str,
) -> Lookup {
    if rc == CUresult::CUDA_SUCCESS {
        match status {
            Some(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) => {
                Lookup::Missing(MissingReason::VersionNotSufficient)
            }
            Some(s) if s != CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS => {
                Lookup::Missing(MissingReason::NotFound)
            }
            _ => match NonNull::new(pfn) {
                Some(p) => Lookup::Found(p),
                None => Lookup::Missing(MissingReason::NotFound),
            },
        }
    } else if rc == CUresult::CUDA_ERROR_NOT_FOUND {
        Lookup::Missing(MissingReason::NotFound)
    } else if rc == CUresult::CUDA_ERROR_INVALID_VALUE {
        Lookup::Missing(MissingReason::Rejected)
    } else {
        Lookup::Failed(rc, via)
    }
}

/// A [`DriverError`] for `code`: `cuGetErrorName`/`cuGetErrorString` where the driver answers, else
/// the pinned header's table.
pub(crate) fn describe_with(
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

#[cfg(test)]
mod tests {
    use crate::error::MissingReason::NoPerThreadVariant;
    use crate::streams::DefaultStream::{Legacy, PerThread};
    use crate::table::Function;
    use crate::types::{CUdriverProcAddressQueryResult, CUresult};

    #[test]
    fn only_a_twinless_variant_of_a_function_with_per_thread_variants_lacks_a_per_thread_one() {
        let variant = |f: Function, mode| super::variant(f.info(), mode);
        let old = Function::cuMemcpyAtoA_v2000;
        assert_eq!(variant(old, PerThread), (2000, None));
        assert_eq!(variant(old, Legacy), (2000, Some(c"cuMemcpyAtoA")));
        // Its newest variant has a twin; a function without per-thread variants has no such case.
        let newest = Function::cuMemcpyAtoA;
        assert_eq!(
            variant(newest, PerThread),
            (7000, Some(c"cuMemcpyAtoA_v2_ptds"))
        );
        let no_twins = Function::cuMemAlloc;
        assert_eq!(variant(no_twins, PerThread), (3020, Some(c"cuMemAlloc_v2")));
    }

    #[test]
    fn every_cached_error_has_its_own_sentinel_below_any_address() {
        for (i, &kind) in super::CACHED_ERRORS.iter().enumerate() {
            let value = super::sentinel(kind).addr();
            assert_eq!(value, i + 1);
            assert!(value <= super::SLOT_LAST_SENTINEL);
        }
    }

    /// Lookups made by [`counting_lookup`].
    static LOOKUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    /// The address [`counting_lookup`] answers (any value above the sentinels).
    const FOUND: usize = 0x10_0000;

    /// A `cuGetProcAddress_v2` that finds every symbol at [`FOUND`] and counts its calls.
    unsafe extern "C" fn counting_lookup(
        _: *const std::ffi::c_char,
        pfn: *mut *mut std::ffi::c_void,
        _: std::ffi::c_int,
        _: crate::types::cuuint64_t,
        status: *mut CUdriverProcAddressQueryResult,
    ) -> CUresult {
        LOOKUPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // SAFETY: the caller (`Loaded::lookup`) passes valid places for both.
        unsafe {
            pfn.write(std::ptr::without_provenance_mut(FOUND));
            status.write(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS);
        }
        CUresult::CUDA_SUCCESS
    }

    unsafe extern "C" fn no_op(_: std::ffi::c_uint) -> CUresult {
        CUresult::CUDA_SUCCESS
    }
    unsafe extern "C" fn no_version(_: *mut std::ffi::c_int) -> CUresult {
        CUresult::CUDA_SUCCESS
    }

    /// A 13.0 driver whose `cuGetProcAddress_v2` is [`counting_lookup`] (the library itself is
    /// this process: nothing is looked up in it).
    #[cfg(unix)]
    fn counting_driver() -> super::Loaded {
        let bootstrap = crate::library::Bootstrap {
            cu_init: no_op,
            cu_driver_get_version: no_version,
            cu_get_proc_address_v2: Some(counting_lookup),
            cu_get_proc_address: None,
            cu_get_error_name: None,
            cu_get_error_string: None,
        };
        super::Loaded {
            library: libloading::os::unix::Library::this().into(),
            handle: 0,
            opened_as: "this process".into(),
            path: "this process".into(),
            version: crate::DriverVersion(13000),
            resolution: super::ResolutionPath::ProcAddressV2,
            bootstrap,
            kind: crate::library::LibraryKind::OtherName,
            origin: crate::library::LibraryOrigin::Given,
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_slot_another_thread_resolved_is_taken_as_it_is_and_a_resolution_is_cached() {
        use std::sync::atomic::{AtomicPtr, Ordering};
        let driver = counting_driver();
        let before = LOOKUPS.load(Ordering::SeqCst);
        // Resolved by another thread after the caller saw it empty: no second lookup.
        let address = std::ptr::without_provenance_mut(0x20_0000);
        let slot = AtomicPtr::new(address);
        let resolved = driver.resolve_slot(&slot, Function::cuMemAlloc, Legacy);
        assert_eq!(resolved.ok(), Some(address));
        assert_eq!(LOOKUPS.load(Ordering::SeqCst), before);
        // An empty slot: one lookup, whose address the slot then holds.
        let slot = AtomicPtr::new(std::ptr::null_mut());
        let resolved = driver.resolve_slot(&slot, Function::cuMemAlloc, Legacy);
        assert_eq!(resolved.ok().map(|p| p.addr()), Some(FOUND));
        assert_eq!(slot.load(Ordering::SeqCst).addr(), FOUND);
        assert_eq!(LOOKUPS.load(Ordering::SeqCst), before + 1);
    }

    #[test]
    fn the_first_outcome_cached_wins_over_a_later_one() {
        use super::{CACHED_ERRORS, cache, outcome, sentinel};
        use crate::error::{CallErrorKind, MissingReason};
        use std::sync::atomic::{AtomicPtr, Ordering};
        let address = std::ptr::without_provenance_mut(0x40_0000);
        let not_found = sentinel(CallErrorKind::SymbolMissing(MissingReason::NotFound));
        // A function cached first: a later failure returns it, and leaves it.
        let slot = AtomicPtr::new(std::ptr::null_mut());
        assert_eq!(cache(&slot, address), address);
        assert_eq!(cache(&slot, not_found), address);
        assert_eq!(slot.load(Ordering::SeqCst), address);
        assert_eq!(outcome(slot.load(Ordering::SeqCst)), Ok(address));
        // An error cached first stays too (the same for every thread).
        let slot = AtomicPtr::new(std::ptr::null_mut());
        assert_eq!(cache(&slot, not_found), not_found);
        assert_eq!(cache(&slot, address), not_found);
        // Every sentinel reads back as its error; the empty slot as nothing found.
        for &kind in &CACHED_ERRORS {
            assert_eq!(outcome(sentinel(kind)), Err(kind));
        }
        assert_eq!(
            outcome(std::ptr::null_mut()),
            Err(CallErrorKind::SymbolMissing(MissingReason::NotFound))
        );
        // Every value up to the last sentinel is an error, never an address.
        for value in 0..=super::SLOT_LAST_SENTINEL {
            assert!(
                outcome(std::ptr::without_provenance_mut(value)).is_err(),
                "{value}"
            );
        }
        let first_address = std::ptr::without_provenance_mut(super::SLOT_LAST_SENTINEL + 1);
        assert_eq!(outcome(first_address), Ok(first_address));
    }

    #[test]
    fn a_lookup_whose_status_is_not_success_finds_nothing_whatever_pointer_it_left() {
        use super::{Lookup, interpret};
        use crate::error::MissingReason::{NotFound, VersionNotSufficient};
        use CUdriverProcAddressQueryResult as Status;
        let stray = std::ptr::without_provenance_mut(0x30_0000);
        let found = |status| interpret(CUresult::CUDA_SUCCESS, stray, Some(status), "lookup");
        assert!(matches!(
            found(Status::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND),
            Lookup::Missing(NotFound)
        ));
        assert!(matches!(
            found(Status::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT),
            Lookup::Missing(VersionNotSufficient)
        ));
        assert!(matches!(
            found(Status::CU_GET_PROC_ADDRESS_SUCCESS),
            Lookup::Found(p) if p.as_ptr() == stray
        ));
    }

    /// A `cuGetErrorName` that writes a text and fails.
    unsafe extern "C" fn failing_with_text(
        _: CUresult,
        text: *mut *const std::ffi::c_char,
    ) -> CUresult {
        // SAFETY: the caller passes a valid place for the pointer.
        unsafe { text.write(c"left by a failing call".as_ptr()) };
        CUresult::CUDA_ERROR_INVALID_VALUE
    }

    /// A `cuGetErrorName` that succeeds and writes no text.
    unsafe extern "C" fn succeeding_without_text(
        _: CUresult,
        _: *mut *const std::ffi::c_char,
    ) -> CUresult {
        CUresult::CUDA_SUCCESS
    }

    #[test]
    fn the_drivers_error_text_is_taken_only_from_a_call_that_succeeded_and_wrote_one() {
        let code = CUresult::CUDA_ERROR_UNKNOWN;
        assert_eq!(super::driver_text(Some(failing_with_text), code), None);
        assert_eq!(
            super::driver_text(Some(succeeding_without_text), code),
            None
        );
        assert_eq!(super::driver_text(None, code), None);
    }

    #[test]
    fn the_advice_for_a_missing_per_thread_variant_is_not_to_upgrade() {
        let e = crate::Error::SymbolMissing {
            function: "cuMemcpyAtoA_v2000",
            required: 2000,
            found: crate::DriverVersion(13000),
            reason: NoPerThreadVariant,
            library: None,
        };
        let text = e.to_string();
        assert!(
            text.contains("Driver::legacy()") && !text.contains("Upgrade"),
            "{text}"
        );
    }
}
