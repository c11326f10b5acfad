//! Each driver generation is resolved the way it supports: versioned exports below 11.3,
//! `cuGetProcAddress` for 11.3–11.8, `cuGetProcAddress_v2` from 12.0. The fake's counters confirm
//! which lookup ran; on each, a cheap function works, stream work runs and a too-new one is gated.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::types::{CUcontext, CUdevice, CUstream};
use cuda_dl_sys::{DefaultStream, DriverVersion, Error, Function, MissingReason, ResolutionPath};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::bump;
use cuda_workspace::testing::{fake, load_fake_driver};

fn check(version: i32, path: ResolutionPath, too_new: Function) {
    let driver = load_fake_driver();
    assert_eq!(driver.version(), DriverVersion(version));
    assert_eq!(driver.resolution_path(), path);

    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer.
    unsafe { driver.cuDeviceGetCount(&mut count).unwrap() };
    assert_eq!(count, 1);

    match driver.resolve(too_new) {
        Err(Error::DriverTooOld {
            function,
            required,
            found,
            ..
        }) => {
            assert_eq!(function, too_new.name());
            assert_eq!(required, too_new.info().version);
            assert_eq!(found, DriverVersion(version));
        }
        other => panic!("{too_new} on {version}: expected DriverTooOld, got {other:?}"),
    }
    assert_eq!(
        fake().call_count(too_new.info().symbol.to_str().unwrap()),
        0
    );

    // Context and stream work through functions every generation has (the primary context is
    // not released: cuDevicePrimaryCtxRelease is bound at its 11.0 ABI, absent below that).
    let mut device: CUdevice = 0;
    let mut context: CUcontext = ptr::null_mut();
    let mut stream: CUstream = ptr::null_mut();
    // SAFETY: valid out-pointers; handles from the driver.
    unsafe {
        driver.cuDeviceGet(&mut device, 0).unwrap();
        driver
            .cuDevicePrimaryCtxRetain(&mut context, device)
            .unwrap();
        driver.cuCtxSetCurrent(context).unwrap();
        driver.cuStreamCreate(&mut stream, 0).unwrap();
    }
    let ran = AtomicUsize::new(0);
    if version >= 10000 {
        let data = ptr::from_ref(&ran).cast_mut().cast::<c_void>();
        // SAFETY: `ran` outlives the synchronize below.
        unsafe { driver.cuLaunchHostFunc(stream, Some(bump), data).unwrap() };
    }
    // SAFETY: `stream` is live.
    unsafe {
        driver.cuStreamSynchronize(stream).unwrap();
        driver.cuStreamDestroy(stream).unwrap();
    }
    assert_eq!(ran.load(Ordering::SeqCst), usize::from(version >= 10000));

    let (v1, v2) = (fake().proc_address_calls(1), fake().proc_address_calls(2));
    match path {
        ResolutionPath::Exports => assert_eq!((v1, v2), (0, 0)),
        ResolutionPath::ProcAddress => assert!(v1 >= 5 && v2 == 0, "v1 {v1}, v2 {v2}"),
        ResolutionPath::ProcAddressV2 => assert!(v2 >= 5 && v1 == 0, "v1 {v1}, v2 {v2}"),
    }
}

isolated_test! {
    /// CUDA 9.2: exports; `cuLaunchHostFunc` (10.0) is too new.
    fn cuda_9_2_resolves_by_export(FAKE_CUDA_VERSION = "9020") {
        check(9020, ResolutionPath::Exports, Function::cuLaunchHostFunc);
    }

    /// CUDA 10.0: exports; `cuUserObjectCreate` (11.3) is too new.
    fn cuda_10_0_resolves_by_export(FAKE_CUDA_VERSION = "10000") {
        check(10000, ResolutionPath::Exports, Function::cuUserObjectCreate);
    }

    /// CUDA 11.2: still exports (`cuGetProcAddress` came in 11.3).
    fn cuda_11_2_resolves_by_export(FAKE_CUDA_VERSION = "11020") {
        check(11020, ResolutionPath::Exports, Function::cuUserObjectCreate);
    }

    /// CUDA 11.8: `cuGetProcAddress`; `cuStreamGetId` (12.0) is too new.
    fn cuda_11_8_resolves_through_cu_get_proc_address(FAKE_CUDA_VERSION = "11080") {
        check(11080, ResolutionPath::ProcAddress, Function::cuStreamGetId);
    }

    /// CUDA 12.0: `cuGetProcAddress_v2`; `cuStreamGetCaptureInfo` (bound at 12.3) is too new.
    fn cuda_12_0_resolves_through_cu_get_proc_address_v2(FAKE_CUDA_VERSION = "12000") {
        check(12000, ResolutionPath::ProcAddressV2, Function::cuStreamGetCaptureInfo);
    }

    /// CUDA 13.0: `cuGetProcAddress_v2`; `cuLaunchHostFunc_v2` (13.2) is too new.
    fn cuda_13_0_resolves_through_cu_get_proc_address_v2(FAKE_CUDA_VERSION = "13000") {
        check(13000, ResolutionPath::ProcAddressV2, Function::cuLaunchHostFunc_v2);
    }

    /// CUDA 13.2: `cuGetProcAddress_v2`; `cuGraphAddNode_v3` (13.4) is too new.
    fn cuda_13_2_resolves_through_cu_get_proc_address_v2(FAKE_CUDA_VERSION = "13020") {
        check(13020, ResolutionPath::ProcAddressV2, Function::cuGraphAddNode_v3);
        let driver = load_fake_driver();
        assert_eq!(
            driver.resolve(Function::cuLaunchHostFunc_v2).unwrap().addr().get(),
            fake().export_address("cuLaunchHostFunc_v2").unwrap()
        );
    }
}

