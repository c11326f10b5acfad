//! A fixture for other crates' tests: the fake driver set up once per process, one test at a time
//! steering it, and its steering reset after each.
//!
//! ```no_run
//! use fake_cuda::fixture;
//!
//! #[test]
//! fn a_failed_allocation_is_reported() {
//!     let fake = fixture::lock(); // loads the fake once; waits for other tests that steer it
//!     let driver = fake.driver(); // cuda-dl-sys, loaded from the fake (also `cuda_dl_sys::driver()`)
//!     fake.primary_context().unwrap(); // device 0's primary context, current on this thread
//!     fake.set_fault("cuMemAlloc", 1, 2); // the next cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY
//!     let mut dptr = 0;
//!     // SAFETY: a valid out-pointer.
//!     assert!(unsafe { driver.cuMemAlloc(&mut dptr, 256) }.is_err());
//! } // the guard drops: faults, hooks and every other setting as they were at load
//! # fn main() {}
//! ```
//!
//! # The fake's settings are process-wide
//!
//! A process loads the fake once, and everything a test can steer belongs to that one copy:
//! faults ([`FakeCuda::set_fault`]), hooks ([`FakeCuda::set_hook`]), missing symbols, the version
//! and device count, stub mode, holds, hidden capture queries, reused context handles, the thread
//! whose calls are counted, and the call counters. Cargo runs the tests of one binary as threads
//! of one process, in parallel: a fault one test sets hits the next matching call of *any* test
//! running then. So every test that steers the fake (or reads its counters) takes [`lock`]: the
//! guard it returns keeps other such tests waiting until it drops, then puts the steering back as
//! it was at load ([`FakeCuda::reset_steering`]). Tests that only use the driver, without steering
//! or counting, need not take it: [`driver`] loads the fake as [`lock`] does, without the turn.
//! The driver's own objects (contexts, streams, memory, a sticky
//! error) are not reset: they are the tests' to clean up, and [`LiveObjects`] checks that they
//! did.
//!
//! What the fake reads at load (`FAKE_CUDA_VERSION`, `FAKE_CUDA_STUB`, ... from the first driver
//! call on) needs a process of its own: [`ChildTest`] runs a test in one, configured by
//! [`Config`], and is also how a binding that opens `libcuda.so` by name
//! (cudarc) gets the fake.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};

use cuda_dl_sys::types::CUcontext;
use cuda_dl_sys::{Driver, LoadOptions};

use crate::steer::{self, Config, FakeCuda, FakeError};

/// The fake and the driver loaded from it, once per process.
struct Loaded {
    fake: FakeCuda,
    driver: &'static Driver,
}

/// Set once the first [`try_lock`] has loaded the fake.
static LOADED: OnceLock<Loaded> = OnceLock::new();

/// The one turn to steer the fake (see the module's documentation).
static TURN: Mutex<()> = Mutex::new(());

/// Held while the fake is loaded, so that one thread loads it (apart from [`TURN`]: loading does
/// not wait for a test that steers).
static LOADING: Mutex<()> = Mutex::new(());

/// Loads the fake: [`steer::locate`], then its control functions, then `cuda-dl-sys`'s driver from
/// it (with the default-stream mode `CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM` asks for).
fn load() -> Result<Loaded, FakeError> {
    let path = steer::locate()?;
    // First, so that the fake stays mapped even if the driver loader rejects it.
    let fake = FakeCuda::open(&path)?;
    let refused = |e: cuda_dl_sys::Error| FakeError::Open {
        path: path.clone(),
        message: format!("cuda-dl-sys did not load it as the driver: {e}"),
    };
    let options = LoadOptions {
        library_path: Some(path.clone()),
        ..LoadOptions::from_env().map_err(refused)?
    };
    // SAFETY: the fake implements the driver's C ABI with cuda.h's signatures (this crate's
    // conformance suite checks it against the real driver); it is the library `locate` found.
    let driver = unsafe { Driver::load(options) }.map_err(refused)?;
    Ok(Loaded { fake, driver })
}

