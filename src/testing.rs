//! Support for the tests that run against the fake CUDA driver (`tests/fake-cuda`).
//!
//! - [`fake_driver_path`] finds the fake driver (a `cdylib` that `cargo test` builds because this
//!   package depends on it), and [`load_fake_driver`] loads it as the process's driver.
//! - [`fake`] reaches the fake's `fake_cuda_*` control functions through [`FakeCuda`], the fake's
//!   own typed API (`fake_cuda::steer`, re-exported here): fault injection, hooks, call counters,
//!   holds (stand-ins for long-running kernels, [`Hold`]), sticky errors; [`wait_until`] polls
//!   for what the fake's threads do.
//! - [`owners`]: for the `cuda-host-launch` tests: the process's primary context, owners that
//!   record where and when they are dropped ([`Drops`]), and where a host function ran;
//!   [`drop_counts`]: one counter per owner for load tests ([`DropCounts`]); [`probe`]: a counting
//!   host function and its owners ([`Probe`]); [`thread_set`]: the threads that ran host functions
//!   or dropped owners ([`ThreadSet`]). The last three serve the GPU tests as well.
//!   [`created_context`]: a context made with `cuCtxCreate` and a stream of it.
//! - [`in_own_process`] and [`isolated_test!`](crate::isolated_test) run a test in a process of its
//!   own, with its own environment: the driver is loaded once per process and reads its
//!   configuration (`CUDA_DL_SYS_*`, `FAKE_CUDA_*`) once, so a test that needs a particular driver
//!   version, a stub or a fault from the first call on needs a fresh process.
//!
//! Test support, not library code: a failure panics with a message, which fails the test.
//!
//! ```no_run
//! use cuda_workspace::isolated_test;
//! use cuda_workspace::testing::{fake, fake_driver_path};
//!
//! isolated_test! {
//!     /// A driver reporting 11.8 resolves through `cuGetProcAddress` (v1).
//!     fn old_driver_uses_v1(FAKE_CUDA_VERSION = "11080", CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
//!         let driver = cuda_dl_sys::driver().unwrap();
//!         assert_eq!(driver.version().0, 11080);
//!         assert_eq!(fake().proc_address_calls(2), 0);
//!     }
//! }
//! # fn main() {}
//! ```

pub mod created_context;
pub mod drop_counts;
pub mod owners;
pub mod probe;
pub mod thread_set;
pub mod torture;

pub use created_context::CreatedContext;
pub use drop_counts::{CountedOwner, DropCounts};
pub use owners::{
    DropRecord, Drops, Owner, PATIENCE, REAPER_NAME, RanOn, ThreadInfo, assert_reset_released,
    fake_primary_context, thread_states, threads_named,
};
pub use probe::{Probe, address_bytes, bump, bump_from_bytes};
pub use thread_set::{ThreadSet, thread_id};

use std::ffi::OsStr;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUcontext, CUdevice};
use cuda_dl_sys::{Driver, LoadOptions};

/// The fake driver library built beside the running test or example ([`fake_cuda::steer::locate`]:
/// `FAKE_CUDA_LIBRARY`, else the binary's folder, its `deps/` or `../deps/`).
///
/// # Panics
/// If it is not there (build it with `cargo test`, or `cargo build -p fake-cuda` into the same
/// target folder).
pub fn fake_driver_path() -> PathBuf {
    fake_cuda::steer::locate().unwrap_or_else(|e| {
        panic!(
            "{e}. It is built by `cargo test` (the root package depends on tests/fake-cuda); \
             otherwise run `cargo build -p fake-cuda` with the same target folder"
        )
    })
}

/// Loads the fake driver as this process's driver (legacy default stream), or returns it if it is
/// already loaded.
///
/// # Panics
/// If it cannot be loaded, or another driver was loaded first.
pub fn load_fake_driver() -> &'static Driver {
    // SAFETY: the fake driver implements the driver's C ABI with cuda.h's signatures, as its tests
    // check; it is built with this workspace.
    unsafe { Driver::load(LoadOptions::with_library_path(fake_driver_path())) }
        .unwrap_or_else(|e| panic!("the fake CUDA driver did not load: {e}"))
}

