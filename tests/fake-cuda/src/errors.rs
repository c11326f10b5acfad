//! Result codes, and `cuGetErrorName`/`cuGetErrorString`: the driver's own texts for the codes the
//! fake returns, the pinned header's names (and documentation) for the others.

use std::ffi::{CString, c_char};
use std::sync::LazyLock;

use cuda_dl_sys::types::CUresult;

use crate::calls::call;

/// What an implementation returns: `Ok` for `CUDA_SUCCESS`, else the code.
pub(crate) type Res = Result<(), CUresult>;

/// The `CUresult` of a [`Res`].
pub(crate) fn code(result: Res) -> CUresult {
    match result {
        Ok(()) => SUCCESS,
        Err(code) => code,
    }
}

/// The [`Res`] of a `CUresult`.
pub(crate) fn result(code: CUresult) -> Res {
    if code == SUCCESS { Ok(()) } else { Err(code) }
}

/// `Err(code)` unless `ok`.
pub(crate) fn ensure(ok: bool, code: CUresult) -> Res {
    if ok { Ok(()) } else { Err(code) }
}

pub(crate) const SUCCESS: CUresult = CUresult(0);
pub(crate) const INVALID_VALUE: CUresult = CUresult(1);
pub(crate) const OUT_OF_MEMORY: CUresult = CUresult(2);
pub(crate) const NOT_INITIALIZED: CUresult = CUresult(3);
pub(crate) const DEINITIALIZED: CUresult = CUresult(4);
pub(crate) const STUB_LIBRARY: CUresult = CUresult(34);
pub(crate) const INVALID_DEVICE: CUresult = CUresult(101);
pub(crate) const INVALID_CONTEXT: CUresult = CUresult(201);
pub(crate) const INVALID_HANDLE: CUresult = CUresult(400);
pub(crate) const ILLEGAL_STATE: CUresult = CUresult(401);
pub(crate) const NOT_FOUND: CUresult = CUresult(500);
pub(crate) const NOT_READY: CUresult = CUresult(600);
pub(crate) const LAUNCH_FAILED: CUresult = CUresult(719);
pub(crate) const NOT_PERMITTED: CUresult = CUresult(800);
pub(crate) const NOT_SUPPORTED: CUresult = CUresult(801);
pub(crate) const CAPTURE_UNSUPPORTED: CUresult = CUresult(900);
pub(crate) const CAPTURE_INVALIDATED: CUresult = CUresult(901);
pub(crate) const CAPTURE_MERGE: CUresult = CUresult(902);
pub(crate) const CAPTURE_UNMATCHED: CUresult = CUresult(903);
pub(crate) const CAPTURE_ISOLATION: CUresult = CUresult(905);
pub(crate) const CAPTURED_EVENT: CUresult = CUresult(907);
pub(crate) const UNKNOWN: CUresult = CUresult(999);

