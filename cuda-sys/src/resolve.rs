//! Resolving one table entry: the version gate, the lookup through `cuGetProcAddress_v2`,
//! `cuGetProcAddress` or the versioned export, and the per-entry cache.

use std::ffi::{CStr, CString, c_void};
use std::ptr::{self, NonNull};
use std::sync::atomic::Ordering;

use crate::driver::{DefaultStream, Driver};
use crate::error::{Error, MissingReason};
use crate::library::{self, Bootstrap};
use crate::table::{Function, FunctionInfo};
use crate::types::{CUdriverProcAddressQueryResult, CUresult, cuuint64_t};
use crate::version::DriverVersion;

/// `CU_GET_PROC_ADDRESS_LEGACY_STREAM`.
const LEGACY_STREAM: cuuint64_t = 1;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD_DEFAULT_STREAM: cuuint64_t = 2;

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

/// A slot's value once its entry resolved to an error; any larger value is the function's address.
/// No function lives in the first page of the address space, so these never collide with one.
const SLOT_TOO_OLD: usize = 1;
const SLOT_MISSING_NOT_FOUND: usize = 2;
const SLOT_MISSING_VERSION: usize = 3;
const SLOT_MISSING_REJECTED: usize = 4;
const SLOT_MISSING_NOT_EXPORTED: usize = 5;
/// Slot values up to this one are sentinels (`0` = not yet resolved).
pub(crate) const SLOT_LAST_SENTINEL: usize = 15;

/// What one lookup found.
enum Lookup {
    Found(NonNull<c_void>),
    Missing(MissingReason),
    /// The lookup itself failed in a way that may pass (`CUDA_ERROR_NOT_INITIALIZED`, say): reported,
    /// not cached.
    Failed(Error),
}

impl Driver {
    /// The address of `function`, resolved now if this is its first use.
    ///
    /// The fast path is one atomic load and a branch.
    #[inline(always)]
    pub(crate) fn entry(&self, function: Function) -> Result<*mut c_void, Error> {
        let p = self.slots[function as usize].load(Ordering::Acquire);
        if p.addr() > SLOT_LAST_SENTINEL {
            Ok(p)
        } else {
            self.resolve_slow(function)
        }
    }

    /// Resolves `function` (or returns why it cannot be), caching the outcome.
    ///
    /// # Errors
    /// [`Error::DriverTooOld`] if its ABI version is newer than the driver; [`Error::SymbolMissing`]
    /// if the driver does not provide it; [`Error::Driver`] if the lookup itself failed.
    pub fn resolve(&self, function: Function) -> Result<NonNull<c_void>, Error> {
        let p = self.entry(function)?;
        NonNull::new(p).ok_or_else(|| self.missing(function.info(), MissingReason::NotFound))
    }

    #[cold]
    #[inline(never)]
    fn resolve_slow(&self, function: Function) -> Result<*mut c_void, Error> {
        let info = function.info();
        let slot = &self.slots[function as usize];
        let cached = slot.load(Ordering::Acquire).addr();
        if let Some(error) = self.cached_error(info, cached) {
            return Err(error);
        }
        let (version, export) = self.variant(info);
        if version > self.version.0 as u32 {
            slot.store(ptr::without_provenance_mut(SLOT_TOO_OLD), Ordering::Release);
            return Err(self.too_old(info));
        }
        match self.lookup(info.symbol, version, export, self.default_stream) {
            Lookup::Found(p) => {
                // Racing threads store the same address; the first store wins nothing over the rest.
                slot.store(p.as_ptr(), Ordering::Release);
                Ok(p.as_ptr())
            }
            Lookup::Missing(reason) => {
                let sentinel = match reason {
                    MissingReason::NotFound => SLOT_MISSING_NOT_FOUND,
                    MissingReason::VersionNotSufficient => SLOT_MISSING_VERSION,
                    MissingReason::Rejected => SLOT_MISSING_REJECTED,
                    MissingReason::NotExported => SLOT_MISSING_NOT_EXPORTED,
                };
                slot.store(ptr::without_provenance_mut(sentinel), Ordering::Release);
                Err(self.missing(info, reason))
            }
            Lookup::Failed(error) => Err(error),
        }
    }

