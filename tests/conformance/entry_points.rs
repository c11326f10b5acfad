//! `cuGetProcAddress` (v2 and v1): answers, statuses, variants, and the driver's exports.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use cuda_dl_sys::types::{CUdriverProcAddressQueryResult, CUresult, cuuint64_t};
use cuda_dl_sys::{DefaultStream, Error, Function, MissingReason};

use super::harness::{Cx, cases};

type GetProcAddressV2 = unsafe extern "C" fn(
    *const c_char,
    *mut *mut c_void,
    c_int,
    cuuint64_t,
    *mut CUdriverProcAddressQueryResult,
) -> CUresult;
type GetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, cuuint64_t) -> CUresult;

/// `CU_GET_PROC_ADDRESS_DEFAULT`, `_LEGACY_STREAM`, `_PER_THREAD_DEFAULT_STREAM`.
const DEFAULT: cuuint64_t = 0;
const LEGACY: cuuint64_t = 1;
const PER_THREAD: cuuint64_t = 2;

fn v2(cx: &Cx) -> GetProcAddressV2 {
    let address = cx
        .export_address("cuGetProcAddress_v2")
        .expect("cuGetProcAddress_v2");
    // SAFETY: the export has this signature (PFN_cuGetProcAddress_v12000).
    unsafe { std::mem::transmute::<usize, GetProcAddressV2>(address) }
}

fn v1(cx: &Cx) -> GetProcAddress {
    let address = cx
        .export_address("cuGetProcAddress")
        .expect("cuGetProcAddress");
    // SAFETY: the export has this signature (PFN_cuGetProcAddress_v11030).
    unsafe { std::mem::transmute::<usize, GetProcAddress>(address) }
}

/// What `cuGetProcAddress_v2` answers for `symbol` at `version` with `flags`.
fn lookup(
    cx: &Cx,
    symbol: &std::ffi::CStr,
    version: i32,
    flags: cuuint64_t,
) -> (CUresult, usize, CUdriverProcAddressQueryResult) {
    let mut pfn = ptr::dangling_mut::<c_void>();
    let mut status = CUdriverProcAddressQueryResult(77);
    // SAFETY: a NUL-terminated name and valid out-pointers.
    let result = unsafe { v2(cx)(symbol.as_ptr(), &mut pfn, version, flags, &mut status) };
    (result, pfn.addr(), status)
}

