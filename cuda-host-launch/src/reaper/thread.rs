//! The reaper thread: started on first use, parked while the queue is empty, releasing batches as
//! they come.

use std::time::{Duration, Instant};

use super::lane;
use super::mode::{CleanupMode, REAPER_START, cleanup_mode};
use super::release::{QUEUE, ReaperContext, Scratch, release_batch};
use crate::record::pool;
use crate::support::crate_threads::{self, CrateThread};
use crate::support::error::Error;
use crate::support::precise_sleeps::precise_sleeps;
use crate::support::relaxed_capture::RelaxedCaptureMode;
use crate::support::sync::lock;
use crate::support::{exit_gate, forked_child};

/// How often (µs) the reaper looks at the queue while it lingers after a batch (default 50; `0`
/// parks at once after every batch).
pub const REAPER_POLL_ENV: &str = "CUDA_HOST_LAUNCH_REAPER_POLL_US";

/// How long (µs) the reaper lingers, polling, after its last batch before it parks (default 2000).
pub const REAPER_LINGER_ENV: &str = "CUDA_HOST_LAUNCH_REAPER_LINGER_US";

const DEFAULT_POLL: Duration = Duration::from_micros(50);
const DEFAULT_LINGER: Duration = Duration::from_micros(2000);

/// Makes sure whoever must drain is ready before a record can reach the queue: the driver loaded
/// and the exit handler registered, and in reaper mode, the reaper thread started (so the first
/// push can wake it). Returns the mode.
#[inline]
pub(crate) fn prepare() -> Result<CleanupMode, Error> {
    forked_child::check()?;
    // The driver loaded, then the exit handler registered (see `exit_gate`): by the crate's first
    // launch, before the reaper starts. Once armed, one load of a flag.
    if !exit_gate::armed() {
        cuda_dl_sys::driver()?;
        exit_gate::arm();
    }
    let mode = cleanup_mode()?;
    if mode == CleanupMode::Reaper && !QUEUE.has_reaper() {
        start_reaper()?;
    }
    Ok(mode)
}

#[cold]
fn start_reaper() -> Result<(), Error> {
    let _guard = lock(&REAPER_START);
    if QUEUE.has_reaper() {
        return Ok(());
    }
    let handle = crate_threads::spawn(CrateThread::Reaper, reaper_loop)
        .map_err(|e| Error::ReaperSpawn(e.to_string()))?;
    // Wakes the reaper once after publishing it: a push that ran before woke no one.
    QUEUE.set_reaper(handle.thread().clone());
    // The handle is dropped: the reaper is detached and runs until the process exits.
    Ok(())
}

/// The reaper: releases batches as they come.
///
/// Waking a parked thread costs the waker a futex system call, and the waker is a driver thread,
/// whose time every host function of its context shares. So after a batch the reaper does not park
/// at once: it lingers, looking at the queue every `poll` (sleeping in between, on its own core),
/// for `linger`. While it lingers, a push's `unpark` is one atomic swap, no system call, and
/// batches grow to everything pushed within a poll interval. Once idle for `linger`, it parks; the
/// next push that finds the queue empty wakes it.
fn reaper_loop() {
    precise_sleeps();
    let mut relaxed = RelaxedCaptureMode::pending();
    let poll = env_micros(REAPER_POLL_ENV).unwrap_or(DEFAULT_POLL);
    let linger = env_micros(REAPER_LINGER_ENV).unwrap_or(DEFAULT_LINGER);
    let mut idle_since: Option<Instant> = None;
    // Owners are dropped with no context current on this thread (see `ReaperContext`).
    let mut scratch = Scratch::default();
    scratch.context = Some(ReaperContext::default());
    loop {
        if QUEUE.reaper_may_park() {
            let now = Instant::now();
            let since = *idle_since.get_or_insert(now);
            if !poll.is_zero() && now.duration_since(since) < linger {
                // Not a park: a driver thread's push must not pay for a futex wake. A watcher's
                // push rings the bell, which ends the wait at once (see `lane`).
                lane::wait_for_ring(poll);
                continue;
            }
            idle_since = None;
            // Idle: give the record pool's surplus back to the system before sleeping.
            pool::trim();
            // Wait for the push that finds the queue empty. Spurious wake-ups just loop.
            std::thread::park();
            continue;
        }
        idle_since = None;
        // Stopped here at exit; the driver is loaded by now (a record is queued only after a
        // launch): relax this thread's capture interaction before it runs owners' `Drop`.
        exit_gate::arm_or_stop();
        relaxed.enter_once_loaded();
        release_batch(QUEUE.take_all(), &mut scratch);
    }
}

/// A duration in microseconds from the environment; `None` if unset or not a number.
fn env_micros(variable: &str) -> Option<Duration> {
    std::env::var(variable)
        .ok()?
        .trim()
        .parse()
        .ok()
        .map(Duration::from_micros)
}
