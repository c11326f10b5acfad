//! The driver's teardown at process exit.
//!
//! The real driver tears its state down while the process exits (its exit handlers and static
//! destructors, registered when it was loaded and initialised), while the process's other threads
//! still run: a call made by one of them from then on may fail or crash. The fake registers an
//! exit handler at the first successful `cuInit`; from the moment it runs, every driver call
//! returns `CUDA_ERROR_DEINITIALIZED` (4) and is counted ([`calls_after_teardown`]), so that a test
//! can check, from an exit handler of its own that runs later, that nobody called the driver after
//! it was torn down.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static TORN_DOWN: AtomicBool = AtomicBool::new(false);
static CALLS_AFTER: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

extern "C" fn tear_down() {
    TORN_DOWN.store(true, Ordering::SeqCst);
}

/// Registers the teardown to run at exit (once; called by `cuInit`).
pub(crate) fn register() {
    REGISTER.call_once(|| {
        // SAFETY: `tear_down` is an `extern "C" fn()` that only stores to an atomic; glibc runs an
        // exit handler a shared library registered when that library is unloaded, if it is
        // unloaded before the process exits.
        unsafe { libc::atexit(tear_down) };
    });
}

/// The calls after the teardown: the calling thread's name (as the operating system knows it)
/// and the export called, the first 1000.
static CALLERS_AFTER: std::sync::Mutex<Vec<(String, &'static str)>> =
    std::sync::Mutex::new(Vec::new());

/// The stack of the first call after the teardown by a thread whose name starts with
/// [`LIBRARY_THREADS`]: what a failed exit check prints.
static FIRST_LIBRARY_CALL: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The name prefix of the threads of the library under test (`cuda-host-launch`'s reaper and
/// poller): whose calls after the teardown are worth a stack.
const LIBRARY_THREADS: &str = "cuda-h";

/// Whether the driver was torn down; if so, counts the call to `export` (and its thread).
pub(crate) fn refuse_call(export: &'static str) -> bool {
    if TORN_DOWN.load(Ordering::SeqCst) {
        CALLS_AFTER.fetch_add(1, Ordering::SeqCst);
        let thread = crate::oracle::this_thread_name();
        if thread.starts_with(LIBRARY_THREADS) {
            let mut first = FIRST_LIBRARY_CALL.lock().unwrap_or_else(|p| p.into_inner());
            if first.is_none() {
                let stack = std::backtrace::Backtrace::force_capture();
                *first = Some(format!("{export} on {thread}:\n{stack}"));
            }
        }
        let mut callers = CALLERS_AFTER.lock().unwrap_or_else(|p| p.into_inner());
        if callers.len() < 1000 {
            callers.push((thread, export));
        }
        return true;
    }
    false
}

/// Driver calls made after the teardown by threads whose name starts with `prefix`.
pub(crate) fn calls_after_teardown_by(prefix: &str) -> u64 {
    CALLERS_AFTER
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(name, _)| name.starts_with(prefix))
        .count() as u64
}

/// The calls after the teardown as text: one line `thread export` per call (the first 1000),
/// then the stack of the first call by the library's threads, if one called.
pub(crate) fn report() -> String {
    let mut text = String::new();
    for (thread, export) in CALLERS_AFTER
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
    {
        text.push_str(&format!("{thread} {export}\n"));
    }
    if let Some(stack) = &*FIRST_LIBRARY_CALL.lock().unwrap_or_else(|p| p.into_inner()) {
        text.push_str(stack);
    }
    text
}

/// Driver calls made after the teardown.
pub(crate) fn calls_after_teardown() -> u64 {
    CALLS_AFTER.load(Ordering::SeqCst)
}

/// Whether the teardown ran.
pub(crate) fn torn_down() -> bool {
    TORN_DOWN.load(Ordering::SeqCst)
}
