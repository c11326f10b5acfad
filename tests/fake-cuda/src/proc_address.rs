//! `cuGetProcAddress_v2` (12.0+) and `cuGetProcAddress` (11.3+) over a table of every function the
//! fake implements: its base symbol, and each ABI variant's version, function and per-thread
//! default-stream twin (versions and export names as in `cuda-sys/src/generated/functions.rs`).

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use cuda_dl_sys::types::{CUdriverProcAddressQueryResult, CUresult, cuuint64_t};

use crate::calls::call;
use crate::config::config;
use crate::errors::{INVALID_VALUE, NOT_FOUND, SUCCESS};
use crate::state::relock;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD_DEFAULT_STREAM: cuuint64_t = 2;

pub(crate) static LAST_FLAGS: AtomicU64 = AtomicU64::new(0);
pub(crate) static LAST_VERSION: AtomicI32 = AtomicI32::new(0);

/// One ABI variant of a symbol.
struct Variant {
    version: i32,
    legacy: usize,
    per_thread: Option<usize>,
}

macro_rules! variants {
    ($($base:literal => [$(($version:literal, $f:path $(, $pt:path)?)),* $(,)?]),* $(,)?) => {
        fn build() -> BTreeMap<&'static str, Vec<Variant>> {
            let mut table = BTreeMap::new();
            $(
                table.insert($base, vec![$(Variant {
                    version: $version,
                    legacy: ($f as *const ()).expose_provenance(),
                    per_thread: None $(.or(Some(($pt as *const ()).expose_provenance())))?,
                }),*]);
            )*
            table
        }
    };
}

