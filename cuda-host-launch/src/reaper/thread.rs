//! The reaper thread: started on first use, parked while the queue is empty, releasing batches as
//! they come.

use std::time::{Duration, Instant};

use super::lane;
use super::mode::{REAPER_START, cleanup_mode};
use super::release::{QUEUE, ReaperContext, Scratch, release_queued};
use crate::record::pool;
use crate::support::config::{CleanupMode, config};
use crate::support::crate_threads;
use crate::support::error::Error;
use crate::support::panic_report::{PanicOrigin, report_and_drop};
use crate::support::precise_sleeps::precise_sleeps;
use crate::support::relaxed_capture::RelaxedCaptureMode;
use crate::support::sync::lock;
use crate::support::thread_settings::CrateThread;
use crate::support::{exit_gate, forked_child};

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
    // User code (the settings' name function), so before the lock: it may launch, which starts
    // the reaper.
    let name = crate_threads::name_of(CrateThread::Reaper)?;
    let _guard = lock(&REAPER_START);
    if QUEUE.has_reaper() {
        return Ok(());
    }
    // The reaper is the lane: its hook's panic is reported (and its payload dropped) here.
    let handle = crate_threads::spawn(CrateThread::Reaper, name, reaper_loop, |panic| {
        report_and_drop(PanicOrigin::StartHook, panic)
    })?;
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
/// for `linger` (the configuration's `reaper_pace`). While it lingers, a push's `unpark` is one atomic swap, no system call, and
/// batches grow to everything pushed within a poll interval. Once idle for `linger`, it parks; the
/// next push that finds the queue empty wakes it.
fn reaper_loop() {
    precise_sleeps();
    let mut relaxed = RelaxedCaptureMode::pending();
    // The configuration is in force: `prepare` read it before the reaper was started.
    let (poll, linger) = config().map_or((Duration::ZERO, Duration::ZERO), |c| c.reaper_waits());
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
        release_queued(&mut scratch);
    }
}
