//! How a conformance case runs: against which driver, in a process of its own, and what a listed
//! difference means.
//!
//! - `CONFORMANCE_DRIVER` selects the driver: unset or `fake` for the fake (`tests/fake-cuda`,
//!   through `CUDA_DL_SYS_LIBRARY`), `real` for the installed NVIDIA driver (`cuda-dl-sys`'s default
//!   names: `libcuda.so.1`). The GPU bundle's runner sets `real`.
//! - Each case runs in a process of its own (the driver is loaded once per process, and a case
//!   may poison its context), with device 0's primary context current ([`Cx`]).
//! - Each case states the behaviour the fake models. On the fake every case must pass. On the
//!   real driver a case must pass unless `differences.txt` lists it; a listed case must fail
//!   there (else the list is stale and the case fails, saying so).

use std::ffi::{OsString, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{CUcontext, CUdevice, CUdeviceptr, CUresult, CUstream};
use cuda_workspace::testing::{
    fake, fake_driver_path, in_own_process, os_thread, panic_text, test_path,
};

/// The environment variable that selects the driver.
pub const DRIVER_ENV: &str = "CONFORMANCE_DRIVER";

/// The list of known differences, `case-name: reason` per line.
pub const DIFFERENCES: &str = include_str!("differences.txt");

/// How long a case waits for something that should happen.
pub const WAIT: Duration = Duration::from_secs(10);

/// A pause long enough for the driver to have run anything that was runnable.
pub const SETTLE: Duration = Duration::from_millis(50);

/// The driver a case runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `tests/fake-cuda`.
    Fake,
    /// The installed NVIDIA driver.
    Real,
}

/// The driver `CONFORMANCE_DRIVER` asks for.
///
/// # Panics
/// On a value other than `fake` or `real`.
pub fn target() -> Target {
    match std::env::var(DRIVER_ENV).as_deref() {
        Err(_) | Ok("" | "fake") => Target::Fake,
        Ok("real") => Target::Real,
        Ok(other) => panic!("{DRIVER_ENV}={other:?}: expected `fake` or `real`"),
    }
}

/// A case `differences.txt` lists.
#[derive(Debug, Clone, Copy)]
pub struct Listed {
    /// The case's name.
    pub name: &'static str,
    /// Why the drivers differ.
    pub reason: &'static str,
    /// Marked `[not run]`: not run on the real driver at all (it may hang or deadlock there), so
    /// reported as not run rather than checked to fail.
    pub not_run: bool,
}

/// What `differences.txt` says of `case`, if it lists it.
pub fn listed(case: &str) -> Option<Listed> {
    differences().find(|listed| listed.name == case)
}

/// Every case of `differences.txt`: `case-name: reason` or `case-name [not run]: reason` (blank
/// lines and `#` comments skipped).
///
/// # Panics
/// On a line that is neither.
pub fn differences() -> impl Iterator<Item = Listed> {
    DIFFERENCES
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| match line.split_once(':') {
            Some((name, reason)) if !reason.trim().is_empty() => {
                let (name, not_run) = match name.trim().strip_suffix("[not run]") {
                    Some(name) => (name.trim(), true),
                    None => (name.trim(), false),
                };
                Listed {
                    name,
                    reason: reason.trim(),
                    not_run,
                }
            }
            _ => panic!("differences.txt: {line:?} is not `case-name: reason`"),
        })
}