variants! {
    "cuGetErrorString" => [(6000, crate::errors::cuGetErrorString)],
    "cuGetErrorName" => [(6000, crate::errors::cuGetErrorName)],
    "cuInit" => [(2000, crate::device::cuInit)],
    "cuDriverGetVersion" => [(2020, crate::device::cuDriverGetVersion)],
    "cuGetProcAddress" => [(11030, cuGetProcAddress), (12000, cuGetProcAddress_v2)],
    "cuDeviceGet" => [(2000, crate::device::cuDeviceGet)],
    "cuThreadExchangeStreamCaptureMode" => [(10010, crate::capture_mode::cuThreadExchangeStreamCaptureMode)],
    "cuDeviceGetCount" => [(2000, crate::device::cuDeviceGetCount)],
    "cuDeviceGetName" => [(2000, crate::device::cuDeviceGetName)],
    "cuDeviceTotalMem" => [(3020, crate::device::cuDeviceTotalMem_v2)],
    "cuDeviceGetAttribute" => [(2000, crate::device::cuDeviceGetAttribute)],
    "cuDevicePrimaryCtxRetain" => [(7000, crate::context::cuDevicePrimaryCtxRetain)],
    "cuDevicePrimaryCtxRelease" => [
        (7000, crate::context::cuDevicePrimaryCtxRelease),
        (11000, crate::context::cuDevicePrimaryCtxRelease_v2),
    ],
    "cuDevicePrimaryCtxSetFlags" => [(11000, crate::context::cuDevicePrimaryCtxSetFlags_v2)],
    "cuDevicePrimaryCtxGetState" => [(7000, crate::context::cuDevicePrimaryCtxGetState)],
    "cuDevicePrimaryCtxReset" => [
        (7000, crate::context::cuDevicePrimaryCtxReset),
        (11000, crate::context::cuDevicePrimaryCtxReset_v2),
    ],
    "cuCtxCreate" => [
        (3020, crate::context::cuCtxCreate_v2),
        (11040, crate::context::cuCtxCreate_v3),
        (12050, crate::context::cuCtxCreate_v4),
    ],
    "cuCtxDestroy" => [(4000, crate::context::cuCtxDestroy_v2)],
    "cuCtxPushCurrent" => [(4000, crate::context::cuCtxPushCurrent_v2)],
    "cuCtxPopCurrent" => [(4000, crate::context::cuCtxPopCurrent_v2)],
    "cuCtxSetCurrent" => [(4000, crate::context::cuCtxSetCurrent)],
    "cuCtxGetCurrent" => [(4000, crate::context::cuCtxGetCurrent)],
    "cuCtxGetId" => [(12000, crate::context::cuCtxGetId)],
    "cuCtxGetDevice" => [
        (2000, crate::context::cuCtxGetDevice),
        (13000, crate::context::cuCtxGetDevice_v2),
    ],
    "cuCtxSynchronize" => [
        (2000, crate::context::cuCtxSynchronize),
        (13000, crate::context::cuCtxSynchronize_v2),
    ],
    "cuModuleLoad" => [(2000, crate::module::cuModuleLoad)],
    "cuModuleLoadData" => [(2000, crate::module::cuModuleLoadData)],
    "cuModuleLoadDataEx" => [(2010, crate::module::cuModuleLoadDataEx)],
    "cuModuleLoadFatBinary" => [(2000, crate::module::cuModuleLoadFatBinary)],
    "cuLibraryLoadData" => [(12000, crate::module::cuLibraryLoadData)],
    "cuLibraryLoadFromFile" => [(12000, crate::module::cuLibraryLoadFromFile)],
    "cuMemGetInfo" => [(3020, crate::memory::cuMemGetInfo_v2)],
    "cuMemAlloc" => [(3020, crate::memory::cuMemAlloc_v2)],
    "cuMemFree" => [(3020, crate::memory::cuMemFree_v2)],
    "cuMemAllocHost" => [(3020, crate::memory::cuMemAllocHost_v2)],
    "cuMemFreeHost" => [(2000, crate::memory::cuMemFreeHost)],
    "cuMemHostAlloc" => [(2020, crate::memory::cuMemHostAlloc)],
    "cuMemHostGetDevicePointer" => [(3020, crate::memory::cuMemHostGetDevicePointer_v2)],
    "cuMemHostRegister" => [(6050, crate::memory::cuMemHostRegister_v2)],
    "cuMemHostUnregister" => [(4000, crate::memory::cuMemHostUnregister)],
    "cuMemAllocAsync" => [(11020, crate::stream_alloc::cuMemAllocAsync, crate::stream_alloc::cuMemAllocAsync_ptsz)],
    "cuMemFreeAsync" => [(11020, crate::stream_alloc::cuMemFreeAsync, crate::stream_alloc::cuMemFreeAsync_ptsz)],
    "cuMemcpy" => [(4000, crate::copies::cuMemcpy, crate::copies::cuMemcpy_ptds)],
    "cuMemcpyAsync" => [(4000, crate::copies::cuMemcpyAsync, crate::copies::cuMemcpyAsync_ptsz)],
    "cuMemcpyPeer" => [(4000, crate::copies::cuMemcpyPeer, crate::copies::cuMemcpyPeer_ptds)],
    "cuMemcpyPeerAsync" => [(4000, crate::copies::cuMemcpyPeerAsync, crate::copies::cuMemcpyPeerAsync_ptsz)],
    "cuMemcpyHtoD" => [
        (2000, crate::copies::cuMemcpyHtoD),
        (3020, crate::copies::cuMemcpyHtoD_v2, crate::copies::cuMemcpyHtoD_v2_ptds),
    ],
    "cuMemcpyAtoA" => [
        (2000, crate::copies::cuMemcpyAtoA),
        (3020, crate::copies::cuMemcpyAtoA_v2, crate::copies::cuMemcpyAtoA_v2_ptds),
    ],
    "cuMemcpyDtoH" => [(3020, crate::copies::cuMemcpyDtoH_v2, crate::copies::cuMemcpyDtoH_v2_ptds)],
    "cuMemcpyDtoD" => [(3020, crate::copies::cuMemcpyDtoD_v2, crate::copies::cuMemcpyDtoD_v2_ptds)],
    "cuMemcpyHtoDAsync" => [(3020, crate::copies::cuMemcpyHtoDAsync_v2, crate::copies::cuMemcpyHtoDAsync_v2_ptsz)],
    "cuMemcpyDtoHAsync" => [(3020, crate::copies::cuMemcpyDtoHAsync_v2, crate::copies::cuMemcpyDtoHAsync_v2_ptsz)],
    "cuMemcpyDtoDAsync" => [(3020, crate::copies::cuMemcpyDtoDAsync_v2, crate::copies::cuMemcpyDtoDAsync_v2_ptsz)],
    "cuMemsetD8" => [(3020, crate::memset::cuMemsetD8_v2, crate::memset::cuMemsetD8_v2_ptds)],
    "cuMemsetD16" => [(3020, crate::memset::cuMemsetD16_v2, crate::memset::cuMemsetD16_v2_ptds)],
    "cuMemsetD32" => [(3020, crate::memset::cuMemsetD32_v2, crate::memset::cuMemsetD32_v2_ptds)],
    "cuMemsetD8Async" => [(3020, crate::memset::cuMemsetD8Async, crate::memset::cuMemsetD8Async_ptsz)],
    "cuMemsetD16Async" => [(3020, crate::memset::cuMemsetD16Async, crate::memset::cuMemsetD16Async_ptsz)],
    "cuMemsetD32Async" => [(3020, crate::memset::cuMemsetD32Async, crate::memset::cuMemsetD32Async_ptsz)],
    "cuStreamCreate" => [(2000, crate::stream::cuStreamCreate)],
    "cuStreamCreateWithPriority" => [(5050, crate::stream::cuStreamCreateWithPriority)],
    "cuStreamGetPriority" => [(5050, crate::stream::cuStreamGetPriority, crate::stream::cuStreamGetPriority_ptsz)],
    "cuStreamGetDevice" => [(12080, crate::stream::cuStreamGetDevice, crate::stream::cuStreamGetDevice_ptsz)],
    "cuStreamGetFlags" => [(5050, crate::stream::cuStreamGetFlags, crate::stream::cuStreamGetFlags_ptsz)],
    "cuStreamGetId" => [(12000, crate::stream::cuStreamGetId, crate::stream::cuStreamGetId_ptsz)],
    "cuStreamGetCtx" => [
        (9020, crate::stream::cuStreamGetCtx, crate::stream::cuStreamGetCtx_ptsz),
        (12050, crate::stream::cuStreamGetCtx_v2, crate::stream::cuStreamGetCtx_v2_ptsz),
    ],
    "cuStreamWaitEvent" => [(3020, crate::event::cuStreamWaitEvent, crate::event::cuStreamWaitEvent_ptsz)],
    "cuStreamAddCallback" => [(5000, crate::stream::cuStreamAddCallback, crate::stream::cuStreamAddCallback_ptsz)],
    "cuStreamBeginCapture" => [
        (10000, crate::capture::cuStreamBeginCapture, crate::capture::cuStreamBeginCapture_ptsz),
        (10010, crate::capture::cuStreamBeginCapture_v2, crate::capture::cuStreamBeginCapture_v2_ptsz),
    ],
    "cuStreamEndCapture" => [(10000, crate::capture::cuStreamEndCapture, crate::capture::cuStreamEndCapture_ptsz)],
    "cuStreamIsCapturing" => [(10000, crate::capture::cuStreamIsCapturing, crate::capture::cuStreamIsCapturing_ptsz)],
    "cuStreamGetCaptureInfo" => [
        (10010, crate::capture::cuStreamGetCaptureInfo, crate::capture::cuStreamGetCaptureInfo_ptsz),
        (11030, crate::capture::cuStreamGetCaptureInfo_v2, crate::capture::cuStreamGetCaptureInfo_v2_ptsz),
        (12030, crate::capture::cuStreamGetCaptureInfo_v3, crate::capture::cuStreamGetCaptureInfo_v3_ptsz),
    ],
    "cuStreamQuery" => [(2000, crate::stream::cuStreamQuery, crate::stream::cuStreamQuery_ptsz)],
    "cuStreamSynchronize" => [(2000, crate::stream::cuStreamSynchronize, crate::stream::cuStreamSynchronize_ptsz)],
    "cuStreamDestroy" => [
        (2000, crate::stream::cuStreamDestroy),
        (4000, crate::stream::cuStreamDestroy_v2),
    ],
    "cuEventCreate" => [(2000, crate::event::cuEventCreate)],
    "cuEventRecord" => [(2000, crate::event::cuEventRecord, crate::event::cuEventRecord_ptsz)],
    "cuEventRecordWithFlags" => [(11010, crate::event::cuEventRecordWithFlags, crate::event::cuEventRecordWithFlags_ptsz)],
    "cuEventQuery" => [(2000, crate::event::cuEventQuery)],
    "cuEventElapsedTime" => [
        (2000, crate::event::cuEventElapsedTime),
        (12080, crate::event::cuEventElapsedTime_v2),
    ],
    "cuEventSynchronize" => [(2000, crate::event::cuEventSynchronize)],
    "cuEventDestroy" => [
        (2000, crate::event::cuEventDestroy),
        (4000, crate::event::cuEventDestroy_v2),
    ],
    "cuStreamWriteValue32" => [(11070, crate::stream::cuStreamWriteValue32_v2, crate::stream::cuStreamWriteValue32_v2_ptsz)],
    "cuStreamWaitValue32" => [(11070, crate::stream::cuStreamWaitValue32_v2, crate::stream::cuStreamWaitValue32_v2_ptsz)],
    "cuStreamWaitValue64" => [(11070, crate::stream::cuStreamWaitValue64_v2, crate::stream::cuStreamWaitValue64_v2_ptsz)],
    "cuStreamWriteValue64" => [(11070, crate::stream::cuStreamWriteValue64_v2, crate::stream::cuStreamWriteValue64_v2_ptsz)],
    "cuLaunchHostFunc" => [
        (10000, crate::stream::cuLaunchHostFunc, crate::stream::cuLaunchHostFunc_ptsz),
        // Registered at 13.2, though cudaTypedefs.h names it PFN_cuLaunchHostFunc_v13010 (a
        // placeholder): the version NVIDIA's cuda-bindings 13.5 asks for.
        (13020, crate::stream::cuLaunchHostFunc_v2, crate::stream::cuLaunchHostFunc_v2_ptsz),
    ],
    "cuGraphCreate" => [(10000, crate::graph::cuGraphCreate)],
    "cuGraphAddKernelNode" => [
        (10000, crate::graph::cuGraphAddKernelNode),
        (12000, crate::graph::cuGraphAddKernelNode_v2),
    ],
    "cuGraphAddHostNode" => [(10000, crate::graph::cuGraphAddHostNode)],
    "cuGraphHostNodeGetParams" => [(10000, crate::graph::cuGraphHostNodeGetParams)],
    "cuGraphAddEmptyNode" => [(10000, crate::graph::cuGraphAddEmptyNode)],
    "cuGraphClone" => [(10000, crate::graph::cuGraphClone)],
    "cuGraphNodeGetType" => [(10000, crate::graph::cuGraphNodeGetType)],
    "cuGraphGetNodes" => [(10000, crate::graph::cuGraphGetNodes)],
    "cuGraphAddDependencies" => [
        (10000, crate::graph::cuGraphAddDependencies),
        (12030, crate::graph::cuGraphAddDependencies_v2),
    ],
    "cuGraphDestroyNode" => [(10000, crate::graph::cuGraphDestroyNode)],
    "cuGraphInstantiateWithFlags" => [(11040, crate::graph::cuGraphInstantiateWithFlags)],
    "cuGraphLaunch" => [(10000, crate::graph::cuGraphLaunch, crate::graph::cuGraphLaunch_ptsz)],
    "cuGraphExecDestroy" => [(10000, crate::graph::cuGraphExecDestroy)],
    "cuGraphDestroy" => [(10000, crate::graph::cuGraphDestroy)],
    "cuUserObjectCreate" => [(11030, crate::user_object::cuUserObjectCreate)],
    "cuUserObjectRetain" => [(11030, crate::user_object::cuUserObjectRetain)],
    "cuUserObjectRelease" => [(11030, crate::user_object::cuUserObjectRelease)],
    "cuGraphRetainUserObject" => [(11030, crate::user_object::cuGraphRetainUserObject)],
    "cuGraphReleaseUserObject" => [(11030, crate::user_object::cuGraphReleaseUserObject)],
    "cuGraphAddNode" => [
        (12020, crate::graph::cuGraphAddNode),
        (12030, crate::graph::cuGraphAddNode_v2),
        (13040, crate::graph::cuGraphAddNode_v3),
    ],
}