/// `get_proc_address(symbol, version, mode)` on the driver loaded, as an address.
fn looked_up(symbol: &str, version: u32, mode: DefaultStream) -> Result<usize, Error> {
    load_fake_driver()
        .get_proc_address(symbol, version, mode)
        .map(|p| p.addr().get())
}

/// The fake's export `name`.
fn export(name: &str) -> usize {
    fake()
        .export_address(name)
        .unwrap_or_else(|| panic!("the fake exports {name}"))
}

isolated_test! {
    /// Before 11.3 there is no `cuGetProcAddress`: `get_proc_address` looks up the export of the
    /// newest variant at or below the version asked for, as `cuGetProcAddress` answers on newer
    /// drivers, not only of a variant at exactly that version (issue 38: `("cuMemAlloc", 11020)`
    /// and `("cuStreamSynchronize", 9000, per-thread)` answered VersionNotSufficient on 11.2).
    fn before_11_3_get_proc_address_finds_the_newest_variant_at_or_below_the_version(
        FAKE_CUDA_VERSION = "11020",
    ) {
        use DefaultStream::{Legacy, PerThread};
        assert_eq!(load_fake_driver().resolution_path(), ResolutionPath::Exports);
        // Between variants, and at the driver's own version.
        assert_eq!(looked_up("cuMemAlloc", 11020, Legacy).unwrap(), export("cuMemAlloc_v2"));
        assert_eq!(looked_up("cuMemAlloc", 5000, Legacy).unwrap(), export("cuMemAlloc_v2"));
        // Exactly at a variant's version, as before.
        assert_eq!(looked_up("cuMemAlloc", 3020, Legacy).unwrap(), export("cuMemAlloc_v2"));
        // Per-thread: the twin's own version (7.0) and any later one.
        assert_eq!(
            looked_up("cuStreamSynchronize", 9000, PerThread).unwrap(),
            export("cuStreamSynchronize_ptsz")
        );
        assert_eq!(
            looked_up("cuStreamSynchronize", 9000, Legacy).unwrap(),
            export("cuStreamSynchronize")
        );
        // Of two variants, the newer at or below: cuStreamDestroy 2.0, cuStreamDestroy_v2 4.0.
        assert_eq!(looked_up("cuStreamDestroy", 3000, Legacy).unwrap(), export("cuStreamDestroy"));
        assert_eq!(looked_up("cuStreamDestroy", 9000, Legacy).unwrap(), export("cuStreamDestroy_v2"));
        // Below every variant, or below the per-thread twins (7.0): none, as cuGetProcAddress says.
        for (symbol, version, mode) in [
            ("cuMemAlloc", 2000, Legacy),
            ("cuStreamSynchronize", 6050, PerThread),
            ("cuMemcpyAtoA", 2000, PerThread),
        ] {
            match looked_up(symbol, version, mode) {
                Err(Error::SymbolMissing { reason: MissingReason::VersionNotSufficient, .. }) => {}
                other => panic!("{symbol} at {version} {mode:?}: {other:?}"),
            }
        }
        // cuMemcpyAtoA per-thread from 7.0 is 3.2's twin, `cuMemcpyAtoA_v2_ptds`.
        assert_eq!(
            looked_up("cuMemcpyAtoA", 9000, PerThread).unwrap(),
            export("cuMemcpyAtoA_v2_ptds")
        );
    }
}
