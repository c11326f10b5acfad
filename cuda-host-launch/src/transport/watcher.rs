//! The watcher: the crate's one thread that watches for completions, of both kinds that need a
//! look from the host: recorded events (`event`: `release_after`, `spawn_after`, `Event`
//! futures) and flag words (`low_latency`: `LowLatency` futures, and the fault look for
//! host-function futures). It runs no user code but wakers: owners' `Drop`s, callbacks and panic
//! reports go to the lane (`reaper::lane`).
//!
//! - **One loop, two sides.** Each side keeps its own pace (`poller_pace`: the configuration's
//!   [`PollerSettings`] for events, the low-latency [`PACE`](super::low_latency) for flags) and
//!   says when it wants its next round; the watcher runs each side when due, spins while either
//!   spins, and otherwise parks until the earlier of the two. An enqueue pokes it (a flag
//!   registration always; an event only when the event side waits longer than its shortest
//!   pause, so a burst of enqueues makes no system call).
//! - **One barrier** ([`RoundBarrier`]): a `flush` asks for a round, and the next iteration runs
//!   both sides, then marks the request served.
//! - **One exit path**: with nothing pending on either side for the configuration's
//!   [`PollerSettings::idle_exit`], it gives the event pools back and stops, deciding under the
//!   locks every enqueue hands over under (the events' queues and hand-over, the pools, the flag
//!   registry, then its own), so an enqueue either finds it running or starts the next one. At
//!   process exit it stops before the driver's teardown (`support::exit_gate`).
//! - **One thread** ([`CrateThread::Watcher`]), started through `support::crate_threads` (its
//!   name, CPUs and start hook from the configuration), in relaxed capture mode.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::bell::{self, BARRIER, POKE_EVENTS, POKE_FLAGS, Ring};
use super::event::{self, EventWatch};
use super::low_latency::{self, FlagWatch};
use super::poller_pace::{CpuAccount, PollerSettings, Wait};
use crate::support::config::config;
use crate::support::crate_threads;
use crate::support::error::Error;
use crate::support::exit_gate;
use crate::support::panic_report::PanicOrigin;
use crate::support::precise_sleeps::precise_sleeps;
use crate::support::relaxed_capture::enter_relaxed_mode;
use crate::support::sync::lock;
use crate::support::thread_settings::CrateThread;

/// Answers a side's ring: starts a watcher if none ran when it rang (whose first round sees what
/// the side handed over).
///
/// # Errors
/// [`Error::ThreadSpawn`] (or the configuration's error) if the thread cannot be started: what
/// was handed over stays, and the next ring that starts a watcher gets it seen.
pub(crate) fn answer(ring: Ring) -> Result<(), Error> {
    match ring {
        Ring::Heard => Ok(()),
        Ring::NoWatcher => start(),
    }
}

#[cold]
fn start() -> Result<(), Error> {
    // User code (the settings' name function), so before the lock: it may enqueue, which may
    // start the watcher.
    let name = crate_threads::name_of(CrateThread::Watcher)?;
    let mut thread = lock(&bell::THREAD);
    if let Some(running) = thread.as_ref() {
        // Another caller started it meanwhile: it may have looked before this caller's work was
        // handed over.
        bell::POKE_EVENTS.store(true, Ordering::Release);
        bell::POKE_FLAGS.store(true, Ordering::Release);
        running.unpark();
        return Ok(());
    }
    // User code never runs here: the hook's panic is reported on the lane.
    let handle = crate_threads::spawn(CrateThread::Watcher, name, watch, |panic| {
        crate::reaper::lane::report_there(PanicOrigin::StartHook, panic)
    })?;
    bell::set_running(&mut thread, Some(handle.thread().clone()));
    Ok(())
}

/// The event side's pace: the configuration's (the defaults if it cannot be read: the watcher
/// starts only after an enqueue that read it).
fn event_settings() -> PollerSettings {
    config().map_or(PollerSettings::DEFAULT, |c| c.event_poller_settings())
}