static TABLE: LazyLock<BTreeMap<&'static str, Vec<Variant>>> = LazyLock::new(build);

/// Variants registered at another version than [`TABLE`]'s: `(symbol, table version)` →
/// registered version (see [`register_at`]).
static REGISTERED_AT: LazyLock<Mutex<BTreeMap<(String, i32), i32>>> =
    LazyLock::new(Default::default);

/// Makes `cuGetProcAddress*` register the variant of `symbol` that [`TABLE`] lists at `version`
/// at `registered` instead (as a driver that registers it at another ABI version than the
/// headers' typedef says); `registered` = `version` undoes it.
pub(crate) fn register_at(symbol: &str, version: i32, registered: i32) {
    relock(&REGISTERED_AT).insert((symbol.to_owned(), version), registered);
}

/// Every variant at its [`TABLE`] version again.
pub(crate) fn reset_registrations() {
    relock(&REGISTERED_AT).clear();
}

/// The version the fake registers `symbol`'s variant `v` at.
fn registered(symbol: &str, v: &Variant) -> i32 {
    let overrides = relock(&REGISTERED_AT);
    if overrides.is_empty() {
        return v.version;
    }
    overrides
        .get(&(symbol.to_owned(), v.version))
        .copied()
        .unwrap_or(v.version)
}

