//! A child process forked after this crate was used.
//!
//! `fork` copies the parent's memory, not its threads: the child has the parent's cleanup queue,
//! pending launches and record pool as they were at that moment (their locks possibly held by
//! threads that do not exist in the child), a handle to a reaper and a poller that do not exist
//! there, and a CUDA driver it must not use (NVIDIA: any use of CUDA in a child forked after the
//! parent initialised it, before `exec`, is undefined behaviour). Starting a fresh reaper would
//! not help: nothing it could release in the child can be launched there.
//!
//! So the first launch (or `completion` in low-latency mode) arms a `pthread_atfork` child handler
//! that marks the process a forked child. In such a child every launch, completion and `flush`
//! fails with [`Error::ForkedChild`] before any driver call (a launch drops its owners first, on
//! the calling thread, as for every refused launch); `drain` releases nothing (the queue holds
//! copies of the parent's records, which the parent releases). The copied records are never
//! released in the child: like any value of the parent's, they go with the child's memory.
//!
//! Checking costs a launch one relaxed atomic load. Elsewhere than on Linux nothing is
//! armed.

use std::sync::Once;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::support::error::Error;

const UNARMED: u8 = 0;
const ARMED: u8 = 1;
const FORKED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNARMED);
static ARM: Once = Once::new();

/// `Err(ForkedChild)` in a child forked after this crate's first launch; arms the fork handler on
/// the first call.
#[inline]
pub(crate) fn check() -> Result<(), Error> {
    match STATE.load(Ordering::Relaxed) {
        ARMED => Ok(()),
        FORKED => Err(Error::ForkedChild),
        _ => arm(),
    }
}

/// Whether this process is a child forked after this crate's first launch.
#[inline]
pub(crate) fn is_forked_child() -> bool {
    STATE.load(Ordering::Relaxed) == FORKED
}

#[cold]
fn arm() -> Result<(), Error> {
    ARM.call_once(|| {
        #[cfg(target_os = "linux")]
        // SAFETY: registers a child handler that only stores to an atomic (async-signal-safe, as
        // a handler that runs in the child of a multi-threaded process must be). No prepare or
        // parent handler. If registration fails (out of memory), forks go undetected, as before.
        unsafe {
            libc::pthread_atfork(None, None, Some(mark_forked_child));
        }
        // Armed only now, so a child forked before the handler was registered is not marked, but
        // no child forked after is missed; a fork racing this store is marked by the handler.
        let _ = STATE.compare_exchange(UNARMED, ARMED, Ordering::Relaxed, Ordering::Relaxed);
    });
    check_armed()
}

fn check_armed() -> Result<(), Error> {
    if is_forked_child() {
        Err(Error::ForkedChild)
    } else {
        Ok(())
    }
}

#[cfg(target_os = "linux")]
extern "C" fn mark_forked_child() {
    STATE.store(FORKED, Ordering::Relaxed);
}
