//! A driver call that fails returns `Error::Driver` with the code, the function, and the driver's
//! own name and description, or the built-in ones for a code the driver cannot name.

use std::ptr;

use cuda_dl_sys::types::{CUresult, CUstream};
use cuda_dl_sys::{Driver, DriverError, Error};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{current_primary_context, expect_error, fake, load_fake_driver};

fn driver_error(err: impl Into<Error>) -> DriverError {
    match err.into() {
        Error::Driver(e) => e,
        other => panic!("expected a driver error, got {other:?}"),
    }
}

fn new_stream(driver: &Driver) -> CUstream {
    let _context = current_primary_context(driver);
    let mut stream: CUstream = ptr::null_mut();
    // SAFETY: `stream` is a valid out-pointer.
    unsafe { driver.cuStreamCreate(&mut stream, 0).unwrap() };
    stream
}

isolated_test! {
    /// `FAKE_CUDA_FAIL=cuStreamSynchronize=700`: CUDA_ERROR_ILLEGAL_ADDRESS, in the driver's words.
    fn a_failing_call_is_described_by_the_driver(FAKE_CUDA_FAIL = "cuStreamSynchronize=700") {
        let driver = load_fake_driver();
        let stream = new_stream(driver);
        // SAFETY: `stream` is live.
        let err = unsafe { driver.cuStreamSynchronize(stream) }.unwrap_err();
        assert_eq!(err.code(), Some(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
        let e = driver_error(err);
        assert_eq!(e.function(), Some("cuStreamSynchronize"));
        assert_eq!(e.name(), "CUDA_ERROR_ILLEGAL_ADDRESS");
        assert_eq!(e.description(), "an illegal memory access was encountered");
        assert_eq!(
            err.to_string(),
            "cuStreamSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory \
             access was encountered"
        );

        let synchronize = driver.raw().cuStreamSynchronize().unwrap();
        // SAFETY: `stream` is live.
        assert_eq!(unsafe { synchronize(stream) }, CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(fake().call_count("cuStreamSynchronize"), 2);
    }

    /// `name@n=code` fails the n-th call only.
    fn a_fault_can_hit_one_call(FAKE_CUDA_FAIL = "cuStreamSynchronize@2=700") {
        let driver = load_fake_driver();
        let stream = new_stream(driver);
        // SAFETY: `stream` is live.
        let results: Vec<Option<CUresult>> = (0..3)
            .map(|_| unsafe { driver.cuStreamSynchronize(stream) }.err().and_then(|e| e.code()))
            .collect();
        assert_eq!(results, [None, Some(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS), None]);
    }

    /// A code the driver's `cuGetErrorName` does not know is named from the pinned header's
    /// table; one neither knows is "unrecognized".
    fn an_unknown_code_falls_back_to_the_built_in_table() {
        let driver = load_fake_driver();
        let stream = new_stream(driver);
        let fail_with = |code: u32| {
            fake().set_fault("cuStreamSynchronize", 0, code);
            // SAFETY: `stream` is live.
            unsafe { driver.cuStreamSynchronize(stream) }.unwrap_err()
        };

        let err = fail_with(222);
        let e = driver_error(err);
        assert_eq!(e.code(), CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION);
        assert_eq!(e.name(), "CUDA_ERROR_UNSUPPORTED_PTX_VERSION");
        assert_eq!(e.description(), DriverError::from_code(CUresult(222)).description());
        assert_eq!(driver.describe(CUresult(222), None).name(), e.name());

        let err = fail_with(12345);
        let e = driver_error(err);
        assert_eq!(e.code(), CUresult(12345));
        assert_eq!(e.name(), "CUDA_ERROR_UNRECOGNIZED");
        assert!(err.to_string().contains("(12345)"), "{err}");

        fake().clear_faults();
        // SAFETY: `stream` is live.
        unsafe { driver.cuStreamSynchronize(stream).unwrap() };
    }

    /// A lookup that fails (rather than finding nothing) is reported and not cached: the next
    /// call looks the symbol up again and succeeds.
    fn a_failing_lookup_is_reported_and_retried() {
        let driver = load_fake_driver();
        fake().set_fault("cuGetProcAddress_v2", 1, 999);
        let err = expect_error(driver.raw().cuStreamQuery());
        let e = driver_error(err);
        assert_eq!(e.code(), CUresult::CUDA_ERROR_UNKNOWN);
        assert_eq!(e.function(), Some("cuGetProcAddress_v2"));
        assert_eq!(e.name(), "CUDA_ERROR_UNKNOWN");
        assert_eq!(
            driver.raw().cuStreamQuery().unwrap() as usize,
            fake().export_address("cuStreamQuery").unwrap()
        );
    }
}