/// What a lookup found.
enum Found {
    Pointer(usize),
    Unknown,
    VersionNotSufficient,
}

fn find(symbol: &CStr, version: c_int, flags: cuuint64_t) -> Found {
    let Ok(symbol) = symbol.to_str() else {
        return Found::Unknown;
    };
    if config().is_missing(symbol) {
        return Found::Unknown;
    }
    let Some(variants) = TABLE.get(symbol) else {
        return Found::Unknown;
    };
    let per_thread = flags & PER_THREAD_DEFAULT_STREAM != 0;
    // Like the real driver: a per-thread twin has its own ABI version, CUDA 7.0 at the earliest
    // (`PFN_cuStreamSynchronize_v7000_ptsz`), so asking for `cuStreamSynchronize` at 2000 with the
    // per-thread flag finds nothing (`VERSION_NOT_SUFFICIENT`, seen on the H200's 13.0 driver).
    // And a symbol with per-thread variants finds only those in per-thread mode: its older
    // variants without a twin are not found then (`cuMemcpyAtoA` at 2000, `VERSION_NOT_SUFFICIENT`
    // on the same driver; symbols without any per-thread variant answer with their legacy ones).
    let has_twins = variants.iter().any(|v| v.per_thread.is_some());
    let effective = |v: &Variant| match (per_thread, v.per_thread) {
        (true, Some(_)) => Some(registered(symbol, v).max(PER_THREAD_FIRST_VERSION)),
        (true, None) if has_twins => None,
        _ => Some(registered(symbol, v)),
    };
    let newest = variants
        .iter()
        .filter(|v| effective(v).is_some_and(|e| e <= version))
        .max_by_key(|v| registered(symbol, v));
    match newest {
        None => Found::VersionNotSufficient,
        Some(v) if per_thread => Found::Pointer(v.per_thread.unwrap_or(v.legacy)),
        Some(v) => Found::Pointer(v.legacy),
    }
}