/// When the earlier of two moments comes (`None`: never).
fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn watch() {
    let Some(driver) = cuda_dl_sys::Driver::get() else {
        // Never: an enqueue loaded the driver before starting this thread.
        stopped_without_rounds();
        return;
    };
    // Queries and wakers are "unsafe" calls in the capture sense.
    let _ = enter_relaxed_mode();
    // Its timed parks are short: keep them so.
    precise_sleeps();
    let settings = event_settings();
    let mut cpu = CpuAccount::start();
    let mut events = EventWatch::new();
    let mut flags = FlagWatch::new();
    // Both sides look at once: the enqueue that started this thread waits.
    let now = Instant::now();
    let (mut event_due, mut flag_due) = (Some(now), Some(now));
    let (mut event_wait, mut flag_wait): (Option<Wait>, Option<Wait>) = (None, None);
    let mut served = 0;
    let mut idle_since: Option<Instant> = None;
    loop {
        // Once the process is exiting this thread parks for good (no driver call after the
        // driver's teardown); until then the exit handler waits for the iteration in progress.
        exit_gate::arm_or_stop();
        let Some(work) = exit_gate::begin_driver_work() else {
            continue;
        };
        // The flushes this iteration serves: those that asked before it looks. Any makes it a
        // round of both sides.
        let serving = BARRIER.round_begins();
        let forced = serving > served;
        let now = Instant::now();
        if POKE_EVENTS.swap(false, Ordering::AcqRel) {
            event_due = Some(now);
        }
        if POKE_FLAGS.swap(false, Ordering::AcqRel) {
            flag_due = Some(now);
        }
        if forced || event_due.is_some_and(|due| due <= now) {
            let (_, wait) = events.round(driver, &settings);
            event_wait = wait;
            event_due = events.next_round(wait, &settings);
            if !EventWatch::ask_to_be_woken(wait, &settings) {
                // Entries arrived meanwhile: look again at once.
                event_due = Some(Instant::now());
            }
        }
        if forced || flag_due.is_some_and(|due| due <= now) {
            let (_, wait) = flags.round();
            flag_wait = wait;
            flag_due = flags.next_round(wait);
        }
        drop(work);
        if forced {
            BARRIER.round_done(serving);
            served = serving;
        }
        // Nothing pending on either side (the event side's pools may still be due back).
        let idle = event_wait.is_none() && flag_wait.is_none() && flags.idle();
        if idle {
            let since = *idle_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= settings.idle_exit && stop(driver) {
                break;
            }
        } else {
            idle_since = None;
        }
        // How to wait for the earlier side: spin while either spins (the event side's next round
        // is a query gap away at most), else park until then; with nothing pending, until the
        // idle exit is due.
        let spinning = event_wait == Some(Wait::Spin) || flag_wait == Some(Wait::Spin);
        let exit_due = idle_since.map(|since| since + settings.idle_exit);
        let next = earlier(earlier(event_due, flag_due), exit_due);
        let now = Instant::now();
        cpu.before_wait(now, spinning);
        if spinning {
            if let Some(next) = next {
                while Instant::now() < next
                    && !POKE_FLAGS.load(Ordering::Acquire)
                    && !POKE_EVENTS.load(Ordering::Acquire)
                {
                    std::hint::spin_loop();
                }
            }
            continue;
        }
        let pause = next.map_or(settings.idle_exit, |next| {
            next.saturating_duration_since(now)
        });
        if !pause.is_zero() {
            std::thread::park_timeout(pause.min(Duration::from_secs(1)));
        }
    }
    cpu.count();
}

/// Stops the watcher if nothing is pending or handed over on either side, deciding under every
/// lock an enqueue hands over under (every slot of the events' hand-over, the flag registry),
/// then its own; gives the event pools back. Returns whether it stopped.
fn stop(driver: &cuda_dl_sys::Driver) -> bool {
    let Some(work) = exit_gate::begin_driver_work() else {
        return false;
    };
    let queues = event::queues();
    let decided = event::with_all_slots_locked(|slots| {
        let mut registry = low_latency::lock_registry();
        if !low_latency::registry_idle(&mut registry) {
            return None;
        }
        let released = EventWatch::stop_if_idle(driver, slots, &queues)?;
        bell::set_running(&mut lock(&bell::THREAD), None);
        // The newest request when it decided (under its own lock, which a flush asks under): a
        // flush that asks later finds no watcher, or the next one.
        let served_at_exit = BARRIER.round_begins();
        event::no_wake_needed();
        Some((released, served_at_exit))
    });
    drop(queues);
    let Some((released, served_at_exit)) = decided else {
        return false;
    };
    // With no lock held: a reclaim takes the locks. Only the work of contexts that are gone is
    // taken.
    for (device, handle) in released {
        crate::transport::reclaim_after_release(driver, device, handle);
    }
    drop(work);
    BARRIER.round_done(served_at_exit);
    true
}

/// A watcher that could not start its loop: marks itself gone (every flush so far served).
fn stopped_without_rounds() {
    bell::set_running(&mut lock(&bell::THREAD), None);
    BARRIER.stopped();
}