/// The calling thread as the operating system knows it: its id and name.
///
/// Threads the fake driver starts belong to the fake's own copy of the Rust standard library, so
/// `std::thread::current()` in a test knows neither their name nor their id (just as for the real
/// driver's C threads); ask the system instead. On Linux the name is cut to 15 bytes
/// (`fake-cuda-drive` for the fake's `fake-cuda-driver-<n>` threads).
pub fn os_thread() -> (String, String) {
    #[cfg(target_os = "linux")]
    {
        let id = std::fs::read_link("/proc/thread-self")
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let name = std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default();
        (id, name.trim_end().to_string())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let thread = std::thread::current();
        (
            format!("{:?}", thread.id()),
            thread.name().unwrap_or("").to_string(),
        )
    }
}

/// The error of `result`, which must be one. (`Result::unwrap_err` needs `T: Debug`, which
/// [`Driver`] is not.)
///
/// # Panics
/// If `result` is `Ok`.
#[track_caller]
pub fn expect_error<T>(result: Result<T, cuda_dl_sys::Error>) -> cuda_dl_sys::Error {
    match result {
        Ok(_) => panic!("expected an error, got Ok"),
        Err(e) => e,
    }
}

/// Retains device 0's primary context and makes it current on the calling thread.
///
/// # Panics
/// If the driver refuses.
pub fn current_primary_context(driver: &Driver) -> CUcontext {
    let mut device: CUdevice = 0;
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: both out-pointers are valid locals; the handles come from the driver.
    unsafe {
        driver.cuDeviceGet(&mut device, 0).expect("cuDeviceGet");
        driver
            .cuDevicePrimaryCtxRetain(&mut context, device)
            .expect("cuDevicePrimaryCtxRetain");
        driver.cuCtxSetCurrent(context).expect("cuCtxSetCurrent");
    }
    context
}

/// The fake driver's control functions (`fake_cuda::steer`, the fake's own typed API over its
/// `fake_cuda_*` exports), with the guard of a held stream and the calls of one export name.
pub use fake_cuda::steer::{ExportCalls, FakeCuda, Hold};

/// The fake's control functions, opened once per process from [`fake_driver_path`]: the system
/// loader hands back the copy already mapped, so these see the state the driver calls change.
///
/// The first call also keeps the fake mapped when the driver loader rejects it and closes its
/// handle (a stub, a failing `cuInit`): call it first in such tests, or the fake's state goes with
/// it.
///
/// # Panics
/// If the fake library cannot be found or opened.
pub fn fake() -> &'static FakeCuda {
    static FAKE: OnceLock<FakeCuda> = OnceLock::new();
    FAKE.get_or_init(|| FakeCuda::open(&fake_driver_path()).unwrap_or_else(|e| panic!("{e}")))
}

/// A panic's message (`&str` or `String` payloads), or `<non-string panic>`.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<non-string panic>".into())
}

/// Whether `function` is an ABI variant without a per-thread twin of a function that has per-thread
/// variants: the per-thread table lacks it on every driver (`MissingReason::NoPerThreadVariant`).
pub fn lacks_per_thread_variant(function: cuda_dl_sys::Function) -> bool {
    let info = function.info();
    info.per_thread_export.is_none()
        && cuda_dl_sys::Function::ALL
            .iter()
            .any(|g| g.info().symbol == info.symbol && g.info().per_thread_export.is_some())
}

/// The ABI version a table of `mode` asks the driver for when it resolves `function`: in the
/// per-thread table, the per-thread variant's own where the entry has one; else the entry's.
/// (The version gate refuses the entry as `DriverTooOld` exactly when this is above the driver's.)
pub fn required_version(function: cuda_dl_sys::Function, mode: cuda_dl_sys::DefaultStream) -> u32 {
    let info = function.info();
    match (mode, info.per_thread_export, info.per_thread_version) {
        (cuda_dl_sys::DefaultStream::PerThread, Some(_), Some(version)) => version,
        _ => info.version,
    }
}