/// The first version with per-thread default-stream variants (CUDA 7.0).
const PER_THREAD_FIRST_VERSION: i32 = 7000;

/// Records the request, and checks what both versions reject the same way. `Ok(None)` means
/// "rejected with `CUDA_ERROR_INVALID_VALUE`, nothing written".
///
/// # Safety
/// `symbol` is null or a NUL-terminated string.
unsafe fn request<'a>(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: cuuint64_t,
) -> Option<&'a CStr> {
    LAST_FLAGS.store(flags, Ordering::SeqCst);
    LAST_VERSION.store(version, Ordering::SeqCst);
    if symbol.is_null() || pfn.is_null() || version > config().version() {
        return None;
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated symbol name.
    Some(unsafe { CStr::from_ptr(symbol) })
}

/// The 12.0 form: the outcome is in `symbolStatus` (`CU_GET_PROC_ADDRESS_*`), the result is 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: cuuint64_t,
    symbolStatus: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    call("cuGetProcAddress_v2", "cuGetProcAddress", || {
        // SAFETY: the caller passes a NUL-terminated name or null.
        let Some(name) = (unsafe { request(symbol, pfn, cudaVersion, flags) }) else {
            return INVALID_VALUE;
        };
        let (pointer, status) = match find(name, cudaVersion, flags) {
            Found::Pointer(p) => (
                p,
                CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS,
            ),
            Found::Unknown => (
                0,
                CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            ),
            Found::VersionNotSufficient => (
                0,
                CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
            ),
        };
        // SAFETY: `pfn` is non-null (checked by `request`); `symbolStatus` is written only when
        // non-null; the caller passes valid places for both.
        unsafe {
            pfn.write(std::ptr::with_exposed_provenance_mut(pointer));
            if !symbolStatus.is_null() {
                symbolStatus.write(status);
            }
        }
        SUCCESS
    })
}

