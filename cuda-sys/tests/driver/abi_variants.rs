//! Every ABI variant of a function is an entry of its own (issue 23, item 1): on drivers 10.2,
//! 11.2, 11.8, 12.0, 12.4 and 13.0 every entry at or below the driver's version resolves to its
//! own export's code (the variant of that version, not whichever export has the plain name), and
//! every entry above it is `DriverTooOld`, in both default-stream tables.

use cuda_dl_sys::functions::{
    cuCtxCreate, cuCtxCreate_v2, cuCtxCreate_v3, cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_v2,
};
use cuda_dl_sys::types::CUresult;
use cuda_dl_sys::{DefaultStream, DriverVersion, Error, Function, MissingReason};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{fake, load_fake_driver};

/// Checks every entry of the table against the fake at `version`; returns how many resolved.
fn every_variant_resolves_to_its_own_export(version: i32) -> usize {
    let driver = load_fake_driver();
    assert_eq!(driver.version(), DriverVersion(version));
    let mut resolved = 0;
    for mode in [DefaultStream::Legacy, DefaultStream::PerThread] {
        let table = driver.with_default_stream(mode);
        for &function in Function::ALL {
            let info = function.info();
            let (required, export) = match (mode, info.per_thread_export, info.per_thread_version) {
                (DefaultStream::PerThread, Some(export), Some(v)) => (v, export),
                _ => (info.version, info.export),
            };
            let export = export.to_str().unwrap();
            let result = table.resolve(function);
            // A variant without a per-thread twin, of a function that has per-thread variants, is
            // not in the per-thread table on any driver (never its legacy export).
            let no_twin = mode == DefaultStream::PerThread
                && cuda_workspace::testing::lacks_per_thread_variant(function);
            if no_twin && required <= version as u32 {
                assert!(
                    matches!(
                        result,
                        Err(Error::SymbolMissing {
                            reason: MissingReason::NoPerThreadVariant,
                            ..
                        })
                    ),
                    "{} ({required}) on {version}, per-thread: {result:?}",
                    info.name
                );
                continue;
            }
            if required > version as u32 {
                match result {
                    Err(Error::DriverTooOld {
                        function: f,
                        required: r,
                        ..
                    }) => {
                        assert_eq!((f, r), (info.name, required), "{mode:?}");
                    }
                    other => panic!(
                        "{} ({required}) on {version}, {mode:?}: {other:?}",
                        info.name
                    ),
                }
                continue;
            }
            // The fake implements a part of the API: where it exports the variant, the entry
            // must resolve to exactly that export's code.
            let Some(expected) = fake().export_address(export) else {
                continue;
            };
            match result {
                Ok(p) => assert_eq!(
                    p.addr().get(),
                    expected,
                    "{} ({required}) on {version}, {mode:?}: not the export {export}",
                    info.name
                ),
                Err(e) => panic!("{} ({required}) on {version}, {mode:?}: {e}", info.name),
            }
            resolved += 1;
        }
    }
    resolved
}

/// The typed entries: the three `cuCtxCreate` ABIs and two `cuStreamGetCaptureInfo` ABIs, each
/// at its version, and `Driver::newest` picking the newest the driver has among variants of one
/// signature, whose checked call names the one it picked.
fn typed_variants_and_newest(version: i32) {
    let driver = load_fake_driver();
    let gate = |entry: Function, ok: bool| {
        let result = driver.resolve(entry);
        assert_eq!(result.is_ok(), ok, "{entry} on {version}: {result:?}");
    };
    gate(cuCtxCreate_v2.function(), version >= 3020);
    gate(cuCtxCreate_v3.function(), version >= 11040);
    gate(cuCtxCreate.function(), version >= 12050);
    assert_eq!(cuCtxCreate_v3.info().version, 11040);
    assert_eq!(cuStreamGetCaptureInfo_v2.info().version, 11030);
    assert!(driver.function(cuCtxCreate_v2).is_ok());

    // cuDevicePrimaryCtxRelease's 7.0 and 11.0 ABIs share a signature.
    let which = driver
        .newest(&[
            cuda_dl_sys::functions::cuDevicePrimaryCtxRelease_v7000,
            cuda_dl_sys::functions::cuDevicePrimaryCtxRelease,
        ])
        .unwrap()
        .function();
    let expected = if version >= 11000 {
        Function::cuDevicePrimaryCtxRelease
    } else {
        Function::cuDevicePrimaryCtxRelease_v7000
    };
    assert_eq!(which, expected, "on {version}");
    // The same without listing them: the table knows the variants of one signature.
    let release = cuda_dl_sys::functions::cuDevicePrimaryCtxRelease;
    assert_eq!(
        release.variants(),
        [
            Function::cuDevicePrimaryCtxRelease,
            Function::cuDevicePrimaryCtxRelease_v7000
        ]
    );
    let chosen = driver.newest_variant(release).unwrap();
    assert_eq!(chosen.function(), expected, "on {version}");
    // Its checked call's error names the variant that was called, with no name written by hand.
    // SAFETY: device 99 does not exist: the driver refuses it and touches nothing.
    let err = unsafe { chosen.call((99,)) }.unwrap_err();
    assert_eq!(err.function(), expected);
    assert_eq!(err.code(), Some(CUresult::CUDA_ERROR_INVALID_DEVICE));
    let text = Error::from(err).to_string();
    assert!(
        text.starts_with(&format!("{expected} failed: CUDA_ERROR_INVALID_DEVICE")),
        "{text}"
    );
    // cuStreamGetCaptureInfo's three ABIs have three signatures: each is its own only variant.
    assert_eq!(
        cuStreamGetCaptureInfo_v2.variants(),
        [Function::cuStreamGetCaptureInfo_v2]
    );
    // None available: the oldest's error.
    let err = driver.newest(&[cuStreamGetCaptureInfo]).map(|_| ());
    if version < 12030 {
        assert!(
            matches!(
                err,
                Err(Error::DriverTooOld {
                    required: 12030,
                    ..
                })
            ),
            "{err:?}"
        );
    }
}

