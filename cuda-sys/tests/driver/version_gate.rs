//! A function whose ABI version is newer than the driver is refused before anything is called; on a
//! driver new enough it resolves and runs. `cuLaunchHostFunc_v2` (13.2) is the example. Over the
//! whole table, on drivers reporting 13.0, 12.0, 11.3 and 10.2, exactly the entries above the
//! driver's version are refused, in both default-stream tables.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::types::{CUresult, CUstream};
use cuda_dl_sys::{DefaultStream, DriverVersion, Error, Function, LibraryKind, MissingReason};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{assert_gated_exactly_above, bump, required_version};
use cuda_workspace::testing::{current_primary_context, expect_error, fake, load_fake_driver};

fn assert_too_old(err: &Error, version: i32) {
    match err {
        Error::DriverTooOld {
            function,
            required,
            found,
            library,
        } => {
            assert_eq!(*function, "cuLaunchHostFunc_v2");
            assert_eq!(*required, 13020);
            assert_eq!(*found, DriverVersion(version));
            let library = library.as_ref().expect("the loaded library");
            assert_eq!(library.kind, LibraryKind::OtherName, "{library:?}");
        }
        other => panic!("expected DriverTooOld, got {other:?}"),
    }
    // Versions read as people write them ("13.2"), never as the encoded number (13020); the fake
    // is not NVIDIA's driver, so no upgrade of it is advised (a test double reports the version
    // it is told to).
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "cuLaunchHostFunc_v2 needs a driver that supports CUDA 13.2; the loaded driver \
             supports CUDA {}. The loaded library ",
            DriverVersion(version)
        )),
        "{text}"
    );
    assert!(text.contains("is not NVIDIA's driver"), "{text}");
    assert!(text.contains("report CUDA 13.2 or newer"), "{text}");
    assert!(!text.contains("Upgrade the NVIDIA driver"), "{text}");
}

/// On NVIDIA's driver (by its kind) the message advises the upgrade.
#[test]
fn on_nvidias_driver_too_old_advises_an_upgrade() {
    let err = Error::DriverTooOld {
        function: "cuLaunchHostFunc_v2",
        required: 13020,
        found: DriverVersion(12040),
        library: Some(cuda_dl_sys::DriverLibrary {
            path: "/usr/lib/libcuda.so.1".into(),
            kind: LibraryKind::NvidiaDriver,
            origin: cuda_dl_sys::LibraryOrigin::DefaultNames,
        }),
    };
    assert_eq!(
        err.to_string(),
        "cuLaunchHostFunc_v2 needs a driver that supports CUDA 13.2; the loaded driver supports \
         CUDA 12.4. Upgrade the NVIDIA driver"
    );
}