/// The 11.3 form: a missing symbol (or one only in newer variants) is `CUDA_ERROR_NOT_FOUND`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: cuuint64_t,
) -> CUresult {
    call("cuGetProcAddress", "cuGetProcAddress", || {
        // SAFETY: the caller passes a NUL-terminated name or null.
        let Some(name) = (unsafe { request(symbol, pfn, cudaVersion, flags) }) else {
            return INVALID_VALUE;
        };
        let (pointer, code) = match find(name, cudaVersion, flags) {
            Found::Pointer(p) => (p, SUCCESS),
            Found::Unknown | Found::VersionNotSufficient => (0, NOT_FOUND),
        };
        // SAFETY: `pfn` is non-null (checked by `request`) and the caller passes a valid place.
        unsafe { pfn.write(std::ptr::with_exposed_provenance_mut(pointer)) };
        code
    })
}

/// `cuMemAlloc`, the 2.0 export with 32-bit sizes and device pointers (`PFN_cuMemAlloc_v2000`,
/// under `__CUDA_API_VERSION_INTERNAL`): real drivers still export it beside `cuMemAlloc_v2`, so
/// a lookup by the plain name on a driver before 11.3 finds this one. The fake only refuses it,
/// recording the call, so a test can tell that the wrong ABI was picked.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc(_dptr: *mut u32, _bytesize: u32) -> CUresult {
    call("cuMemAlloc", "cuMemAlloc", || crate::errors::NOT_SUPPORTED)
}
