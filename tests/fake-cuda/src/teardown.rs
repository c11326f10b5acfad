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

/// The threads (by name, as the operating system knows them) that called after the teardown.
static CALLERS_AFTER: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Whether the driver was torn down; if so, counts the call (and its thread).
pub(crate) fn refuse_call() -> bool {
    if TORN_DOWN.load(Ordering::SeqCst) {
        CALLS_AFTER.fetch_add(1, Ordering::SeqCst);
        let mut callers = CALLERS_AFTER.lock().unwrap_or_else(|p| p.into_inner());
        if callers.len() < 1000 {
            callers.push(crate::oracle::this_thread_name());
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
        .filter(|name| name.starts_with(prefix))
        .count() as u64
}

/// Driver calls made after the teardown.
pub(crate) fn calls_after_teardown() -> u64 {
    CALLS_AFTER.load(Ordering::SeqCst)
}

/// Whether the teardown ran.
pub(crate) fn torn_down() -> bool {
    TORN_DOWN.load(Ordering::SeqCst)
}