cases! {
    /// `cuGetProcAddress_v2`: a version above the driver's is rejected
    /// (`CUDA_ERROR_INVALID_VALUE`) with nothing written; a symbol only in newer variants is
    /// "version not sufficient"; an unknown one is success with a null pointer and "not found";
    /// a known one is success and "found".
    fn cu_get_proc_address_v2_answers_with_the_real_statuses(cx) {
        let version = cx.driver.version().0;
        let untouched = (ptr::dangling_mut::<c_void>().addr(), CUdriverProcAddressQueryResult(77));
        let (result, pfn, status) = lookup(cx, c"cuMemAlloc", version + 10, LEGACY);
        assert_eq!((result, (pfn, status)), (CUresult::CUDA_ERROR_INVALID_VALUE, untouched));
        let (result, pfn, status) = lookup(cx, c"cuStreamGetCaptureInfo", 10000, LEGACY);
        assert_eq!((result, pfn, status), (CUresult::CUDA_SUCCESS, 0, CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT));
        let (result, pfn, status) = lookup(cx, c"cuNoSuchFunction", version, LEGACY);
        assert_eq!((result, pfn, status), (CUresult::CUDA_SUCCESS, 0, CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND));
        let (result, pfn, status) = lookup(cx, c"cuLaunchHostFunc", version, LEGACY);
        assert_eq!((result, status), (CUresult::CUDA_SUCCESS, CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS));
        assert_ne!(pfn, 0);
    }

    /// The `DEFAULT` flag gives the same pointer as `LEGACY_STREAM`; `PER_THREAD_DEFAULT_STREAM`
    /// another one (the `_ptsz` variant) for a stream function, the same for one that takes no
    /// stream.
    fn the_default_flag_is_legacy_and_per_thread_is_another_variant(cx) {
        let version = cx.driver.version().0;
        let address = |symbol, flags| {
            let (result, pfn, _) = lookup(cx, symbol, version, flags);
            assert_eq!(result, CUresult::CUDA_SUCCESS);
            pfn
        };
        assert_eq!(address(c"cuLaunchHostFunc", DEFAULT), address(c"cuLaunchHostFunc", LEGACY));
        assert_ne!(address(c"cuLaunchHostFunc", PER_THREAD), address(c"cuLaunchHostFunc", LEGACY));
        assert_ne!(address(c"cuStreamSynchronize", PER_THREAD), address(c"cuStreamSynchronize", LEGACY));
        assert_eq!(address(c"cuMemAlloc", PER_THREAD), address(c"cuMemAlloc", LEGACY));
    }

    /// `cuGetProcAddress` (v1) reports `CUDA_ERROR_NOT_FOUND` for an unknown symbol and for one too
    /// new for the version asked; otherwise success.
    fn cu_get_proc_address_v1_says_not_found(cx) {
        let mut pfn = ptr::null_mut();
        let version = cx.driver.version().0;
        // SAFETY: NUL-terminated names and a valid out-pointer.
        unsafe {
            assert_eq!(v1(cx)(c"cuNoSuchFunction".as_ptr(), &mut pfn, version, LEGACY), CUresult::CUDA_ERROR_NOT_FOUND);
            assert_eq!(v1(cx)(c"cuStreamGetCaptureInfo".as_ptr(), &mut pfn, 10000, LEGACY), CUresult::CUDA_ERROR_NOT_FOUND);
            assert_eq!(v1(cx)(c"cuMemAlloc".as_ptr(), &mut pfn, 11080, LEGACY), CUresult::CUDA_SUCCESS);
        }
        assert!(!pfn.is_null());
    }

    /// `cuda-dl-sys`'s reading of the answers: too new a version is `Rejected`, a symbol only in newer
    /// variants `VersionNotSufficient`, an unknown one `NotFound`. A symbol with per-thread
    /// variants finds only those with the per-thread flag: its older variant without a twin
    /// (`cuMemcpyHtoD` at 2000) is `VersionNotSufficient` there, though found without the flag.
    fn cuda_sys_reads_the_answers_as_typed_reasons(cx) {
        let version = cx.driver.version().0 as u32;
        let missing_in = |symbol: &str, version: u32, mode| match cx.driver.get_proc_address(symbol, version, mode) {
            Err(Error::SymbolMissing { reason, .. }) => reason,
            Ok(_) => panic!("{symbol} at {version} ({mode:?}): found"),
            Err(e) => panic!("{symbol} at {version} ({mode:?}): {e}"),
        };
        let missing = |symbol: &str, version: u32| missing_in(symbol, version, DefaultStream::Legacy);
        assert_eq!(missing("cuLaunchHostFunc", version + 10), MissingReason::Rejected);
        assert_eq!(missing("cuStreamGetCaptureInfo", 10000), MissingReason::VersionNotSufficient);
        assert_eq!(missing("cuNoSuchFunction", 2000), MissingReason::NotFound);
        assert_eq!(missing_in("cuMemcpyHtoD", 2000, DefaultStream::PerThread), MissingReason::VersionNotSufficient);
        cx.driver.get_proc_address("cuMemcpyHtoD", 2000, DefaultStream::Legacy).expect("cuMemcpyHtoD at 2000, legacy");
        cx.driver.get_proc_address("cuMemcpyHtoD", 7000, DefaultStream::PerThread).expect("cuMemcpyHtoD at 7000, per-thread");
    }

    /// Each variant `cuGetProcAddress` returns is the library's export of that variant: the
    /// legacy and per-thread variants of `cuStreamGetCaptureInfo` at three versions, and every
    /// entry of `cuda-dl-sys`'s table that resolves (with its per-thread twin).
    fn cu_get_proc_address_returns_the_exported_variants(cx) {
        let found = |symbol: &str, version: u32, mode| {
            cx.driver.get_proc_address(symbol, version, mode).unwrap().addr().get()
        };
        let export = |name: &str| cx.export_address(name).unwrap_or_else(|| panic!("no export {name}"));
        use DefaultStream::{Legacy, PerThread};
        assert_eq!(found("cuStreamGetCaptureInfo", 10010, Legacy), export("cuStreamGetCaptureInfo"));
        assert_eq!(found("cuStreamGetCaptureInfo", 11080, Legacy), export("cuStreamGetCaptureInfo_v2"));
        assert_eq!(found("cuStreamGetCaptureInfo", 12030, Legacy), export("cuStreamGetCaptureInfo_v3"));
        assert_eq!(found("cuStreamGetCaptureInfo", 12030, PerThread), export("cuStreamGetCaptureInfo_v3_ptsz"));
        assert_eq!(found("cuLaunchHostFunc", 10000, PerThread), export("cuLaunchHostFunc_ptsz"));
        assert_eq!(found("cuCtxCreate", 12000, Legacy), export("cuCtxCreate_v3"));
        assert_eq!(found("cuGraphAddNode", 12030, Legacy), export("cuGraphAddNode_v2"));
        let version = cx.driver.version().0 as u32;
        let mut resolved = 0;
        for &function in Function::ALL {
            let info = function.info();
            if info.version > version {
                continue;
            }
            let symbol = info.symbol.to_str().unwrap();
            let Ok(legacy) = cx.driver.get_proc_address(symbol, info.version, Legacy) else {
                continue;
            };
            resolved += 1;
            assert_eq!(Some(legacy.addr().get()), cx.export_address(info.export.to_str().unwrap()), "{function}");
            let per_thread_version = info.per_thread_version.unwrap_or(info.version);
            // A variant without a per-thread twin, of a symbol that has per-thread variants, is
            // not found with the per-thread flag (`cuMemcpyAtoA` at 2000 on the 13.0 driver).
            let has_twins = Function::ALL
                .iter()
                .any(|f| f.info().symbol == info.symbol && f.info().per_thread_export.is_some());
            match info.per_thread_export {
                Some(name) => {
                    let per_thread = found(symbol, per_thread_version, PerThread);
                    assert_eq!(Some(per_thread), cx.export_address(name.to_str().unwrap()), "{function}")
                }
                None if has_twins => match cx.driver.get_proc_address(symbol, info.version, PerThread) {
                    Err(Error::SymbolMissing { reason: MissingReason::VersionNotSufficient, .. }) => {}
                    other => panic!("{function}, per-thread at {}: {other:?}", info.version),
                },
                None => assert_eq!(found(symbol, per_thread_version, PerThread), legacy.addr().get(), "{function}"),
            }
        }
        assert!(resolved >= 80, "only {resolved} entries resolved");
    }

    /// The fake implements only part of the driver API (the functions the workspace uses and
    /// their kin): entries of `cuda-dl-sys`'s table within the driver's version that it does not
    /// implement are "not found", and not exported either.
    fn only_the_implemented_part_of_the_table_resolves(cx) {
        let version = cx.driver.version().0 as u32;
        let mut not_found = Vec::new();
        for &function in Function::ALL {
            let info = function.info();
            if info.version > version {
                continue;
            }
            let symbol = info.symbol.to_str().unwrap();
            // Not implemented (an older ABI variant the fake lacks is VersionNotSufficient).
            if let Err(Error::SymbolMissing {
                reason: MissingReason::NotFound | MissingReason::VersionNotSufficient,
                ..
            }) = cx.driver.get_proc_address(symbol, info.version, DefaultStream::Legacy)
            {
                assert_eq!(cx.export_address(info.export.to_str().unwrap()), None, "{function}: exported, not found");
                not_found.push(function);
            }
        }
        assert!(!not_found.is_empty(), "every entry of the table resolves");
    }
}