/// Before 11.3 there is no `cuGetProcAddress`: the table looks exports up, and so does the untyped
/// `get_proc_address`, which must take the export of the version asked for (`cuMemAlloc_v2` for
/// 3020), not the 32-bit `cuMemAlloc` export that has the plain name.
fn the_pre_11_3_path_chooses_the_versioned_export(version: i32) {
    let driver = load_fake_driver();
    assert!(version < 11030);
    assert_eq!(
        driver.resolution_path(),
        cuda_dl_sys::ResolutionPath::Exports
    );
    let plain = fake().export_address("cuMemAlloc").unwrap();
    let v2 = fake().export_address("cuMemAlloc_v2").unwrap();
    assert_ne!(plain, v2);
    assert_eq!(
        driver.resolve(Function::cuMemAlloc).unwrap().addr().get(),
        v2
    );
    let looked_up = driver
        .get_proc_address("cuMemAlloc", 3020, DefaultStream::Legacy)
        .unwrap();
    assert_eq!(
        looked_up.addr().get(),
        v2,
        "the 32-bit cuMemAlloc export was returned"
    );
    // Per-thread: a version without a per-thread twin finds nothing (as `cuGetProcAddress`
    // answers), not the plain-named 32-bit export of another ABI; 7000 is the `_ptds` twin.
    assert!(matches!(
        driver.get_proc_address("cuMemcpyHtoD", 3020, DefaultStream::PerThread),
        Err(Error::SymbolMissing {
            reason: MissingReason::VersionNotSufficient,
            ..
        })
    ));
    let per_thread = driver
        .get_proc_address("cuMemcpyHtoD", 7000, DefaultStream::PerThread)
        .unwrap();
    assert_eq!(
        Some(per_thread.addr().get()),
        fake().export_address("cuMemcpyHtoD_v2_ptds")
    );
    // A symbol the table does not have: the export named so, as before.
    assert!(matches!(
        driver.get_proc_address("cuNoSuchFunction", 2000, DefaultStream::Legacy),
        Err(Error::SymbolMissing {
            reason: MissingReason::NotExported,
            ..
        })
    ));
}

isolated_test! {
    fn every_variant_at_or_below_10_2_resolves_and_none_above(FAKE_CUDA_VERSION = "10020") {
        assert!(every_variant_resolves_to_its_own_export(10020) > 0);
        typed_variants_and_newest(10020);
        the_pre_11_3_path_chooses_the_versioned_export(10020);
    }

    fn every_variant_at_or_below_11_2_resolves_and_none_above(FAKE_CUDA_VERSION = "11020") {
        assert!(every_variant_resolves_to_its_own_export(11020) > 0);
        typed_variants_and_newest(11020);
        the_pre_11_3_path_chooses_the_versioned_export(11020);
    }

    fn every_variant_at_or_below_11_8_resolves_and_none_above(FAKE_CUDA_VERSION = "11080") {
        assert!(every_variant_resolves_to_its_own_export(11080) > 0);
        typed_variants_and_newest(11080);
    }

    fn every_variant_at_or_below_12_0_resolves_and_none_above(FAKE_CUDA_VERSION = "12000") {
        assert!(every_variant_resolves_to_its_own_export(12000) > 0);
        typed_variants_and_newest(12000);
    }

    fn every_variant_at_or_below_12_4_resolves_and_none_above(FAKE_CUDA_VERSION = "12040") {
        assert!(every_variant_resolves_to_its_own_export(12040) > 0);
        typed_variants_and_newest(12040);
    }

    fn every_variant_at_or_below_13_0_resolves_and_none_above(FAKE_CUDA_VERSION = "13000") {
        assert!(every_variant_resolves_to_its_own_export(13000) > 0);
        typed_variants_and_newest(13000);
    }
}
