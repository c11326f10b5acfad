//! Launches host functions in stream order and shows which thread ran them and which thread
//! released their owners.
//!
//! `cargo run -p quickstart`. On a machine with an NVIDIA driver it uses the GPU; where no driver is
//! installed it says so and runs against the workspace's fake driver (a test double that runs host
//! functions on its own "driver" thread, but no kernels), which building this package builds. Any
//! other failure to load the driver (a mistyped `CUDA_DL_SYS_*` variable, say) stops it with the
//! reason: it never falls back to the fake where a driver is present.
//!
//! A package of its own, with no dev-dependencies, so that this first command builds only the two
//! crates and the fake driver.

use std::process::ExitCode;
use std::sync::mpsc::{Sender, channel};
use std::time::Duration;

use cuda_dl_sys::{Driver, LoadOptions};
use cuda_host_launch::{Device, PrimaryContext, Stream, flush, host_launch, launch_host_function};

/// An owner that reports, when dropped, which thread dropped it.
struct Owner {
    label: String,
    report: Sender<String>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = self.report.send(format!(
            "owner of {} released on {}",
            self.label,
            thread_name()
        ));
    }
}

fn thread_name() -> String {
    let t = std::thread::current();
    format!(
        "{:?} ({})",
        t.id(),
        t.name().unwrap_or("unnamed: the driver's thread")
    )
}

unsafe extern "C" fn c_host_function(data: *mut std::ffi::c_void) {
    // SAFETY: `data` points at the `Sender` owned by this launch's owners, alive until we return.
    let report = unsafe { &*data.cast::<Sender<String>>() };
    let _ = report.send(format!("C host function ran on {}", thread_name()));
}

/// Whether `error`, from loading the driver, says that no driver is installed: only then does the
/// quickstart run on the fake. Any other error (a typo in `CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM`,
/// a `CUDA_DL_SYS_LIBRARY` that names no driver, a driver that refuses to start) stops it with its
/// own message: on a GPU machine it must not switch to the fake unnoticed.
fn no_driver_installed(error: &cuda_dl_sys::Error) -> bool {
    matches!(
        error,
        cuda_dl_sys::Error::LibraryNotFound {
            origin: cuda_dl_sys::LibraryOrigin::DefaultNames,
            ..
        }
    )
}

fn open_driver() -> Result<&'static Driver, Box<dyn std::error::Error>> {
    match cuda_dl_sys::driver() {
        Ok(driver) => {
            println!(
                "Using the NVIDIA driver at {} (CUDA {}).",
                driver.path().display(),
                driver.version()
            );
            Ok(driver)
        }
        Err(e) if no_driver_installed(&e) => {
            // The fake is built with this package (a dependency), into target/<profile>/deps/,
            // where `locate` looks from the executable's folder.
            let fake = fake_cuda::steer::locate()
                .map_err(|not_found| format!("no NVIDIA driver ({e}), and {not_found}"))?;
            println!(
                "No NVIDIA driver was found, so this runs on the workspace's fake driver ({}), a \
                 test double: host functions run on its stand-in driver thread; nothing runs on a \
                 GPU.\n  (The search: {e})",
                fake.display()
            );
            // The fake's options as the environment gives them (its default-stream mode), but
            // its path.
            let options = LoadOptions {
                library_path: Some(fake),
                ..LoadOptions::from_env()?
            };
            // SAFETY: the fake driver implements the driver's C ABI with cuda.h's signatures; it
            // is built with this workspace.
            Ok(unsafe { Driver::load(options) }?)
        }
        Err(e) => Err(format!("cannot use the CUDA driver: {e}").into()),
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    open_driver()?;
    let device = Device::get(0)?;
    println!("Device 0: {}", device.name()?);
    let context = PrimaryContext::retain(device)?;
    let stream = Stream::new(&context)?;
    let (report, messages) = channel();
    println!("main thread: {}", thread_name());

    for i in 0..3 {
        let owner = Owner {
            label: format!("closure {i}"),
            report: report.clone(),
        };
        let tell = report.clone();
        host_launch(&stream, move || {
            let _ = &owner; // the closure's captures are its owners
            let _ = tell.send(format!("closure {i} ran on {}", thread_name()));
        })?;
    }
    let sender = Box::new(report.clone());
    let data = (&*sender as *const Sender<String>).cast_mut().cast();
    let owners = (
        sender,
        Owner {
            label: "the C host function".into(),
            report: report.clone(),
        },
    );
    // SAFETY: `c_host_function` only reads the Sender that `owners` keeps alive until it returns.
    unsafe { launch_host_function(&stream, Some(c_host_function), data, owners)? };

    stream.synchronize()?;
    flush(Duration::from_secs(5))?;
    drop(report);
    for message in messages.try_iter() {
        println!("  {message}");
    }
    println!("Every owner was released after its function ran, off the driver's thread.");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart failed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_dl_sys::LibraryOrigin;

    fn not_found(origin: LibraryOrigin) -> cuda_dl_sys::Error {
        cuda_dl_sys::Error::LibraryNotFound {
            tried: Vec::new(),
            origin,
        }
    }

    #[test]
    fn only_a_missing_driver_falls_back_to_the_fake() {
        assert!(no_driver_installed(&not_found(LibraryOrigin::DefaultNames)));
        // A path the user named is a mistake to report, not a missing driver.
        assert!(!no_driver_installed(&not_found(LibraryOrigin::Environment)));
        assert!(!no_driver_installed(&not_found(LibraryOrigin::Given)));
        let typo = cuda_dl_sys::Error::InvalidEnvironment {
            variable: "CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM",
            value: "ture".into(),
            expected: "1 or 0",
        };
        assert!(!no_driver_installed(&typo));
    }

    #[test]
    fn a_mistyped_variable_stops_it_with_the_reason() {
        // SAFETY: the only test of this binary that reads or writes the environment.
        unsafe { std::env::set_var("CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM", "ture") };
        let message = open_driver()
            .expect_err("a typo must not load a driver")
            .to_string();
        assert!(
            message.contains("CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM=\"ture\" is not understood"),
            "{message}"
        );
    }
}
