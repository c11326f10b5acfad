//! Resolving table entries: a symbol the driver lacks, the default-stream flag reaching
//! `cuGetProcAddress`, and many threads resolving at once.

use std::ptr;
use std::sync::{Arc, Barrier};

use cuda_dl_sys::types::CUstream;
use cuda_dl_sys::{
    DefaultStream, Driver, DriverLibrary, DriverVersion, Error, Function, LibraryKind,
    LibraryOrigin, LoadOptions, MissingReason, ResolutionPath,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    current_primary_context, expect_error, fake, fake_driver_path, load_fake_driver,
};

fn assert_missing(err: &Error, path: ResolutionPath) {
    match err {
        Error::SymbolMissing {
            function,
            required,
            reason,
            library,
            ..
        } => {
            assert_eq!(*function, "cuStreamQuery");
            assert_eq!(*required, 2000);
            assert_eq!(*reason, MissingReason::NotFound, "via {path:?}");
            let library = library.as_ref().expect("the loaded library is named");
            assert_eq!(library.kind, LibraryKind::OtherName);
            assert_eq!(library.origin, LibraryOrigin::Given);
        }
        other => panic!("expected SymbolMissing, got {other:?}"),
    }
    // The fake is not NVIDIA's driver: the message names it and says it lacks the function,
    // instead of advising a driver upgrade that would not help.
    let text = err.to_string();
    let fake_path = Driver::get().unwrap().path().display().to_string();
    for needle in [
        format!("the loaded library {fake_path} (reporting CUDA "),
        ") lacks cuStreamQuery (ABI version 2.0)".to_string(),
        "That library is not NVIDIA's driver (its file name is not libcuda.so*)".to_string(),
        "use a library that provides cuStreamQuery, or load the NVIDIA driver (libcuda.so.1) \
         instead"
            .to_string(),
    ] {
        assert!(text.contains(&needle), "{needle:?} not in: {text}");
    }
    assert!(!text.contains("Upgrade"), "{text}");
}

/// The fake under the driver's file name: `<folder>/libcuda.so.1`, a link to it.
#[cfg(target_os = "linux")]
fn fake_named_libcuda() -> std::path::PathBuf {
    let fake = fake_driver_path();
    let folder = fake.parent().unwrap().join("fake-named-libcuda");
    fake_cuda::steer::libcuda_folder(&fake, &folder)
        .unwrap()
        .join("libcuda.so.1")
}

/// `cuStreamQuery` is missing, the answer is cached, and `cuStreamSynchronize` is unaffected.
fn missing_symbol_is_reported_and_cached(path: ResolutionPath) {
    let driver = load_fake_driver();
    assert_eq!(driver.resolution_path(), path);
    let _context = current_primary_context(driver);
    let mut stream: CUstream = ptr::null_mut();
    // SAFETY: `stream` is a valid out-pointer.
    unsafe { driver.cuStreamCreate(&mut stream, 0).unwrap() };

    let lookups = || fake().proc_address_calls(1) + fake().proc_address_calls(2);
    assert_missing(&expect_error(driver.raw().cuStreamQuery()), path);
    let after_first = lookups();
    assert_missing(&expect_error(driver.raw().cuStreamQuery()), path);
    // SAFETY: `stream` is live; the call is refused before the driver is reached anyway.
    assert_missing(
        &unsafe { driver.cuStreamQuery(stream) }.unwrap_err().into(),
        path,
    );
    assert_eq!(
        lookups(),
        after_first,
        "a cached answer was looked up again"
    );
    assert_eq!(fake().call_count("cuStreamQuery"), 0);

    // SAFETY: `stream` is live.
    unsafe {
        driver.cuStreamSynchronize(stream).unwrap();
        driver.cuStreamDestroy(stream).unwrap();
    }
}