/// The fake and its driver, loaded on the first call of the process (by this or [`try_lock`]).
fn loaded() -> Result<&'static Loaded, FakeError> {
    if let Some(loaded) = LOADED.get() {
        return Ok(loaded);
    }
    let _loading = relock(&LOADING);
    match LOADED.get() {
        Some(loaded) => Ok(loaded),
        None => {
            // Under `LOADING`, so no other thread loads meanwhile; a failure leaves it unset.
            let _ = LOADED.set(load()?);
            LOADED
                .get()
                .ok_or(FakeError::NotFound { tried: Vec::new() })
        }
    }
}

/// The fake, loaded once for the process, and the turn to steer it: waits until no other test
/// holds it. The call counters start at 0; when the guard drops, the steering is reset.
///
/// # Errors
/// [`FakeError`] if the fake cannot be found or opened, or `cuda-dl-sys` cannot load it (another
/// driver was loaded first, or the environment asks for the stub). Nothing is remembered: a later
/// call tries again.
pub fn try_lock() -> Result<Locked, FakeError> {
    let turn = relock(&TURN);
    let loaded = loaded()?;
    loaded.fake.reset_call_counts();
    Ok(Locked {
        loaded,
        _turn: turn,
    })
}

/// The driver, as `cuda-dl-sys` loaded it from the fake (loaded on the first call of the process,
/// as [`try_lock`] does), **without** the turn to steer it: for a test that only uses the driver
/// (or code that calls `cuda_dl_sys::driver()`, which returns the same driver once this loaded it)
/// and neither steers the fake nor reads its counters. It runs beside the tests that hold the
/// turn, and meets their faults and hooks if it makes the calls they aim at: a test that must not,
/// takes [`lock`] instead.
///
/// ```no_run
/// #[test]
/// fn a_stream_can_be_made() {
///     let driver = fake_cuda::fixture::driver(); // no turn: other tests run beside this one
///     let mut context = std::ptr::null_mut();
///     // SAFETY: valid out-pointers.
///     unsafe { driver.cuDevicePrimaryCtxRetain(&mut context, 0) }.unwrap();
///     // ...
/// }
/// # fn main() {}
/// ```
///
/// # Errors
/// As [`try_lock`]'s.
pub fn try_driver() -> Result<&'static Driver, FakeError> {
    Ok(loaded()?.driver)
}

/// [`try_driver`], for a test.
///
/// # Panics
/// If the fake cannot be loaded, with what to do about it.
pub fn driver() -> &'static Driver {
    try_driver().unwrap_or_else(|e| panic!("fake_cuda::fixture: {e}"))
}

/// [`try_lock`], for a test.
///
/// # Panics
/// If the fake cannot be loaded, with what to do about it.
pub fn lock() -> Locked {
    try_lock().unwrap_or_else(|e| panic!("fake_cuda::fixture: {e}"))
}

fn relock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The turn to steer the fake ([`lock`]): dereferences to its control functions
/// ([`FakeCuda`]); dropping it resets the steering and lets the next test go.
pub struct Locked {
    loaded: &'static Loaded,
    _turn: MutexGuard<'static, ()>,
}

impl fmt::Debug for Locked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locked")
            .field("path", &self.loaded.fake.path())
            .finish()
    }
}

impl Deref for Locked {
    type Target = FakeCuda;

    fn deref(&self) -> &FakeCuda {
        &self.loaded.fake
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        self.loaded.fake.reset_steering();
    }
}

