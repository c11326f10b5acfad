//! cuda-dl-sys against the real driver. Opt-in: `cargo test --test gpu_driver -- --ignored`, or the
//! bundle of `scripts/gpu-bundle`. Without a driver every test here fails (it does not skip).

use std::ptr;

use cuda_dl_sys::{
    DefaultStream, DriverVersion, Error, Function, LibraryKind, MissingReason, ResolutionPath,
    driver,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::assert_gated_exactly_above;

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn the_real_driver_loads_and_reports_its_version_and_path() {
    let d = driver().expect("the NVIDIA driver loads");
    println!(
        "driver: CUDA {} ({}) at {}, resolved through {:?}",
        d.version(),
        d.version().0,
        d.path().display(),
        d.resolution_path()
    );
    assert!(
        d.version().0 >= 12000,
        "this project's GPU runner has a 13.x driver"
    );
    assert_eq!(d.resolution_path(), ResolutionPath::ProcAddressV2);
}

/// The real driver is judged NVIDIA's (its file name is `libcuda.so*`, it exports
/// `cuGetProcAddress_v2`): a symbol it lacks is reported with its path and the upgrade advice,
/// not as a library that is not the driver.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_symbol_the_real_driver_lacks_is_reported_as_the_drivers_with_upgrade_advice() {
    let d = driver().expect("the NVIDIA driver loads");
    let err = match d.get_proc_address("cuNoSuchFunction", 2000, DefaultStream::Legacy) {
        Ok(p) => panic!("cuNoSuchFunction resolved to {p:?}"),
        Err(e) => e,
    };
    match &err {
        Error::SymbolMissing {
            library: Some(library),
            ..
        } => {
            assert_eq!(library.kind, LibraryKind::NvidiaDriver, "{library:?}");
            assert_eq!(library.path, d.path());
        }
        other => panic!("expected SymbolMissing naming the library, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("Upgrade the NVIDIA driver"), "{text}");
    assert!(text.contains(&d.path().display().to_string()), "{text}");
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn device_context_and_stream_calls_work_through_the_table() {
    let d = driver().expect("driver");
    let mut count = 0;
    // SAFETY: valid out-pointer.
    unsafe { d.cuDeviceGetCount(&mut count) }.expect("cuDeviceGetCount");
    assert!(count >= 1);
    let mut device = 0;
    let mut name = [0 as std::ffi::c_char; 128];
    let mut context = ptr::null_mut();
    let mut stream = ptr::null_mut();
    // SAFETY: valid out-pointers; handles come from the driver and are used while alive.
    unsafe {
        d.cuDeviceGet(&mut device, 0).expect("cuDeviceGet");
        d.cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, device)
            .expect("name");
        d.cuDevicePrimaryCtxRetain(&mut context, device)
            .expect("retain");
        d.cuCtxSetCurrent(context).expect("set current");
        d.cuStreamCreate(&mut stream, 0).expect("cuStreamCreate");
        d.cuStreamSynchronize(stream).expect("cuStreamSynchronize");
        d.cuStreamDestroy(stream).expect("cuStreamDestroy");
        d.cuDevicePrimaryCtxRelease(device).expect("release");
    }
    // SAFETY: the driver wrote a NUL-terminated name.
    let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    println!("{count} device(s); device 0: {name}");
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn launch_host_func_v2_is_gated_by_the_driver_version() {
    let d = driver().expect("driver");
    let required = Function::cuLaunchHostFunc_v2.info().version;
    match d.raw().cuLaunchHostFunc_v2() {
        Err(Error::DriverTooOld {
            function,
            required: r,
            found,
            ..
        }) => {
            println!(
                "{function}: DriverTooOld (needs {}, driver {found})",
                DriverVersion(r as i32)
            );
            assert!(d.version().0 < required as i32);
            assert_eq!(r, required);
            assert_eq!(found, d.version());
        }
        Ok(_) => {
            println!(
                "cuLaunchHostFunc_v2 resolved: driver {} >= {required}",
                d.version().0
            );
            assert!(d.version().0 >= required as i32);
        }
        Err(other) => panic!("unexpected: {other}"),
    }
}

/// Issue 38: `cuLaunchHostFunc_v2` is requested at 13.2, the version the driver registers it at
/// (its typedef's 13010 is a placeholder; asked there, a driver answers with the three-argument
/// v1). On a driver before 13.2 (the runners' 13.0) both tables report it `DriverTooOld`,
/// required 13.2, the message saying "CUDA 13.2"; on 13.2 or newer each resolves to the driver's
/// own export of the variant (`cuLaunchHostFunc_v2`, `cuLaunchHostFunc_v2_ptsz`).
#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn launch_host_func_v2_is_requested_at_13_2_and_reported_too_old_before() {
    let d = driver().expect("driver");
    let info = Function::cuLaunchHostFunc_v2.info();
    assert_eq!(info.version, 13020);
    assert_eq!(info.placeholder_version, Some(13010));
    for (table, export) in [
        (d.legacy(), "cuLaunchHostFunc_v2"),
        (d.per_thread(), "cuLaunchHostFunc_v2_ptsz"),
    ] {
        match table.resolve(Function::cuLaunchHostFunc_v2) {
            Err(
                err @ Error::DriverTooOld {
                    function,
                    required,
                    found,
                    ..
                },
            ) => {
                println!("{:?} table: {err}", table.default_stream());
                assert_eq!(function, "cuLaunchHostFunc_v2");
                assert_eq!(required, 13020);
                assert_eq!(found, d.version());
                assert!(d.version().0 < 13020, "{}", d.version());
                assert!(err.to_string().contains("supports CUDA 13.2;"), "{err}");
                // NVIDIA's driver: the upgrade is the advice.
                assert!(
                    err.to_string().contains("Upgrade the NVIDIA driver"),
                    "{err}"
                );
            }
            Ok(p) => {
                assert!(d.version().0 >= 13020, "{}", d.version());
                // SAFETY: the driver this process already loaded; only an address is read.
                let library = unsafe { libloading::Library::new(d.path()) }.expect("reopen");
                // SAFETY: read as an address, never called.
                let own =
                    unsafe { library.get::<*mut std::ffi::c_void>(export.as_bytes()) }.map(|s| *s);
                println!("{export}: resolved {p:?}, export {own:?}");
                if let Ok(own) = own {
                    assert_eq!(p.as_ptr(), own, "not the driver's {export}");
                }
            }
            Err(other) => panic!("{:?} table: unexpected {other}", table.default_stream()),
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn legacy_and_per_thread_stream_variants_resolve_to_different_pointers() {
    let d = driver().expect("driver");
    let legacy = d
        .get_proc_address("cuStreamSynchronize", 2000, DefaultStream::Legacy)
        .unwrap();
    // The per-thread variant has its own ABI version, PFN_cuStreamSynchronize_v7000_ptsz; at
    // 2000 the driver has none (VERSION_NOT_SUFFICIENT), which the table's per-thread mode
    // accounts for (it asks for 7000).
    let too_early = d.get_proc_address("cuStreamSynchronize", 2000, DefaultStream::PerThread);
    println!("per-thread cuStreamSynchronize at 2000: {too_early:?}");
    assert!(too_early.is_err());
    let per_thread = d
        .get_proc_address("cuStreamSynchronize", 7000, DefaultStream::PerThread)
        .unwrap();
    println!("cuStreamSynchronize: legacy {legacy:p}, per-thread {per_thread:p}");
    assert_ne!(legacy, per_thread);
    // The table (loaded in legacy mode here) resolves the legacy variant.
    assert_eq!(d.default_stream(), DefaultStream::Legacy);
    let table = d.raw().cuStreamSynchronize().unwrap();
    assert_eq!(table as *mut std::ffi::c_void, legacy.as_ptr());
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_walk_over_the_whole_table_finds_nothing_missing_at_or_below_the_driver_version() {
    let d = driver().expect("driver");
    let (mut resolved, mut gated, mut missing) = (0, Vec::new(), Vec::new());
    for &f in Function::ALL {
        match d.resolve(f) {
            Ok(_) => resolved += 1,
            Err(Error::DriverTooOld { .. }) => gated.push(f.name()),
            Err(Error::SymbolMissing { reason, .. }) => {
                missing.push(format!("{} (v{}, {reason})", f.name(), f.info().version))
            }
            Err(e) => panic!("{}: {e}", f.name()),
        }
    }
    println!(
        "table walk on CUDA {}: {} entries, {resolved} resolved, {} gated (newer than the \
         driver), {} missing",
        d.version(),
        Function::ALL.len(),
        gated.len(),
        missing.len()
    );
    for m in &missing {
        println!("  missing: {m}");
    }
    assert_eq!(resolved + gated.len() + missing.len(), Function::ALL.len());
    // Gated: exactly the entries above the driver's version (a gate off by one, refusing the
    // entries at the driver's own version, passed this walk before).
    assert_gated_exactly_above(d.version().0 as u32, d.default_stream(), &gated);
    assert!(
        missing.is_empty(),
        "entries at or below the driver's version are missing"
    );
}

isolated_test! {
    /// Loaded with `CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM=1`, the table resolves the per-thread
    /// variants (at their own ABI versions) and they work.
    #[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
    fn the_table_resolves_and_calls_per_thread_variants_in_per_thread_mode(
        CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM = "1"
    ) {
        let d = driver().expect("driver");
        assert_eq!(d.default_stream(), DefaultStream::PerThread);
        let table = d.raw().cuStreamSynchronize().expect("per-thread cuStreamSynchronize");
        let per_thread = d
            .get_proc_address("cuStreamSynchronize", 7000, DefaultStream::PerThread)
            .unwrap();
        assert_eq!(table as *mut std::ffi::c_void, per_thread.as_ptr());
        let mut device = 0;
        let mut context = ptr::null_mut();
        // SAFETY: valid out-pointers; stream 0 is the calling thread's per-thread stream.
        unsafe {
            d.cuDeviceGet(&mut device, 0).unwrap();
            d.cuDevicePrimaryCtxRetain(&mut context, device).unwrap();
            d.cuCtxSetCurrent(context).unwrap();
            d.cuStreamSynchronize(ptr::null_mut()).unwrap();
            d.cuStreamQuery(ptr::null_mut()).unwrap();
        }
        // Variants without a per-thread twin, of functions with per-thread variants, have no
        // per-thread answer (`MissingReason::NoPerThreadVariant`); every other entry within the
        // driver's version resolves.
        let (mut resolved, mut gated, mut no_twin) = (0, Vec::new(), Vec::new());
        for &f in Function::ALL {
            let expect_no_twin = cuda_workspace::testing::lacks_per_thread_variant(f);
            match d.resolve(f) {
                Ok(_) => {
                    assert!(!expect_no_twin, "{}: resolved in per-thread mode", f.name());
                    resolved += 1
                }
                Err(Error::DriverTooOld { .. }) => gated.push(f.name()),
                Err(Error::SymbolMissing {
                    reason: MissingReason::NoPerThreadVariant,
                    ..
                }) if expect_no_twin => no_twin.push(f.name()),
                Err(e) => panic!("{}: {e}", f.name()),
            }
        }
        println!(
            "per-thread mode: cuStreamSynchronize -> {per_thread:p} (the _ptsz variant); table \
             walk: {resolved} resolved, {} gated, {} without a per-thread variant ({}), 0 \
             missing otherwise",
            gated.len(),
            no_twin.len(),
            no_twin.join(", ")
        );
        // Gated: exactly the entries whose per-thread ABI version is above the driver's.
        assert_gated_exactly_above(d.version().0 as u32, DefaultStream::PerThread, &gated);
    }
}
