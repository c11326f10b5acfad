//! Adopting a library the caller opened (issue 23, item 4): `Driver::adopt` (unsafe) makes it the
//! process's driver, in the mode asked; adopting the same file again returns the same tables.

use cuda_dl_sys::{DefaultStream, Driver, DriverVersion, Error};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{fake, fake_driver_path};

isolated_test! {
    fn an_adopted_library_becomes_the_process_driver(FAKE_CUDA_VERSION = "12040") {
        let path = fake_driver_path();
        // SAFETY: the fake driver's initialisers are sound to run in this process.
        let library = unsafe { libloading::Library::new(&path) }.unwrap();
        // SAFETY: the fake driver implements the driver's C ABI with cuda.h's signatures.
        let driver = unsafe { Driver::adopt(library, &path, DefaultStream::PerThread) }.unwrap();
        assert_eq!(driver.version(), DriverVersion(12040));
        assert_eq!(driver.default_stream(), DefaultStream::PerThread);
        assert!(std::ptr::eq(cuda_dl_sys::driver().unwrap(), driver));
        assert_eq!(fake().call_count("cuInit"), 1);

        // SAFETY: as above.
        let again = unsafe { libloading::Library::new(&path) }.unwrap();
        // SAFETY: as above.
        let legacy = unsafe { Driver::adopt(again, "again", DefaultStream::Legacy) }.unwrap();
        assert!(std::ptr::eq(legacy, driver.legacy()));
        assert_eq!(fake().call_count("cuInit"), 1);
    }

    fn adopting_a_library_without_the_driver_exports_is_refused() {
        // The process's own global namespace (`dlopen(NULL)`): no driver in it, so no cuInit.
        let this = libloading::Library::from(libloading::os::unix::Library::this());
        // SAFETY: refused before anything of it is called (no cuInit export).
        let err = unsafe { Driver::adopt(this, "this test", DefaultStream::Legacy) }.unwrap_err();
        assert!(matches!(err, Error::LibraryNotFound { .. }), "{err}");
        assert!(err.to_string().contains("no cuInit export"), "{err}");
    }
}
