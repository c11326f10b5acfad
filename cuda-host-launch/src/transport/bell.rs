//! How the watcher (`transport::watcher`) is told of new work, and how `flush` waits for it: the
//! sides ring here under their own locks (an event enqueue under the hand-over's, a flag
//! registration under the registry's), and learn whether a watcher runs to hear it. If none
//! does, the caller starts one ([`Ring::NoWatcher`]: `watcher::answer`); a watcher that stops
//! decides under every side's lock, so what was handed over is either seen by the one that runs
//! or by the next.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::poller_barrier::RoundBarrier;
use crate::support::crate_threads;
use crate::support::sync::lock;
use crate::support::thread_settings::CrateThread;

/// What a ring found.
#[must_use = "with no watcher, the caller must start one (`watcher::answer`)"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ring {
    /// A watcher runs and will see the new work.
    Heard,
    /// No watcher runs: the caller starts one, whose first round sees the new work.
    NoWatcher,
}

/// The watcher's thread, if one runs. Taken after the sides' locks.
pub(super) static THREAD: Mutex<Option<std::thread::Thread>> = Mutex::new(None);

/// Whether a watcher runs: written under [`THREAD`] and, when it stops, under every side's lock
/// too, so that a side that reads it under its lock sees what holds until it lets go.
static RUNNING: AtomicBool = AtomicBool::new(false);

/// An event enqueue (or a flush) asks the event side for a round at once.
pub(super) static POKE_EVENTS: AtomicBool = AtomicBool::new(false);
/// A flag registration (or a lost context, or a flush) asks the flag side for a round at once.
pub(super) static POKE_FLAGS: AtomicBool = AtomicBool::new(false);

/// `flush`'s barrier (see `transport::poller_barrier`).
pub(super) static BARRIER: RoundBarrier = RoundBarrier::new();

/// Whether a watcher runs. Meaningful under a side's lock (the events' hand-over, the flag
/// registry): it then holds until the lock is let go.
pub(crate) fn running() -> bool {
    RUNNING.load(Ordering::Acquire)
}

/// Marks the watcher started (its thread) or stopped, under [`THREAD`]'s lock.
pub(super) fn set_running(
    thread: &mut Option<std::thread::Thread>,
    now: Option<std::thread::Thread>,
) {
    RUNNING.store(now.is_some(), Ordering::Release);
    *thread = now;
}

/// After an event enqueue handed its entry over, under its slot's lock: wakes the watcher if the
/// event side waits long (`take_wake`: whether it asked to be woken, which it clears).
pub(super) fn ring_events(take_wake: impl FnOnce() -> bool) -> Ring {
    if !running() {
        return Ring::NoWatcher;
    }
    if take_wake() {
        POKE_EVENTS.store(true, Ordering::Release);
        unpark();
    }
    Ring::Heard
}

/// After a flag registration (or a lost context), under the registry's lock: wakes the watcher
/// for a round of the flag side.
pub(super) fn ring_flags() -> Ring {
    if !running() {
        return Ring::NoWatcher;
    }
    POKE_FLAGS.store(true, Ordering::Release);
    unpark();
    Ring::Heard
}

fn unpark() {
    if let Some(thread) = lock(&THREAD).as_ref() {
        thread.unpark();
    }
}

/// Waits until the watcher has finished a round of both sides begun after this call (every
/// entry whose event completed or flag was written by then completed), or `deadline` passes.
/// Returns at once (true) if no watcher runs (nothing is pending) or this is the watcher.
pub(crate) fn wait_for_round(deadline: Option<Instant>) -> bool {
    if crate_threads::current() == Some(CrateThread::Watcher) {
        return true;
    }
    let request = {
        let thread = lock(&THREAD);
        let Some(thread) = thread.as_ref() else {
            return true;
        };
        let request = BARRIER.ask();
        POKE_EVENTS.store(true, Ordering::Release);
        POKE_FLAGS.store(true, Ordering::Release);
        thread.unpark();
        request
    };
    BARRIER.wait(request, deadline)
}