/// On a 13.2+ driver the four-argument `cuLaunchHostFunc_v2` resolves (looked up at 13020, the
/// version the driver registers it at, not its typedef's placeholder 13010), to the library's
/// export of that name, and runs its function; a bad `syncMode` is the driver's
/// `CUDA_ERROR_INVALID_VALUE`.
fn launch_host_func_v2_runs(version: i32) {
    let driver = load_fake_driver();
    assert_eq!(driver.version(), DriverVersion(version));
    let _context = current_primary_context(driver);
    let mut stream: CUstream = ptr::null_mut();
    let count = AtomicUsize::new(0);
    let data = ptr::from_ref(&count).cast_mut().cast::<c_void>();
    // SAFETY: `stream` is a valid out-pointer; `count` outlives the synchronize below.
    unsafe {
        driver.cuStreamCreate(&mut stream, 0).unwrap();
        let resolved = driver.raw().cuLaunchHostFunc_v2().unwrap();
        assert_eq!(fake().last_proc_address_version(), 13020);
        assert_eq!(
            Some(resolved as usize),
            fake().export_address("cuLaunchHostFunc_v2")
        );
        driver
            .cuLaunchHostFunc_v2(stream, Some(bump), data, 0)
            .unwrap();
        driver
            .cuLaunchHostFunc_v2(stream, Some(bump), data, 1)
            .unwrap();
        let err = driver
            .cuLaunchHostFunc_v2(stream, Some(bump), data, 2)
            .unwrap_err();
        assert_eq!(err.code(), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
        driver.cuStreamSynchronize(stream).unwrap();
        driver.cuStreamDestroy(stream).unwrap();
    }
    assert_eq!(count.load(Ordering::SeqCst), 2);
    assert_eq!(fake().call_count("cuLaunchHostFunc_v2"), 3);
}

isolated_test! {
    /// On 13.0, `cuLaunchHostFunc_v2` is `DriverTooOld` every time, without a lookup or a call;
    /// the three-argument `cuLaunchHostFunc` still works.
    fn a_function_newer_than_the_driver_is_refused_without_a_call(FAKE_CUDA_VERSION = "13000") {
        let driver = load_fake_driver();
        let lookups = fake().proc_address_calls(2);

        assert_too_old(&expect_error(driver.raw().cuLaunchHostFunc_v2()), 13000);
        // SAFETY: never called: the entry is refused before the driver is reached.
        let result = unsafe { driver.cuLaunchHostFunc_v2(ptr::null_mut(), Some(bump), ptr::null_mut(), 0) };
        assert_too_old(&result.unwrap_err().into(), 13000);
        assert_too_old(&expect_error(driver.raw().cuLaunchHostFunc_v2()), 13000);

        assert_eq!(fake().proc_address_calls(2), lookups, "the gate looked the symbol up");
        assert_eq!(fake().call_count("cuLaunchHostFunc"), 0);

        let _context = current_primary_context(driver);
        let count = AtomicUsize::new(0);
        let data = ptr::from_ref(&count).cast_mut().cast::<c_void>();
        // SAFETY: the legacy stream of the current context; `count` outlives the synchronize.
        unsafe {
            driver.cuLaunchHostFunc(ptr::null_mut(), Some(bump), data).unwrap();
            driver.cuStreamSynchronize(ptr::null_mut()).unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(fake().call_count("cuLaunchHostFunc_v2"), 0);
    }

    /// 13.1 has no `cuLaunchHostFunc_v2` (its headers have none; asked for at the typedef's
    /// placeholder 13010, a driver answers with the three-argument v1): refused as too old, with
    /// nothing looked up or called.
    fn the_four_argument_host_launch_is_too_new_for_13_1(FAKE_CUDA_VERSION = "13010") {
        let driver = load_fake_driver();
        let lookups = fake().proc_address_calls(2);
        assert_too_old(&expect_error(driver.raw().cuLaunchHostFunc_v2()), 13010);
        assert_too_old(&expect_error(driver.per_thread().raw().cuLaunchHostFunc_v2()), 13010);
        assert_eq!(fake().proc_address_calls(2), lookups, "the gate looked the symbol up");
    }

    /// 13.2 is the first driver with `cuLaunchHostFunc_v2`.
    fn the_four_argument_host_launch_works_from_13_2(FAKE_CUDA_VERSION = "13020") {
        launch_host_func_v2_runs(13020);
    }

    /// ... and a newer one has it too.
    fn the_four_argument_host_launch_works_on_13_5(FAKE_CUDA_VERSION = "13050") {
        launch_host_func_v2_runs(13050);
    }

    /// An entry whose typedef's version is a placeholder is checked against the library's export:
    /// a driver that registers `cuLaunchHostFunc_v2` at 13.3, so that the request at 13020 gets
    /// the three-argument v1 (or its per-thread twin), has the entry refused as
    /// `SymbolMissing(OtherVariant)`, every time, and neither function is called. The
    /// three-argument entry still works; an entry without a placeholder is not checked.
    fn a_placeholder_entry_answered_with_another_variant_is_refused_not_called(
        FAKE_CUDA_VERSION = "13030",
    ) {
        let driver = load_fake_driver();
        fake().register_variant_at("cuLaunchHostFunc", 13020, 13030);
        for table in [driver.legacy(), driver.per_thread()] {
            for _ in 0..2 {
                match table.resolve(Function::cuLaunchHostFunc_v2) {
                    Err(Error::SymbolMissing { function, required, reason, .. }) => {
                        assert_eq!(function, "cuLaunchHostFunc_v2");
                        assert_eq!(required, 13020);
                        assert_eq!(reason, MissingReason::OtherVariant);
                    }
                    other => panic!("expected SymbolMissing(OtherVariant), got {other:?}"),
                }
            }
            // SAFETY: never called: the entry is refused before any function is reached.
            let result = unsafe {
                table.cuLaunchHostFunc_v2(ptr::null_mut(), Some(bump), ptr::null_mut(), 1)
            };
            let err = Error::from(result.unwrap_err());
            assert!(err.to_string().contains("another ABI variant"), "{err}");
        }
        assert_eq!(fake().last_proc_address_version(), 13020);
        assert_eq!(fake().call_count("cuLaunchHostFunc"), 0, "v1 was called in v2's place");
        assert_eq!(fake().call_count("cuLaunchHostFunc_v2"), 0);

        let v1 = driver.resolve(Function::cuLaunchHostFunc).unwrap().addr().get();
        assert_eq!(Some(v1), fake().export_address("cuLaunchHostFunc"));
    }

    /// Only entries whose typedef's version is a placeholder are checked against their export:
    /// any other entry is taken as `cuGetProcAddress` answers (a profiler's wrapper, say, is not
    /// the export either). Here a driver that registers `cuStreamDestroy`'s 4.0 ABI at 5.0
    /// answers the 4.0 request with the 2.0 export, and the entry resolves to it.
    fn an_entry_without_a_placeholder_is_taken_as_the_driver_answers(FAKE_CUDA_VERSION = "13000") {
        let driver = load_fake_driver();
        fake().register_variant_at("cuStreamDestroy", 4000, 5000);
        assert_eq!(Function::cuStreamDestroy.info().placeholder_version, None);
        let p = driver.resolve(Function::cuStreamDestroy).unwrap().addr().get();
        assert_eq!(Some(p), fake().export_address("cuStreamDestroy"));
        assert_ne!(Some(p), fake().export_address("cuStreamDestroy_v2"));
    }

    /// The control: the same 13.3 driver registering v2 at 13.2 gives the export.
    fn a_placeholder_entry_answered_with_its_export_resolves(FAKE_CUDA_VERSION = "13030") {
        let driver = load_fake_driver();
        for (table, export) in [
            (driver.legacy(), "cuLaunchHostFunc_v2"),
            (driver.per_thread(), "cuLaunchHostFunc_v2_ptsz"),
        ] {
            let p = table.resolve(Function::cuLaunchHostFunc_v2).unwrap().addr().get();
            assert_eq!(Some(p), fake().export_address(export));
        }
    }
}

/// On the driver loaded (reporting `version`), in both default-stream tables, the entries refused
/// as `DriverTooOld` are exactly those whose ABI version (in that table) is above the driver's:
/// counted and compared by name. `version` is the ABI version of some entries, so that a gate off
/// by one (an entry at the driver's own version refused, or one above it let through) shows.
fn exactly_the_entries_above_the_driver_are_gated(version: i32) {
    let driver = load_fake_driver();
    assert_eq!(driver.version(), DriverVersion(version));
    for mode in [DefaultStream::Legacy, DefaultStream::PerThread] {
        assert!(
            Function::ALL
                .iter()
                .any(|&f| required_version(f, mode) == version as u32),
            "no entry at {version}: choose another version"
        );
        let table = driver.with_default_stream(mode);
        let gated: Vec<&str> = Function::ALL
            .iter()
            .filter(|&&f| matches!(table.resolve(f), Err(Error::DriverTooOld { .. })))
            .map(|f| f.name())
            .collect();
        assert_gated_exactly_above(version as u32, mode, &gated);
    }
}

isolated_test! {
    /// On 13.0 (the H200's driver), exactly the entries above 13.0 are gated; the 13.0 ones
    /// resolve.
    fn exactly_the_entries_above_a_13_0_driver_are_gated(FAKE_CUDA_VERSION = "13000") {
        exactly_the_entries_above_the_driver_are_gated(13000);
    }

    /// The same on 12.0 (the first with `cuGetProcAddress_v2`).
    fn exactly_the_entries_above_a_12_0_driver_are_gated(FAKE_CUDA_VERSION = "12000") {
        exactly_the_entries_above_the_driver_are_gated(12000);
    }

    /// The same on 11.3 (`cuGetProcAddress`, v1).
    fn exactly_the_entries_above_an_11_3_driver_are_gated(FAKE_CUDA_VERSION = "11030") {
        exactly_the_entries_above_the_driver_are_gated(11030);
    }

    /// The same on 10.2 (the versioned exports).
    fn exactly_the_entries_above_a_10_2_driver_are_gated(FAKE_CUDA_VERSION = "10020") {
        exactly_the_entries_above_the_driver_are_gated(10020);
    }
}