/// The table resolves `cuStreamSynchronize` for `mode`: the flag `cuGetProcAddress` saw, the
/// pointer (the per-thread one differs from the legacy one), and the export stream 0 reaches.
fn resolves_for_mode(driver: &Driver, mode: DefaultStream) {
    assert_eq!(driver.default_stream(), mode);
    let per_thread = mode == DefaultStream::PerThread;
    let table = driver.raw().cuStreamSynchronize().unwrap() as usize;
    assert_eq!(
        fake().last_proc_address_flags(),
        if per_thread { 2 } else { 1 }
    );
    // The per-thread variant is asked for at its own ABI version (PFN_..._v7000_ptsz).
    assert_eq!(
        fake().last_proc_address_version(),
        if per_thread { 7000 } else { 2000 }
    );

    let lookup = |mode| {
        let version = if mode == DefaultStream::PerThread {
            7000
        } else {
            2000
        };
        driver
            .get_proc_address("cuStreamSynchronize", version, mode)
            .unwrap()
            .addr()
            .get()
    };
    // As on the real driver: the per-thread variant does not exist at 2000.
    assert!(matches!(
        driver.get_proc_address("cuStreamSynchronize", 2000, DefaultStream::PerThread),
        Err(Error::SymbolMissing {
            reason: MissingReason::VersionNotSufficient,
            ..
        })
    ));
    let (legacy, per_thread_fn) = (
        lookup(DefaultStream::Legacy),
        lookup(DefaultStream::PerThread),
    );
    assert_ne!(legacy, per_thread_fn);
    assert_eq!(table, if per_thread { per_thread_fn } else { legacy });
    assert_eq!(Some(legacy), fake().export_address("cuStreamSynchronize"));
    assert_eq!(
        Some(per_thread_fn),
        fake().export_address("cuStreamSynchronize_ptsz")
    );

    // A function with no per-thread variant resolves to the same function in both modes.
    let create = |mode| {
        driver
            .get_proc_address("cuStreamCreate", 2000, mode)
            .unwrap()
    };
    assert_eq!(
        create(DefaultStream::Legacy),
        create(DefaultStream::PerThread)
    );

    let _context = current_primary_context(driver);
    // SAFETY: stream 0 of the current context.
    unsafe { driver.cuStreamSynchronize(ptr::null_mut()).unwrap() };
    assert_eq!(
        fake().call_count("cuStreamSynchronize_ptsz"),
        u64::from(per_thread)
    );
    assert_eq!(fake().call_count("cuStreamSynchronize"), 1);
}