impl Locked {
    /// The driver, as `cuda-dl-sys` loaded it from the fake (the process's driver: `cuda_dl_sys::driver()`
    /// returns it too).
    pub fn driver(&self) -> &'static Driver {
        self.loaded.driver
    }

    /// Device 0's primary context, made current on the calling thread. It is retained once for the
    /// process (a test must not release it).
    ///
    /// # Errors
    /// The driver's, if it refuses (a fault the test set, say).
    pub fn primary_context(&self) -> Result<CUcontext, cuda_dl_sys::Error> {
        static RETAINED: OnceLock<usize> = OnceLock::new();
        let driver = self.driver();
        let context = match RETAINED.get() {
            Some(context) => *context,
            None => {
                let mut context = std::ptr::null_mut();
                // SAFETY: a valid out-pointer; device 0 exists unless the test said otherwise.
                unsafe { driver.cuDevicePrimaryCtxRetain(&mut context, 0) }?;
                *RETAINED.get_or_init(|| context.expose_provenance())
            }
        };
        let context: CUcontext = std::ptr::with_exposed_provenance_mut(context);
        // SAFETY: a context handle the driver gave.
        unsafe { driver.cuCtxSetCurrent(context) }?;
        Ok(context)
    }

    /// Every kind of live driver object, now (see [`LiveObjects`]).
    pub fn live_objects_now(&self) -> LiveObjects {
        LiveObjects::of(self)
    }
}

/// The kinds [`FakeCuda::live_objects`] counts.
pub const LIVE_KINDS: &[&str] = &[
    "contexts",
    "primary_retains",
    "streams",
    "events",
    "graphs",
    "graph_execs",
    "graph_nodes",
    "user_objects",
    "holds",
    "host_registrations",
    "device_allocations",
    "host_allocations",
];

/// How many objects of each kind (see [`LIVE_KINDS`]) were alive at one moment: take one before
/// the code under test and one after, and [`grown_since`](Self::grown_since) is what it leaked.
///
/// Memory freed with `cuMemFreeAsync` counts until the stream gets to the free, and host
/// functions still pending hold what they own: synchronize before taking the second. Code that
/// uses `cuda-host-launch` keeps a batch of events and a primary-context retain in its event
/// poller for a while after its last work: take the second after `cuda_host_launch::quiesce`,
/// which gives them back (its `flush` does not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveObjects(BTreeMap<&'static str, u64>);

impl LiveObjects {
    /// The counts now.
    pub fn of(fake: &FakeCuda) -> LiveObjects {
        LiveObjects(
            LIVE_KINDS
                .iter()
                .map(|kind| (*kind, fake.live_objects(kind)))
                .collect(),
        )
    }

    /// The count of `kind` (0 for a kind not in [`LIVE_KINDS`]).
    pub fn get(&self, kind: &str) -> u64 {
        self.0.get(kind).copied().unwrap_or(0)
    }

    /// The kinds with more live objects now than in `before`: `(kind, before, now)`.
    pub fn grown_since(&self, before: &LiveObjects) -> Vec<(&'static str, u64, u64)> {
        self.0
            .iter()
            .filter_map(|(kind, now)| {
                let then = before.get(kind);
                (*now > then).then_some((*kind, then, *now))
            })
            .collect()
    }
}

impl fmt::Display for LiveObjects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (kind, n) in self.0.iter().filter(|(_, n)| **n > 0) {
            write!(f, "{}{kind}: {n}", if first { "" } else { ", " })?;
            first = false;
        }
        if first {
            write!(f, "nothing")?;
        }
        Ok(())
    }
}

/// The environment variable that marks the child process of a [`ChildTest`], naming its test.
pub const CHILD_ENV: &str = "FAKE_CUDA_CHILD_TEST";