/// `(code, name, description)` of the codes the fake can name, in the real driver's words.
const KNOWN: &[(u32, &str, &str)] = &[
    (0, "CUDA_SUCCESS\0", "no error\0"),
    (1, "CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
    (3, "CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
    (4, "CUDA_ERROR_DEINITIALIZED\0", "driver shutting down\0"),
    (
        34,
        "CUDA_ERROR_STUB_LIBRARY\0",
        "CUDA driver is a stub library\0",
    ),
    (
        100,
        "CUDA_ERROR_NO_DEVICE\0",
        "no CUDA-capable device is detected\0",
    ),
    (
        101,
        "CUDA_ERROR_INVALID_DEVICE\0",
        "invalid device ordinal\0",
    ),
    (
        201,
        "CUDA_ERROR_INVALID_CONTEXT\0",
        "invalid device context\0",
    ),
    (
        400,
        "CUDA_ERROR_INVALID_HANDLE\0",
        "invalid resource handle\0",
    ),
    (
        401,
        "CUDA_ERROR_ILLEGAL_STATE\0",
        "the operation cannot be performed in the present state\0",
    ),
    (500, "CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
    (600, "CUDA_ERROR_NOT_READY\0", "device not ready\0"),
    (
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS\0",
        "an illegal memory access was encountered\0",
    ),
    (
        719,
        "CUDA_ERROR_LAUNCH_FAILED\0",
        "unspecified launch failure\0",
    ),
    (
        800,
        "CUDA_ERROR_NOT_PERMITTED\0",
        "operation not permitted\0",
    ),
    (
        801,
        "CUDA_ERROR_NOT_SUPPORTED\0",
        "operation not supported\0",
    ),
    (
        900,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED\0",
        "operation not permitted when stream is capturing\0",
    ),
    (
        901,
        "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED\0",
        "operation failed due to a previous error during capture\0",
    ),
    (
        902,
        "CUDA_ERROR_STREAM_CAPTURE_MERGE\0",
        "operation would result in a merge of separate capture sequences\0",
    ),
    (
        903,
        "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED\0",
        "capture was not ended in the same stream as it began\0",
    ),
    (
        904,
        "CUDA_ERROR_STREAM_CAPTURE_UNJOINED\0",
        "capturing stream has unjoined work\0",
    ),
    (
        905,
        "CUDA_ERROR_STREAM_CAPTURE_ISOLATION\0",
        "dependency created on uncaptured work in another stream\0",
    ),
    (
        907,
        "CUDA_ERROR_CAPTURED_EVENT\0",
        "operation not permitted on an event last recorded in a capturing stream\0",
    ),
    (999, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];

/// The codes of `cuda-dl-sys`'s header table that [`KNOWN`] lacks, with the header's name and
/// description (a real driver knows every code of its own header; the fake's strings for these
/// are the header's documentation, not the driver's short texts).
static FROM_HEADER: LazyLock<Vec<(u32, CString, CString)>> = LazyLock::new(|| {
    (0..=1000)
        .filter(|code| !KNOWN.iter().any(|entry| entry.0 == *code))
        .filter_map(|code| {
            let error = cuda_dl_sys::DriverError::from_code(CUresult(code));
            let known = error.name() != "CUDA_ERROR_UNRECOGNIZED";
            let text = |s: &str| CString::new(s).ok();
            known.then(|| Some((code, text(error.name())?, text(error.description())?)))?
        })
        .collect()
});

fn lookup(code: CUresult, name: bool) -> *const c_char {
    if let Some(entry) = KNOWN.iter().find(|entry| entry.0 == code.0) {
        let text = if name { entry.1 } else { entry.2 };
        return text.as_ptr().cast();
    }
    FROM_HEADER
        .iter()
        .find(|entry| entry.0 == code.0)
        .map_or(std::ptr::null(), |entry| {
            if name {
                entry.1.as_ptr()
            } else {
                entry.2.as_ptr()
            }
        })
}

/// Writes the static text for `code`, or null and `CUDA_ERROR_INVALID_VALUE` for a code the fake
/// does not know (as the real driver does), so callers fall back to their own table.
///
/// # Safety
/// `out` is null or valid for writing a pointer.
unsafe fn describe(out: *mut *const c_char, text: *const c_char) -> CUresult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: `out` is non-null and, by the caller's contract, valid for writing.
    unsafe { out.write(text) };
    if text.is_null() {
        INVALID_VALUE
    } else {
        SUCCESS
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, pStr: *mut *const c_char) -> CUresult {
    call("cuGetErrorName", "cuGetErrorName", || {
        // SAFETY: the caller passes a valid place for a pointer, or null (checked).
        unsafe { describe(pStr, lookup(error, true)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, pStr: *mut *const c_char) -> CUresult {
    call("cuGetErrorString", "cuGetErrorString", || {
        // SAFETY: the caller passes a valid place for a pointer, or null (checked).
        unsafe { describe(pStr, lookup(error, false)) }
    })
}