isolated_test! {
    /// `FAKE_CUDA_MISSING=cuStreamQuery` on a 13.0 driver: `SymbolMissing`, cached.
    fn a_symbol_the_driver_lacks_is_missing_and_others_still_work(
        FAKE_CUDA_MISSING = "cuStreamQuery",
    ) {
        missing_symbol_is_reported_and_cached(ResolutionPath::ProcAddressV2);
    }

    /// The same through the 11.3–11.8 `cuGetProcAddress`, which answers `CUDA_ERROR_NOT_FOUND`.
    fn a_symbol_an_11_8_driver_lacks_is_missing_too(
        FAKE_CUDA_MISSING = "cuStreamQuery",
        FAKE_CUDA_VERSION = "11080",
    ) {
        missing_symbol_is_reported_and_cached(ResolutionPath::ProcAddress);
    }

    /// A symbol missing from the library `CUDA_DL_SYS_LIBRARY` names, which is not NVIDIA's driver:
    /// the advice is to point the variable at the driver or unset it.
    fn a_symbol_missing_from_a_cuda_sys_library_that_is_not_the_driver_names_the_variable(
        FAKE_CUDA_MISSING = "cuStreamQuery",
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
    ) {
        let driver = cuda_dl_sys::driver().unwrap();
        let err = expect_error(driver.raw().cuStreamQuery());
        let text = err.to_string();
        for needle in [
            "That library is not NVIDIA's driver",
            "or set CUDA_DL_SYS_LIBRARY to the NVIDIA driver's libcuda.so.1 or unset it",
        ] {
            assert!(text.contains(needle), "{needle:?} not in: {text}");
        }
    }

    /// The same symbol missing from a library under the driver's file name, with the lookups its
    /// version promises (here the fake, linked as `libcuda.so.1`): that is NVIDIA's driver as far
    /// as can be told, and the advice is to upgrade it.
    #[cfg(target_os = "linux")]
    fn a_symbol_missing_from_a_library_named_as_the_driver_advises_an_upgrade(
        FAKE_CUDA_MISSING = "cuStreamQuery",
        CUDA_DL_SYS_LIBRARY = fake_named_libcuda(),
    ) {
        let driver = cuda_dl_sys::driver().unwrap();
        // The file itself, the link followed; the kind is judged by the name the loader found.
        let file = fake_driver_path().canonicalize().unwrap();
        assert_eq!(driver.path(), file);
        let err = expect_error(driver.raw().cuStreamQuery());
        let Error::SymbolMissing { library: Some(library), .. } = &err else {
            panic!("expected SymbolMissing naming the library, got {err:?}");
        };
        assert_eq!(
            *library,
            DriverLibrary {
                path: file.clone(),
                kind: LibraryKind::NvidiaDriver,
                origin: LibraryOrigin::Environment,
            }
        );
        let text = err.to_string();
        let expected = format!(
            "the installed driver (CUDA 13.0, {}) does not provide cuStreamQuery (ABI version \
             2.0): cuGetProcAddress found no such symbol. Upgrade the NVIDIA driver, or do without \
             this function",
            file.display()
        );
        assert_eq!(text, expected);
    }

    /// `CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM=1` asks for the per-thread variants.
    fn per_thread_mode_from_the_environment(
        CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM = "1",
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
    ) {
        resolves_for_mode(cuda_dl_sys::driver().unwrap(), DefaultStream::PerThread);
    }

    /// `LoadOptions::default_stream` does the same.
    fn per_thread_mode_from_load_options() {
        let options = LoadOptions {
            library_path: Some(fake_driver_path()),
            default_stream: DefaultStream::PerThread,
        };
        // SAFETY: the fake driver implements the driver's C ABI with cuda.h's signatures.
        let driver = unsafe { Driver::load(options) }.unwrap();
        resolves_for_mode(driver, DefaultStream::PerThread);
    }

    /// By default the legacy variants are asked for.
    fn legacy_mode_is_the_default() {
        resolves_for_mode(load_fake_driver(), DefaultStream::Legacy);
    }

    /// 16 threads making their first call at once, of four different functions and then all of
    /// the same one, each get the pointer the driver gives for that entry.
    fn sixteen_threads_resolving_at_once_get_the_right_pointers() {
        let driver = load_fake_driver();
        assert_eq!(driver.version(), DriverVersion(13000));
        let expected = |f: Function| {
            let info = f.info();
            driver
                .get_proc_address(info.symbol.to_str().unwrap(), info.version, driver.default_stream())
                .unwrap()
                .addr()
                .get()
        };
        let race = |functions: &[Function]| {
            let barrier = Arc::new(Barrier::new(16));
            let threads: Vec<_> = (0..16)
                .map(|i| {
                    let barrier = barrier.clone();
                    let f = functions[i % functions.len()];
                    std::thread::spawn(move || {
                        let driver = Driver::get().unwrap();
                        barrier.wait();
                        let p = if f == Function::cuStreamSynchronize {
                            driver.raw().cuStreamSynchronize().unwrap() as usize
                        } else {
                            driver.resolve(f).unwrap().addr().get()
                        };
                        (f, p)
                    })
                })
                .collect();
            for thread in threads {
                let (f, p) = thread.join().unwrap();
                assert_eq!(p, expected(f), "{f}");
            }
        };
        race(&[
            Function::cuStreamSynchronize,
            Function::cuLaunchHostFunc,
            Function::cuMemAlloc,
            Function::cuStreamGetCaptureInfo,
        ]);
        race(&[Function::cuEventQuery]);
        assert_eq!(
            driver.resolve(Function::cuStreamGetCaptureInfo).unwrap().addr().get(),
            fake().export_address("cuStreamGetCaptureInfo_v3").unwrap()
        );
    }

    /// The first outcome cached wins (issue 38): a thread's lookup of an entry starts while the
    /// slot is empty; before it gets its answer, another thread resolves the entry and caches the
    /// function; then the first lookup fails with a transient `CUDA_ERROR_NOT_FOUND`. The function
    /// stays cached: both threads get it, and so does every later call. Made deterministic with
    /// the fake's hook at the start of the first lookup.
    fn a_failing_lookup_never_replaces_a_function_another_thread_cached(
        FAKE_CUDA_VERSION = "11080",
    ) {
        // 11.8: cuGetProcAddress (v1), where NOT_FOUND is how a lookup says "no such symbol".
        let driver = load_fake_driver();
        let function = Function::cuStreamQuery;
        let export = fake().export_address("cuStreamQuery").unwrap();
        let other = std::sync::Arc::new(std::sync::Mutex::new(None));
        let seen = other.clone();
        fake().set_hook("cuGetProcAddress", 1, move || {
            // Another thread resolves the same entry first, and caches it.
            let got = std::thread::spawn(move || {
                driver.resolve(function).map(|p| p.addr().get()).map_err(|e| e.to_string())
            })
            .join()
            .unwrap();
            *seen.lock().unwrap() = Some(got);
            // Then this lookup (its hook runs before its fault) fails.
            fake().set_fault("cuGetProcAddress", 1, 500);
        });
        let first = driver.resolve(function).map(|p| p.addr().get());
        assert_eq!(*other.lock().unwrap(), Some(Ok(export)), "the other thread resolved it");
        assert_eq!(fake().call_count("cuGetProcAddress"), 2, "both threads looked it up");
        assert_eq!(first.unwrap(), export, "the failed lookup returned the cached function");
        for _ in 0..2 {
            assert_eq!(driver.resolve(function).unwrap().addr().get(), export);
        }
        assert_eq!(fake().call_count("cuGetProcAddress"), 2, "later calls use the cache");
    }
}
