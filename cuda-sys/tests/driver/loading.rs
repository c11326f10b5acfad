//! Loading the driver library: by explicit path and through `CUDA_DL_SYS_LIBRARY`, and each way a load
//! can fail (no library, not a driver, the toolkit's stub, `cuInit` failing). Every test runs in a
//! process of its own: the driver is loaded once per process.

use std::path::Path;
use std::sync::{Arc, Mutex};

use cuda_dl_sys::types::CUresult;
use cuda_dl_sys::{
    DEFAULT_NAMES, DefaultStream, Driver, DriverVersion, Error, LibraryOrigin, LoadOptions,
    ResolutionPath,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{expect_error, fake, fake_driver_path};

fn same_file(a: &Path, b: &Path) -> bool {
    a.canonicalize().ok() == b.canonicalize().ok()
}

isolated_test! {
    /// 16 threads asking for the driver at once: one of them loads it, every one gets the same
    /// `Driver`, and the library is initialised once.
    fn sixteen_threads_loading_at_once_share_one_driver(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let _ = fake(); // keeps the fake's counters alive across the load
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(16));
        let drivers: Vec<usize> = (0..16)
            .map(|_| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    std::ptr::from_ref(cuda_dl_sys::driver().unwrap()).addr()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        assert!(drivers.iter().all(|&d| d == drivers[0]), "one Driver for all");
        assert_eq!(fake().call_count("cuInit"), 1, "the library was initialised once");
    }

    /// `LoadOptions::with_library_path` opens that file, once; its version and path are reported.
    fn loads_the_library_at_an_explicit_path() {
        let path = fake_driver_path();
        // SAFETY: (for every load of this test) the fake driver implements the driver's C ABI
        // with cuda.h's signatures; the other paths are refused before anything is opened.
        let driver = unsafe { Driver::load(LoadOptions::with_library_path(&path)) }.unwrap();
        assert_eq!(driver.version(), DriverVersion(13000));
        assert!(same_file(driver.path(), &path), "{}", driver.path().display());
        assert_eq!(driver.default_stream(), DefaultStream::Legacy);
        assert_eq!(driver.resolution_path(), ResolutionPath::ProcAddressV2);

        // SAFETY: as above.
        let again = unsafe { Driver::load(LoadOptions::with_library_path(&path)) }.unwrap();
        assert!(std::ptr::eq(driver, again));
        assert!(std::ptr::eq(Driver::get().unwrap(), driver));
        assert!(std::ptr::eq(cuda_dl_sys::driver().unwrap(), driver));
        assert_eq!(fake().call_count("cuInit"), 1);
        assert_eq!(fake().call_count("cuDriverGetVersion"), 1);

        let per_thread = LoadOptions {
            library_path: Some(path.clone()),
            default_stream: DefaultStream::PerThread,
        };
        // The same library in the other default-stream mode is its other table, not an error;
        // the process's default stays the first load's.
        // SAFETY: as above.
        let other = unsafe { Driver::load(per_thread) }.unwrap();
        assert_eq!(other.default_stream(), DefaultStream::PerThread);
        assert!(std::ptr::eq(other, driver.per_thread()));
        assert!(std::ptr::eq(cuda_dl_sys::driver().unwrap(), driver));
        // SAFETY: as above.
        let err = expect_error(unsafe {
            Driver::load(LoadOptions::with_library_path("/elsewhere/libcuda.so.1"))
        });
        assert!(matches!(err, Error::AlreadyLoaded { .. }), "{err}");
        assert!(err.to_string().contains("/elsewhere/libcuda.so.1"), "{err}");
    }

    /// `cuda_dl_sys::driver()` opens the file `CUDA_DL_SYS_LIBRARY` names.
    fn loads_the_library_named_by_cuda_sys_library(CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
        let driver = cuda_dl_sys::driver().unwrap();
        assert!(same_file(driver.path(), &fake_driver_path()));
        assert_eq!(driver.version(), DriverVersion(13000));
        assert_eq!(driver.default_stream(), DefaultStream::Legacy);
    }

    /// The version is what `cuDriverGetVersion` says.
    fn reports_the_version_the_driver_gives(
        FAKE_CUDA_VERSION = "12040",
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
    ) {
        let version = cuda_dl_sys::driver().unwrap().version();
        assert_eq!(version, DriverVersion(12040));
        assert_eq!((version.major(), version.minor()), (12, 4));
        assert_eq!(version.to_string(), "12.4");
    }

    /// A `CUDA_DL_SYS_LIBRARY` path that does not exist: `LibraryNotFound` names it with the system
    /// loader's message, says that the variable is why only it was tried, and advises to fix or
    /// unset the variable (not to set it, which it is); the failure is not remembered, so a later
    /// load can succeed.
    fn a_bad_cuda_sys_library_path_is_reported_with_the_variable_to_fix(
        CUDA_DL_SYS_LIBRARY = "/nonexistent/libcuda.so.1",
    ) {
        let err = expect_error(cuda_dl_sys::driver());
        let Error::LibraryNotFound { tried, origin } = &err else {
            panic!("expected LibraryNotFound, got {err:?}");
        };
        assert_eq!(*origin, LibraryOrigin::Environment);
        assert_eq!(tried.len(), 1, "{tried:?}");
        assert_eq!(tried[0].candidate, "/nonexistent/libcuda.so.1");
        // libloading's message, then the system loader's own reason.
        assert!(tried[0].message.contains("No such file or directory"), "{tried:?}");
        let text = err.to_string();
        for needle in [
            "CUDA_DL_SYS_LIBRARY is set, so only the library it names was tried",
            "/nonexistent/libcuda.so.1",
            "No such file or directory",
            "Fix CUDA_DL_SYS_LIBRARY",
            "or unset it",
        ] {
            assert!(text.contains(needle), "{needle:?} not in: {text}");
        }
        assert!(!text.contains("set CUDA_DL_SYS_LIBRARY to the library's full path"), "{text}");
        assert!(Driver::get().is_none());
        assert!(matches!(cuda_dl_sys::driver(), Err(Error::LibraryNotFound { .. })));

        // SAFETY: the fake driver implements the driver's C ABI with cuda.h's signatures.
        let driver = unsafe { Driver::load(LoadOptions::with_library_path(fake_driver_path())) }
            .unwrap();
        assert!(std::ptr::eq(cuda_dl_sys::driver().unwrap(), driver));
    }

    /// `CUDA_DL_SYS_LIBRARY` naming a library that is not a driver: the same advice, with why.
    #[cfg(target_os = "linux")]
    fn a_cuda_sys_library_that_is_not_a_driver_is_reported_with_the_variable_to_fix(
        CUDA_DL_SYS_LIBRARY = "libm.so.6",
    ) {
        let err = expect_error(cuda_dl_sys::driver());
        let text = err.to_string();
        for needle in [
            "CUDA_DL_SYS_LIBRARY is set",
            "libm.so.6 (opened, but it is not a CUDA driver: no cuInit export)",
            "Fix CUDA_DL_SYS_LIBRARY",
        ] {
            assert!(text.contains(needle), "{needle:?} not in: {text}");
        }
    }

    /// An explicit path is the only candidate: the default names are not searched after it, and
    /// the error says the path given to `Driver::load` failed (no environment variable is at
    /// fault).
    fn an_explicit_path_is_the_only_candidate() {
        // SAFETY: no such file: nothing is opened.
        let err = expect_error(unsafe {
            Driver::load(LoadOptions::with_library_path("/nonexistent/libcuda.so"))
        });
        let text = err.to_string();
        let Error::LibraryNotFound { tried, origin } = err else {
            panic!("expected LibraryNotFound, got {err:?}");
        };
        assert_eq!(origin, LibraryOrigin::Given);
        let names: Vec<&str> = tried.iter().map(|a| a.candidate.as_str()).collect();
        assert_eq!(names, ["/nonexistent/libcuda.so"]);
        assert!(text.contains("the library path given to Driver::load"), "{text}");
        assert!(!text.contains("CUDA_DL_SYS_LIBRARY"), "{text}");
    }

    /// Without a path, the default names are tried in order. This machine may have no driver (an
    /// error naming every default name), the toolkit's stub, a driver without a GPU (`cuInit`
    /// fails), or a real driver: then `cuInit` succeeded, the version is a real one and the
    /// driver is the process's.
    fn without_a_path_the_default_names_are_tried_in_order() {
        // SAFETY: no path: the default names, as `cuda_dl_sys::driver()` searches them.
        match unsafe { Driver::load(LoadOptions::default()) } {
            Err(err @ Error::LibraryNotFound { .. }) => {
                let text = err.to_string();
                let Error::LibraryNotFound { tried, origin } = err else { unreachable!() };
                assert_eq!(origin, LibraryOrigin::DefaultNames);
                let names: Vec<&str> = tried.iter().map(|a| a.candidate.as_str()).collect();
                assert_eq!(names, DEFAULT_NAMES);
                assert!(tried.iter().all(|a| !a.message.is_empty()), "{tried:?}");
                for needle in ["Install the NVIDIA driver", "or set CUDA_DL_SYS_LIBRARY"] {
                    assert!(text.contains(needle), "{needle:?} not in: {text}");
                }
                assert!(Driver::get().is_none());
            }
            Ok(driver) => {
                // Loading returns a driver only once `cuInit(0)` and `cuDriverGetVersion`
                // succeeded; the version is the driver's own (CUDA 10.0 or newer).
                let version = driver.version();
                assert!(version.0 >= 10000, "implausible driver version {version:?}");
                assert!(version.major() >= 10, "{version:?}");
                if version.0 >= 12000 {
                    assert_eq!(driver.resolution_path(), ResolutionPath::ProcAddressV2);
                }
                assert_eq!(driver.default_stream(), DefaultStream::Legacy);
                assert!(!driver.path().as_os_str().is_empty());
                assert!(std::ptr::eq(Driver::get().unwrap(), driver));
            }
            Err(Error::StubLibrary { path, origin }) => {
                assert!(!path.as_os_str().is_empty());
                assert_eq!(origin, LibraryOrigin::DefaultNames);
                assert!(Driver::get().is_none());
            }
            // A driver without a usable GPU: the load stopped at `cuInit` (or the version query).
            Err(Error::Driver(e)) => {
                assert!(
                    matches!(e.function(), Some("cuInit" | "cuDriverGetVersion")),
                    "{e:?}"
                );
                assert!(Driver::get().is_none());
            }
            Err(e) => panic!("unexpected error: {e:?}"),
        }
    }

    /// A library without the driver's exports is skipped with a message that says so.
    #[cfg(target_os = "linux")]
    fn a_library_that_is_not_a_driver_is_reported() {
        // SAFETY: the C library's libm has sound initialisers and no `cuInit` export, so it is
        // refused before anything of it is called.
        let err = expect_error(unsafe { Driver::load(LoadOptions::with_library_path("libm.so.6")) });
        let Error::LibraryNotFound { tried, origin } = &err else {
            panic!("expected LibraryNotFound, got {err:?}");
        };
        assert_eq!(*origin, LibraryOrigin::Given);
        assert_eq!(tried.len(), 1);
        assert_eq!(tried[0].message, "opened, but it is not a CUDA driver: no cuInit export");
    }

    /// The toolkit's stub (`cuInit` returns 34) is named as such, with the fix: `CUDA_DL_SYS_LIBRARY`
    /// names it, so point the variable at the driver or unset it; nothing else was called. Once
    /// the stub behaviour stops, loading works (a failed load is not remembered).
    fn the_stub_library_is_reported_with_the_fix(
        FAKE_CUDA_STUB = "1",
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
    ) {
        // The loader closes a library it rejects; keep the fake mapped so its counters survive.
        let fake = fake();
        let err = expect_error(cuda_dl_sys::driver());
        let Error::StubLibrary { path, origin } = &err else {
            panic!("expected StubLibrary, got {err:?}");
        };
        assert!(same_file(path, &fake_driver_path()));
        assert_eq!(*origin, LibraryOrigin::Environment);
        let text = err.to_string();
        for needle in [
            "stub library",
            "CUDA_ERROR_STUB_LIBRARY",
            "CUDA_DL_SYS_LIBRARY names it: set CUDA_DL_SYS_LIBRARY to the NVIDIA driver's libcuda.so.1",
            "or unset it",
        ] {
            assert!(text.contains(needle), "{needle:?} not in: {text}");
        }
        assert_eq!(fake.call_count("cuInit"), 1);
        assert_eq!(fake.call_count("cuDriverGetVersion"), 0);

        fake.set_stub(false);
        assert_eq!(cuda_dl_sys::driver().unwrap().version(), DriverVersion(13000));
    }

    /// `cuInit` failing is a described driver error, and not remembered either.
    fn a_failing_cuinit_is_a_driver_error(
        FAKE_CUDA_FAIL = "cuInit=100",
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
    ) {
        // The loader closes the library after a failed cuInit, yet the error's name and
        // description point into it (see the report on cuda-dl-sys): keep it mapped meanwhile.
        let fake = fake();
        let err = expect_error(cuda_dl_sys::driver());
        let Error::Driver(e) = &err else {
            panic!("expected a driver error, got {err:?}");
        };
        assert_eq!(e.code(), CUresult::CUDA_ERROR_NO_DEVICE);
        assert_eq!(e.name(), "CUDA_ERROR_NO_DEVICE");
        assert_eq!(e.function(), Some("cuInit"));
        assert_eq!(e.description(), "no CUDA-capable device is detected");

        fake.clear_faults();
        cuda_dl_sys::driver().unwrap();
    }

    /// A load reached from inside the first load, on the thread loading (here from the fake's
    /// `cuInit`, through a hook; issue 38), is refused at once with `LoadReentered` instead of
    /// waiting for itself for ever. The first load goes on and succeeds; later calls get it.
    fn a_load_from_inside_the_first_load_is_an_error_not_a_hang(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
    ) {
        let inner: Arc<Mutex<Vec<Result<(), Error>>>> = Arc::default();
        let seen = inner.clone();
        fake().set_hook("cuInit", 1, move || {
            let by_env = cuda_dl_sys::driver().map(|_| ());
            // SAFETY: the fake driver implements the driver's C ABI with cuda.h's signatures.
            let by_path = unsafe { Driver::load(LoadOptions::with_library_path(fake_driver_path())) };
            seen.lock().unwrap().extend([by_env, by_path.map(|_| ())]);
        });
        let driver = cuda_dl_sys::driver().unwrap();
        let inner = inner.lock().unwrap();
        assert_eq!(inner.len(), 2, "the hook ran");
        for result in inner.iter() {
            match result {
                Err(err @ Error::LoadReentered) => {
                    assert!(err.to_string().contains("a load cannot wait for itself"), "{err}");
                }
                other => panic!("expected LoadReentered, got {other:?}"),
            }
        }
        assert_eq!(fake().call_count("cuInit"), 1);
        assert!(std::ptr::eq(cuda_dl_sys::driver().unwrap(), driver));
    }

    /// A process forked while its parent loads the driver (here from the fake's `cuInit`, on the
    /// loading thread) cannot finish that load: in the child, `driver()` returns
    /// `ForkedDuringLoad` at once instead of waiting for ever for a loader it does not have. The
    /// parent's load goes on.
    #[cfg(target_os = "linux")]
    fn a_child_forked_during_the_first_load_gets_an_error_not_a_hang(
        CUDA_DL_SYS_LIBRARY = fake_driver_path(),
    ) {
        let status: Arc<Mutex<Option<i32>>> = Arc::default();
        let seen = status.clone();
        fake().set_hook("cuInit", 1, move || {
            // SAFETY: the child calls only `driver()` (which, fixed, takes an unlocked mutex and
            // returns) and `_exit`; the parent waits for it.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // A child that hangs (the fault this test is about) is killed after a minute,
                // not left behind; one that works exits at once.
                // SAFETY: alarm and _exit have no preconditions.
                unsafe { libc::alarm(60) };
                let code = match cuda_dl_sys::driver() {
                    Err(Error::ForkedDuringLoad) => 0,
                    Ok(_) => 1,
                    Err(_) => 2,
                };
                // SAFETY: as above.
                unsafe { libc::_exit(code) };
            }
            let mut wstatus = 0;
            // SAFETY: `pid` is this process's child; `wstatus` a valid place.
            let waited = unsafe { libc::waitpid(pid, &mut wstatus, 0) };
            assert_eq!(waited, pid);
            *seen.lock().unwrap() = Some(wstatus);
        });
        cuda_dl_sys::driver().unwrap();
        let wstatus = status.lock().unwrap().expect("the hook forked");
        assert!(
            libc::WIFEXITED(wstatus) && libc::WEXITSTATUS(wstatus) == 0,
            "the child did not get ForkedDuringLoad: wait status {wstatus:#x} (exit 1: it loaded, \
             2: another error, SIGALRM: it hung)"
        );
    }

    /// The same file under another name is the driver already loaded (issue 38): after the fake
    /// was loaded through a `libcuda.so.1` link, its own path and the folder's `libcuda.so` give
    /// the same `Driver`, as does adopting it, and `path()` is the file the links lead to. A copy
    /// of the file is another file: still `AlreadyLoaded`.
    #[cfg(target_os = "linux")]
    fn the_same_file_under_another_name_is_the_driver_already_loaded() {
        let real = fake_driver_path().canonicalize().unwrap();
        let folder = std::env::temp_dir()
            .join(format!("cuda-dl-sys-same-file-{}", std::process::id()));
        let folder = fake_cuda::steer::libcuda_folder(&real, &folder).unwrap();
        let load = |path: &Path| {
            // SAFETY: each path is the fake driver (which implements the driver's C ABI with
            // cuda.h's signatures), a link to it or a copy of it.
            unsafe { Driver::load(LoadOptions::with_library_path(path)) }
        };
        let driver = load(&folder.join("libcuda.so.1")).unwrap();
        for other in [real.clone(), folder.join("libcuda.so")] {
            let again = load(&other).unwrap_or_else(|e| panic!("{}: {e}", other.display()));
            assert!(std::ptr::eq(again, driver), "{}", other.display());
        }
        assert_eq!(driver.path(), real, "path() follows the link");
        // SAFETY: the fake driver, opened under a link's name.
        let library = unsafe { libloading::Library::new(folder.join("libcuda.so")) }.unwrap();
        // SAFETY: as above.
        let adopted = unsafe { Driver::adopt(library, "libcuda.so", DefaultStream::Legacy) };
        assert!(std::ptr::eq(adopted.unwrap(), driver));

        let copy = folder.join("libcuda.so.580.00");
        std::fs::copy(&real, &copy).unwrap();
        let err = expect_error(load(&copy));
        assert!(matches!(err, Error::AlreadyLoaded { .. }), "{err}");
        assert!(err.to_string().contains("libcuda.so.580.00"), "{err}");
        let _ = std::fs::remove_dir_all(&folder);
    }
}