/// Checks that `gated`, the names of the entries that a walk over the table of `mode` found
/// `DriverTooOld` (in `Function::ALL`'s order), are exactly those whose [`required_version`] is
/// above `version`, the driver's: first their number, then their names. A gate off by one (the
/// entries at the driver's own version refused, or those just above it let through) fails here
/// with the entries it got wrong.
///
/// # Panics
/// If they differ.
#[track_caller]
pub fn assert_gated_exactly_above(version: u32, mode: cuda_dl_sys::DefaultStream, gated: &[&str]) {
    let above: Vec<&str> = cuda_dl_sys::Function::ALL
        .iter()
        .filter(|&&f| required_version(f, mode) > version)
        .map(|f| f.name())
        .collect();
    let at_version = cuda_dl_sys::Function::ALL
        .iter()
        .filter(|&&f| required_version(f, mode) == version)
        .count();
    assert_eq!(
        gated.len(),
        above.len(),
        "{mode:?} table on {version}: {} entries gated, {} above the driver ({at_version} at its \
         version); gated but not above: {:?}; above but not gated: {:?}",
        gated.len(),
        above.len(),
        gated
            .iter()
            .filter(|g| !above.contains(g))
            .collect::<Vec<_>>(),
        above
            .iter()
            .filter(|a| !gated.contains(a))
            .collect::<Vec<_>>(),
    );
    assert_eq!(gated, above, "{mode:?} table on {version}");
}

/// Keeps the panics a test provokes on purpose off stderr: from now on, in the whole process, a
/// panic whose message `expected` accepts prints nothing; others print as before.
pub fn quiet_expected_panics(expected: fn(&str) -> bool) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !expected(&panic_text(info.payload())) {
            default(info);
        }
    }));
}

/// Polls `future` on the calling thread (parking between polls, 5 ms at most, until its waker
/// unparks it) until it resolves or `limit` passes: its output, or `None`. What user code in
/// the torture harnesses does when it awaits a future of the crate.
pub fn resolves_within<F: std::future::Future>(future: F, limit: Duration) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let mut future = std::pin::pin!(future);
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return Some(output);
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::park_timeout((deadline - now).min(Duration::from_millis(5)));
    }
}

/// Waits until `done()` holds (polling it every millisecond), or panics after `timeout` with
/// `what`.
///
/// # Panics
/// If `done()` still does not hold after `timeout`.
#[track_caller]
pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The environment variable that tells a re-executed test binary which test it is to run itself.
pub const ISOLATED_TEST_ENV: &str = "CUDA_WORKSPACE_ISOLATED_TEST";

