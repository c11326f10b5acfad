//! Error codes: `cuGetErrorName` and `cuGetErrorString`.

use std::ffi::{CStr, c_char};
use std::ptr;

use cuda_dl_sys::DriverError;
use cuda_dl_sys::types::CUresult;

use super::harness::{cases, code};

/// `(code, name, the driver's text)` of the codes the fake returns, as the fake gives them.
const PINNED: &[(u32, &str, &str)] = &[
    (0, "CUDA_SUCCESS", "no error"),
    (1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"),
    (3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"),
    (4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"),
    (
        34,
        "CUDA_ERROR_STUB_LIBRARY",
        "CUDA driver is a stub library",
    ),
    (
        100,
        "CUDA_ERROR_NO_DEVICE",
        "no CUDA-capable device is detected",
    ),
    (101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"),
    (201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"),
    (400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"),
    (
        401,
        "CUDA_ERROR_ILLEGAL_STATE",
        "the operation cannot be performed in the present state",
    ),
    (500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"),
    (600, "CUDA_ERROR_NOT_READY", "device not ready"),
    (
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "an illegal memory access was encountered",
    ),
    (
        719,
        "CUDA_ERROR_LAUNCH_FAILED",
        "unspecified launch failure",
    ),
    (800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"),
    (801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"),
    (
        900,
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        "operation not permitted when stream is capturing",
    ),
    (
        901,
        "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        "operation failed due to a previous error during capture",
    ),
    (
        902,
        "CUDA_ERROR_STREAM_CAPTURE_MERGE",
        "operation would result in a merge of separate capture sequences",
    ),
    (
        903,
        "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
        "capture was not ended in the same stream as it began",
    ),
    (
        904,
        "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
        "capturing stream has unjoined work",
    ),
    (
        905,
        "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
        "dependency created on uncaptured work in another stream",
    ),
    (
        907,
        "CUDA_ERROR_CAPTURED_EVENT",
        "operation not permitted on an event last recorded in a capturing stream",
    ),
    (999, "CUDA_ERROR_UNKNOWN", "unknown error"),
];

type Describe =
    unsafe fn(&cuda_dl_sys::Driver, CUresult, *mut *const c_char) -> Result<(), cuda_dl_sys::Error>;

/// What `describe` (`cuGetErrorName` or `cuGetErrorString`) says of `code`: its result, and the
/// text if any.
fn ask(
    driver: &cuda_dl_sys::Driver,
    describe: Describe,
    error: u32,
) -> (Option<CUresult>, Option<String>) {
    let mut text: *const c_char = ptr::dangling();
    // SAFETY: a valid out-pointer.
    let result = code(unsafe { describe(driver, CUresult(error), &mut text) });
    let text = (result.is_none() && !text.is_null()).then(|| {
        // SAFETY: on success the driver points at a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(text) };
        text.to_string_lossy().into_owned()
    });
    (result, text)
}

fn name(driver: &cuda_dl_sys::Driver, error: u32) -> (Option<CUresult>, Option<String>) {
    // SAFETY: forwards the caller's out-pointer.
    ask(
        driver,
        |d, c, p| unsafe { Ok(d.cuGetErrorName(c, p)?) },
        error,
    )
}

fn string(driver: &cuda_dl_sys::Driver, error: u32) -> (Option<CUresult>, Option<String>) {
    // SAFETY: forwards the caller's out-pointer.
    ask(
        driver,
        |d, c, p| unsafe { Ok(d.cuGetErrorString(c, p)?) },
        error,
    )
}

cases! {
    /// The codes the fake returns have the driver's names and texts.
    fn error_names_and_strings_are_the_drivers(cx) {
        for &(error, expected_name, expected_text) in PINNED {
            assert_eq!(name(cx.driver, error), (None, Some(expected_name.to_string())), "{error}");
            assert_eq!(string(cx.driver, error), (None, Some(expected_text.to_string())), "{error}");
        }
    }

    /// Every code the driver names (0 to 1000) has the name `cuda-dl-sys`'s pinned header gives it;
    /// the fake names every code of that header.
    fn every_named_code_has_the_headers_name(cx) {
        let mut named = 0;
        for error in 0..=1000u32 {
            let header = DriverError::from_code(CUresult(error)).name();
            match name(cx.driver, error) {
                (None, Some(driver)) => {
                    assert_eq!(driver, header, "{error}");
                    named += 1;
                }
                (Some(CUresult::CUDA_ERROR_INVALID_VALUE), None) => {}
                other => panic!("cuGetErrorName({error}): {other:?}"),
            }
        }
        assert!(named >= PINNED.len(), "{named} codes named");
    }

    /// A code no driver knows: `CUDA_ERROR_INVALID_VALUE` from both calls.
    fn an_unknown_code_is_an_invalid_value(cx) {
        let invalid = Some(CUresult::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(name(cx.driver, 123_456).0, invalid);
        assert_eq!(string(cx.driver, 123_456).0, invalid);
    }
}