/// A test that runs in a process of its own, against a fake configured at load: for what the fake
/// reads once ([`Config`]: version, stub, missing symbols, faults from the first call), and for
/// bindings that open the driver by name (cudarc opens `libcuda.so`): the child's loader path
/// starts with a folder where `libcuda.so` and `libcuda.so.1` are the fake
/// ([`steer::libcuda_folder`]). `cuda-dl-sys` (`CUDA_DL_SYS_LIBRARY`) and [`steer::locate`]
/// (`FAKE_CUDA_LIBRARY`) find the same file there, so every binding shares one fake driver.
///
/// ```no_run
/// use fake_cuda::fixture::ChildTest;
/// use fake_cuda::steer::Config;
///
/// #[test]
/// fn works_on_a_cuda_12_4_driver() {
///     let config = Config { version: Some(12040), ..Config::default() };
///     ChildTest::new("works_on_a_cuda_12_4_driver").config(config).run(|| {
///         // In the child: a binding that opens libcuda.so by name gets the fake.
///     });
/// }
/// # fn main() {}
/// ```
#[derive(Debug, Clone)]
pub struct ChildTest {
    test: String,
    config: Config,
    envs: Vec<(OsString, OsString)>,
}

impl ChildTest {
    /// The test `test`: its full path in its test binary, as `cargo test -- --list` shows it
    /// (`module::name`, or just `name` at the top of an integration-test file).
    pub fn new(test: &str) -> ChildTest {
        ChildTest {
            test: test.to_string(),
            config: Config::default(),
            envs: Vec::new(),
        }
    }

    /// The fake's configuration at load, in the child.
    pub fn config(mut self, config: Config) -> ChildTest {
        self.config = config;
        self
    }

    /// One more environment variable for the child.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> ChildTest {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Whether this process is the child of this test.
    pub fn is_child(&self) -> bool {
        std::env::var_os(CHILD_ENV).is_some_and(|marker| marker == *self.test)
    }

    /// In the child, runs `body`. In the parent, runs this test binary again as the child
    /// (`<test> --exact --nocapture --test-threads=1`) and waits for it.
    ///
    /// # Panics
    /// In the parent, if the fake cannot be found or linked, or the child fails or did not run
    /// exactly this one test (is the name its full path?), with the child's output.
    pub fn run(self, body: impl FnOnce()) {
        if self.is_child() {
            body();
            return;
        }
        let out = self
            .command()
            .and_then(|mut command| command.output().map_err(FakeError::Io))
            .unwrap_or_else(|e| panic!("fake_cuda::fixture::ChildTest {:?}: {e}", self.test));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let ran_it = stdout.contains("running 1 test") && stdout.contains(" 1 passed");
        assert!(
            out.status.success() && ran_it,
            "child test {:?} {} ({})\n--- child stdout ---\n{stdout}\n--- child stderr ---\n{stderr}",
            self.test,
            if out.status.success() {
                "did not run exactly this one test (is the name its full path in the binary?)"
            } else {
                "failed"
            },
            out.status,
        );
    }

    /// The child's command line and environment.
    fn command(&self) -> Result<Command, FakeError> {
        let library = steer::locate()?;
        let folder = libcuda_folder(&library)?;
        let exe = std::env::current_exe().map_err(FakeError::Io)?;
        let mut search = OsString::from(folder.as_os_str());
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
            search.push(":");
            search.push(old);
        }
        let mut command = Command::new(exe);
        command
            .args([&self.test, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &self.test)
            .env("LD_LIBRARY_PATH", search)
            .env(steer::LIBRARY_ENV, &library)
            .env("CUDA_DL_SYS_LIBRARY", &library);
        self.config.apply(&mut command);
        command.envs(self.envs.iter().map(|(k, v)| (k, v)));
        Ok(command)
    }
}

/// `fake-libcuda/` beside `library`, holding the `libcuda.so` links ([`steer::libcuda_folder`]),
/// made once per process.
fn libcuda_folder(library: &Path) -> Result<PathBuf, FakeError> {
    static FOLDER: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut folder = relock(&FOLDER);
    if let Some(folder) = folder.as_ref() {
        return Ok(folder.clone());
    }
    let parent = library.parent().unwrap_or(Path::new("."));
    let made = steer::libcuda_folder(library, &parent.join("fake-libcuda"))?;
    *folder = Some(made.clone());
    Ok(made)
}