/// How long an isolated test may run before it is killed: `CUDA_WORKSPACE_TEST_TIMEOUT_SECS`, or
/// 120 seconds.
fn child_timeout() -> Duration {
    let secs = std::env::var("CUDA_WORKSPACE_TEST_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    Duration::from_secs(secs)
}

/// Whether the environment variable is one the driver or the fake reads, which an isolated test
/// must not inherit by accident.
pub(crate) fn driver_variable(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with("CUDA_DL_SYS_") || name.starts_with("FAKE_CUDA_")
}

/// Runs `body` in a process of its own with `envs` set (and no other `CUDA_DL_SYS_*` or
/// `FAKE_CUDA_*` variable), and fails if it fails.
///
/// The test binary runs itself again with `<test_name> --exact --nocapture --test-threads=1` and
/// [`ISOLATED_TEST_ENV`] set to `test_name`; in that child, this same call sees the marker and
/// runs `body`. `test_name` must be the test's full path in its binary (`module::name`, without
/// the crate name): [`isolated_test!`](crate::isolated_test) gets it right by construction. The parent shows the child's
/// output if it fails, and kills it after two minutes (`CUDA_WORKSPACE_TEST_TIMEOUT_SECS`).
///
/// # Panics
/// In the parent, if the child fails, times out, or did not run exactly that test.
pub fn in_own_process<K, V>(test_name: &str, envs: &[(K, V)], body: impl FnOnce())
where
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    if std::env::var_os(ISOLATED_TEST_ENV).is_some_and(|marker| marker == test_name) {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the path of the running test binary");
    let mut command = Command::new(&exe);
    command
        .args([
            test_name,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, _) in std::env::vars_os().filter(|(name, _)| driver_variable(name)) {
        command.env_remove(name);
    }
    command.env(ISOLATED_TEST_ENV, test_name);
    for (name, value) in envs {
        command.env(name, value);
    }
    let (status, stdout, stderr) = match run_with_timeout(command, child_timeout()) {
        Ok((status, stdout, stderr)) => (Some(status), stdout, stderr),
        Err(why) => (None, String::new(), why),
    };
    let ran_it = stdout.contains("running 1 test") && stdout.contains(" 1 passed");
    let verdict = match status {
        None => Some(format!("timed out after {:?}", child_timeout())),
        Some(status) if !status.success() => Some(format!("failed ({status})")),
        Some(_) if !ran_it => {
            Some("did not run exactly this test (is the name its full path in the binary?)".into())
        }
        Some(_) => None,
    };
    if let Some(verdict) = verdict {
        panic!(
            "isolated test {test_name:?} {verdict}; env {:?}\n--- child stdout ---\n{stdout}\n--- child \
             stderr ---\n{stderr}",
            envs.iter()
                .map(|(k, v)| format!("{}={}", k.as_ref().display(), v.as_ref().display()))
                .collect::<Vec<_>>()
        );
    }
    print!("{stdout}");
    eprint!("{stderr}");
}

/// Runs `command` with its stdout and stderr captured, killing it after `timeout`. Returns its
/// status and output, or why it did not finish (with what it printed until then).
///
/// # Errors
/// If it cannot be started, or it ran past `timeout`.
pub fn run_with_timeout(
    mut command: Command,
    timeout: Duration,
) -> Result<(std::process::ExitStatus, String, String), String> {
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        Some(status) => Ok((status, stdout, stderr)),
        None => Err(format!(
            "timed out after {timeout:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        )),
    }
}

/// The path libtest knows a test by: `module_path` without the crate name, then `name`.
pub fn test_path(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_crate, rest)) => format!("{rest}::{name}"),
        None => name.to_string(),
    }
}

/// Defines a `#[test]` that runs in a process of its own (see [`in_own_process`]), with the
/// environment variables written as its "parameters":
///
/// ```no_run
/// # use cuda_workspace::isolated_test;
/// # use cuda_workspace::testing::fake_driver_path;
/// isolated_test! {
///     /// The stub is recognised.
///     fn stub_is_reported(FAKE_CUDA_STUB = "1", CUDA_DL_SYS_LIBRARY = fake_driver_path()) {
///         assert!(cuda_dl_sys::driver().is_err());
///     }
/// }
/// # fn main() {}
/// ```
///
/// Each value is any expression with `AsRef<OsStr>`, evaluated in the parent process.
#[macro_export]
macro_rules! isolated_test {
    ($(
        $(#[$attr:meta])*
        fn $name:ident($($key:ident = $value:expr),* $(,)?) $body:block
    )*) => {$(
        $(#[$attr])*
        #[test]
        fn $name() {
            let envs: &[(&str, ::std::ffi::OsString)] = &[$((
                stringify!($key),
                ::std::ffi::OsString::from(::std::convert::AsRef::<::std::ffi::OsStr>::as_ref(&$value)),
            )),*];
            $crate::testing::in_own_process(
                &$crate::testing::test_path(module_path!(), stringify!($name)),
                envs,
                || $body,
            );
        }
    )*};
}

#[cfg(test)]
mod tests {
    use super::test_path;

    #[test]
    fn test_paths_drop_the_crate_name() {
        assert_eq!(test_path("driver_loading", "loads"), "loads");
        assert_eq!(test_path("driver_loading::inner", "loads"), "inner::loads");
    }
}