/// Defines conformance cases: each a `#[test]` that runs `body` with a [`Cx`] in a process of its
/// own, against the driver [`target`] selects.
macro_rules! cases {
    ($(
        $(#[$attr:meta])*
        fn $name:ident($cx:ident) $body:block
    )*) => {$(
        $(#[$attr])*
        #[test]
        fn $name() {
            $crate::conformance::harness::run(module_path!(), stringify!($name), |$cx| $body);
        }
    )*};
}
pub(crate) use cases;

/// Runs the case `name` (of `module`) in a process of its own.
pub fn run(module: &str, name: &str, body: impl FnOnce(&Cx)) {
    let envs: Vec<(&str, OsString)> = match target() {
        Target::Fake => vec![("CUDA_DL_SYS_LIBRARY", fake_driver_path().into_os_string())],
        Target::Real => Vec::new(),
    };
    in_own_process(&test_path(module, name), &envs, || run_here(name, body));
}

fn run_here(name: &str, body: impl FnOnce(&Cx)) {
    let cx = Cx::open();
    match (cx.target, listed(name)) {
        (Target::Fake, _) | (Target::Real, None) => body(&cx),
        (
            Target::Real,
            Some(Listed {
                reason,
                not_run: true,
                ..
            }),
        ) => {
            println!("{name}: not run on the real driver, as listed ({reason})");
        }
        (Target::Real, Some(Listed { reason, .. })) => {
            // Expected to fail: keep its panic message off stderr, and report it.
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let outcome = catch_unwind(AssertUnwindSafe(|| body(&cx)));
            std::panic::set_hook(hook);
            match outcome {
                Ok(()) => panic!(
                    "{name} is listed in tests/conformance/differences.txt ({reason}) but passes \
                     on the real driver: the fake and the driver agree now, remove the line"
                ),
                Err(payload) => println!(
                    "{name}: differs on the real driver, as listed ({reason}): {}",
                    panic_text(&*payload)
                ),
            }
        }
    }
}

/// What a case works with: the driver, device 0 and its primary context (retained once, current
/// on the case's thread), and host-mapped words for holds and value writes.
pub struct Cx {
    /// The loaded driver.
    pub driver: &'static Driver,
    /// Which one it is.
    pub target: Target,
    /// Device 0.
    pub device: CUdevice,
    /// Device 0's primary context, current on the case's thread.
    pub context: CUcontext,
    words: Words,
}

/// A page of host-mapped `u32`s (`cuMemHostAlloc` with `DEVICEMAP | PORTABLE`), handed out one by
/// one and never freed (a case runs in a process of its own).
struct Words {
    host: *mut AtomicU32,
    device: CUdeviceptr,
    next: AtomicUsize,
}

const WORDS: usize = 1024;

/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP`.
pub const MAPPED: u32 = 0x01 | 0x02;

impl Cx {
    fn open() -> Cx {
        let target = target();
        if target == Target::Fake {
            // Keeps the fake's state mapped for its control functions.
            let _ = fake();
        }
        let driver = cuda_dl_sys::driver().unwrap_or_else(|e| panic!("no driver: {e}"));
        let is_fake = driver.path().to_string_lossy().contains("fake_cuda");
        assert_eq!(
            is_fake,
            target == Target::Fake,
            "{DRIVER_ENV} asks for {target:?}, but the driver loaded is {}",
            driver.path().display()
        );
        let (mut device, mut context) = (0, ptr::null_mut());
        let mut host = ptr::null_mut();
        let mut mapped = 0;
        // SAFETY: valid out-pointers; the context is current before the allocation.
        unsafe {
            driver.cuDeviceGet(&mut device, 0).expect("cuDeviceGet");
            driver
                .cuDevicePrimaryCtxRetain(&mut context, device)
                .expect("cuDevicePrimaryCtxRetain");
            driver.cuCtxSetCurrent(context).expect("cuCtxSetCurrent");
            driver
                .cuMemHostAlloc(&mut host, WORDS * 4, MAPPED)
                .expect("cuMemHostAlloc");
            ptr::write_bytes(host.cast::<u8>(), 0, WORDS * 4);
            driver
                .cuMemHostGetDevicePointer(&mut mapped, host, 0)
                .expect("cuMemHostGetDevicePointer");
        }
        Cx {
            driver,
            target,
            device,
            context,
            words: Words {
                host: host.cast(),
                device: mapped,
                next: AtomicUsize::new(0),
            },
        }
    }

    /// A fresh host-mapped word, zero.
    pub fn word(&self) -> Word {
        let index = self.words.next.fetch_add(1, Ordering::Relaxed);
        assert!(index < WORDS, "out of mapped words");
        Word {
            // SAFETY: `index` is within the page, which is never freed; `AtomicU32` has the layout
            // of the `u32` there.
            host: unsafe { &*self.words.host.add(index) },
            device: self.words.device + 4 * index as CUdeviceptr,
        }
    }

    /// A new stream of the current context (`flags` 0: blocking).
    pub fn stream(&self) -> CUstream {
        let mut stream = ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { self.driver.cuStreamCreate(&mut stream, 0) }.expect("cuStreamCreate");
        stream
    }

    /// Blocks `stream` until the hold is released: a `cuStreamWaitValue32` on a mapped word (the
    /// stand-in for a long-running kernel, the same on both drivers).
    pub fn hold(&self, stream: CUstream) -> Hold {
        let word = self.word();
        // SAFETY: a live stream; the word is mapped and 4-aligned.
        unsafe {
            self.driver
                .cuStreamWaitValue32(stream, word.device, 1, WAIT_GEQ)
        }
        .expect("cuStreamWaitValue32");
        Hold { word }
    }

    /// Gives the current context a sticky error, as a trapping kernel does, through `stream`:
    /// on the fake through its control function, on the real driver with the test kernels'
    /// `trap_now`; then synchronizes `stream`, which returns the error (it has surfaced).
    pub fn sticky_error(&self, stream: CUstream) {
        self.trap().fire(stream);
    }

    /// What [`Cx::sticky_error`] needs, made ready now: on the real driver the test kernels'
    /// module is loaded here (a module load may wait for the context's streams, so a case that
    /// holds one loads it first).
    pub fn trap(&self) -> Trap<'_> {
        let kernels = match self.target {
            Target::Fake => None,
            Target::Real => Some(cuda_workspace::gpu::Kernels::load_current(self.driver)),
        };
        Trap { cx: self, kernels }
    }

    /// The address `dlsym` finds for `export` in the loaded driver library.
    pub fn export_address(&self, export: &str) -> Option<usize> {
        static LIBRARY: OnceLock<libloading::Library> = OnceLock::new();
        let library = LIBRARY.get_or_init(|| {
            // SAFETY: the driver is already loaded from this path; opening it again only takes a
            // reference.
            unsafe { libloading::Library::new(self.driver.path()) }.expect("the driver library")
        });
        let name = std::ffi::CString::new(export).expect("a symbol name");
        // SAFETY: the address is only compared, never called.
        let symbol = unsafe { library.get::<*mut c_void>(name.as_bytes_with_nul()) };
        symbol.ok().map(|s| s.addr())
    }
}

/// `CU_STREAM_WAIT_VALUE_GEQ`.
pub const WAIT_GEQ: u32 = 0;

/// A host-mapped `u32`: the host side as an atomic, the device side as an address.
#[derive(Clone, Copy)]
pub struct Word {
    /// The host's view.
    pub host: &'static AtomicU32,
    /// The device's view.
    pub device: CUdeviceptr,
}

/// A stream blocked until [`Hold::release`] (or the drop) writes 1 to its word.
pub struct Hold {
    word: Word,
}

impl Hold {
    /// Lets the stream continue.
    pub fn release(&self) {
        self.word.host.store(1, Ordering::Release);
    }

    /// A copy of the release, for another thread.
    pub fn releaser(&self) -> impl FnOnce() + Send + 'static {
        let word = self.word.host;
        move || word.store(1, Ordering::Release)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.release();
    }
}

/// The code of a failed call, `None` for success.
///
/// # Panics
/// On an error that is not a driver result code.
pub fn code(result: Result<(), impl Into<cuda_dl_sys::Error>>) -> Option<CUresult> {
    result.err().map(|e| {
        let e = e.into();
        e.code()
            .unwrap_or_else(|| panic!("not a driver error: {e}"))
    })
}

/// Waits until `done()` holds.
///
/// # Panics
/// After [`WAIT`], naming `what`.
#[track_caller]
pub fn wait_until(what: &str, done: impl FnMut() -> bool) {
    cuda_workspace::testing::wait_until(what, WAIT, done);
}

/// `value` as a host function's `userData`.
pub fn data<T>(value: &T) -> *mut c_void {
    ptr::from_ref(value).cast_mut().cast()
}

/// Leaks `value`: what host functions and callbacks point at lives to the end of the case's
/// process, whatever the driver does with them.
pub fn leak<T>(value: T) -> &'static T {
    Box::leak(Box::new(value))
}

/// A log of what host functions did: `(tag, the OS thread it ran on)`.
#[derive(Default)]
pub struct Log(Mutex<Vec<(u8, String)>>);

impl Log {
    /// The tags, in order.
    pub fn tags(&self) -> Vec<u8> {
        self.entries().into_iter().map(|(tag, _)| tag).collect()
    }

    /// The entries, in order.
    pub fn entries(&self) -> Vec<(u8, String)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until it holds `n` entries.
    #[track_caller]
    pub fn wait_for(&self, n: usize) -> Vec<(u8, String)> {
        wait_until(&format!("{n} host functions"), || self.entries().len() >= n);
        self.entries()
    }
}

/// One tag for one log: the `userData` of [`log_tag`].
pub struct Tagged {
    /// Where to log.
    pub log: &'static Log,
    /// What.
    pub tag: u8,
}

impl Tagged {
    /// A leaked `Tagged`, as `userData`.
    pub fn data(log: &'static Log, tag: u8) -> *mut c_void {
        data(leak(Tagged { log, tag }))
    }
}

/// A host function: logs its [`Tagged`]'s tag and the thread it runs on.
///
/// # Safety
/// `data` points at a live [`Tagged`].
pub unsafe extern "C" fn log_tag(data: *mut c_void) {
    // SAFETY: the caller's promise.
    let tagged = unsafe { &*data.cast::<Tagged>() };
    let entry = (tagged.tag, os_thread().0);
    tagged
        .log
        .0
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(entry);
}

/// A raw handle (stream, event, graph...) that a case hands to another thread.
#[derive(Clone, Copy)]
pub struct Shared<T>(pub T);

// SAFETY: driver handles are opaque tokens, usable from any thread.
unsafe impl<T> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Shared<T> {}

/// A sticky error made ready ([`Cx::trap`]).
pub struct Trap<'a> {
    cx: &'a Cx,
    kernels: Option<cuda_workspace::gpu::Kernels>,
}

impl Trap<'_> {
    /// Gives the current context a sticky error through `stream` (see [`Cx::sticky_error`]).
    pub fn fire(&self, stream: CUstream) {
        match &self.kernels {
            None => assert_eq!(fake().poison_context(ptr::null_mut()), Ok(())),
            Some(kernels) => kernels.trap(stream),
        }
        // Waits until the error is there, and has surfaced (later enqueues are refused).
        // SAFETY: a live stream. (Not the whole context: other streams may be held.)
        let synchronized = unsafe { self.cx.driver.cuStreamSynchronize(stream) };
        assert_eq!(
            code(synchronized),
            Some(CUresult::CUDA_ERROR_LAUNCH_FAILED),
            "the trap's sticky error"
        );
    }
}
