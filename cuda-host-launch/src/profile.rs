//! Where a launch's time goes, for the benchmark: built only with `--cfg cuda_host_launch_profile`
//! (see `BENCHMARKS.md`), never in a normal build, since each figure costs two clock reads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

static ENQUEUES: AtomicU64 = AtomicU64::new(0);
static ENQUEUE_NS: AtomicU64 = AtomicU64::new(0);
static DRIVER_CALL_NS: AtomicU64 = AtomicU64::new(0);
static TRAMPOLINES: AtomicU64 = AtomicU64::new(0);
static TRAMPOLINE_NS: AtomicU64 = AtomicU64::new(0);

/// Totals since the last [`profile_reset`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Profile {
    /// Launches through `enqueue` (every launch form).
    pub enqueues: u64,
    /// Time in `enqueue`, from its start to its return (capture query, tracking, the driver call).
    pub enqueue_ns: u64,
    /// Of that, time in the driver's launch call.
    pub driver_call_ns: u64,
    /// Trampolines run (on the driver's thread).
    pub trampolines: u64,
    /// Time in the trampoline, the host function included.
    pub trampoline_ns: u64,
}

/// The totals so far.
pub fn profile_snapshot() -> Profile {
    Profile {
        enqueues: ENQUEUES.load(Ordering::Relaxed),
        enqueue_ns: ENQUEUE_NS.load(Ordering::Relaxed),
        driver_call_ns: DRIVER_CALL_NS.load(Ordering::Relaxed),
        trampolines: TRAMPOLINES.load(Ordering::Relaxed),
        trampoline_ns: TRAMPOLINE_NS.load(Ordering::Relaxed),
    }
}

/// Sets every total to zero.
pub fn profile_reset() {
    for total in [
        &ENQUEUES,
        &ENQUEUE_NS,
        &DRIVER_CALL_NS,
        &TRAMPOLINES,
        &TRAMPOLINE_NS,
    ] {
        total.store(0, Ordering::Relaxed);
    }
}

fn nanos_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

pub(crate) fn enqueue(started: Instant) {
    ENQUEUES.fetch_add(1, Ordering::Relaxed);
    ENQUEUE_NS.fetch_add(nanos_since(started), Ordering::Relaxed);
}

pub(crate) fn driver_call(started: Instant) {
    DRIVER_CALL_NS.fetch_add(nanos_since(started), Ordering::Relaxed);
}

pub(crate) fn trampoline(started: Instant) {
    TRAMPOLINES.fetch_add(1, Ordering::Relaxed);
    TRAMPOLINE_NS.fetch_add(nanos_since(started), Ordering::Relaxed);
}