    /// The ABI version to ask for and the export to look up, for this driver's default-stream mode.
    fn variant(&self, info: &FunctionInfo) -> (u32, &'static CStr) {
        match (
            self.default_stream,
            info.per_thread_export,
            info.per_thread_version,
        ) {
            (DefaultStream::PerThread, Some(export), Some(version)) => (version, export),
            _ => (info.version, info.export),
        }
    }

    fn cached_error(&self, info: &FunctionInfo, slot: usize) -> Option<Error> {
        let reason = match slot {
            SLOT_TOO_OLD => return Some(self.too_old(info)),
            SLOT_MISSING_NOT_FOUND => MissingReason::NotFound,
            SLOT_MISSING_VERSION => MissingReason::VersionNotSufficient,
            SLOT_MISSING_REJECTED => MissingReason::Rejected,
            SLOT_MISSING_NOT_EXPORTED => MissingReason::NotExported,
            _ => return None,
        };
        Some(self.missing(info, reason))
    }

    fn too_old(&self, info: &FunctionInfo) -> Error {
        Error::DriverTooOld {
            function: info.name,
            required: info.version,
            found: self.version,
        }
    }

    fn missing(&self, info: &FunctionInfo, reason: MissingReason) -> Error {
        Error::SymbolMissing {
            function: info.name,
            required: self.variant(info).0,
            found: self.version,
            reason,
        }
    }

    /// Looks a driver symbol up directly, uncached and ungated, the way the table does: through
    /// `cuGetProcAddress_v2` or `cuGetProcAddress` with `version` and the flag for `mode`; on drivers
    /// older than 11.3, as the export named `symbol` (which must then be the export's full name, such
    /// as `cuMemAlloc_v2` or `cuStreamSynchronize_ptsz`).
    ///
    /// For binding authors who need a symbol at another version than the table's, or one the table
    /// does not have.
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
        match self.lookup(&name, version, &name, mode) {
            Lookup::Found(p) => Ok(p),
            Lookup::Missing(reason) => Err(Error::SymbolMissing {
                function: "(lookup)",
                required: version,
                found: self.version,
                reason,
            }),
            Lookup::Failed(e) => Err(e),
        }
    }

    fn lookup(&self, symbol: &CStr, version: u32, export: &CStr, mode: DefaultStream) -> Lookup {
        let flags = match mode {
            DefaultStream::Legacy => LEGACY_STREAM,
            DefaultStream::PerThread => PER_THREAD_DEFAULT_STREAM,
        };
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
                self.interpret(rc, pfn, Some(status), "cuGetProcAddress_v2")
            }
            ResolutionPath::ProcAddress => {
                let Some(get) = self.bootstrap.cu_get_proc_address else {
                    return Lookup::Missing(MissingReason::NotFound);
                };
                let mut pfn: *mut c_void = ptr::null_mut();
                // SAFETY: `symbol` is NUL-terminated; `pfn` is a valid place to write.
                let rc = unsafe { get(symbol.as_ptr(), &mut pfn, version, flags) };
                self.interpret(rc, pfn, None, "cuGetProcAddress")
            }
            ResolutionPath::Exports => match library::address(self.library(), export) {
                Some(p) => Lookup::Found(p),
                None => Lookup::Missing(MissingReason::NotExported),
            },
        }
    }

    fn interpret(
        &self,
        rc: CUresult,
        pfn: *mut c_void,
        status: Option<CUdriverProcAddressQueryResult>,
        via: &'static str,
    ) -> Lookup {
        if rc == CUresult::CUDA_SUCCESS {
            match status {
                Some(
                    CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
                ) => Lookup::Missing(MissingReason::VersionNotSufficient),
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
            Lookup::Failed(self.describe(rc, Some(via)).into())
        }
    }
}
