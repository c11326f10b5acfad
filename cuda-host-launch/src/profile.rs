//! Where a launch's time goes, for the benchmark: built only with `--cfg cuda_host_launch_profile`
//! (see `BENCHMARKS.md`), never in a normal build.
//!
//! Two tools, both switched at run time ([`profile_configure`]):
//! - **Timers** (off until switched on): each figure costs two clock reads, so the benchmark turns
//!   them on only for the run whose time it splits.
//! - **Ablations**: leave a step out of the launch (the capture query, the pending-list tracking),
//!   so a run can compare the launch with and without it, against the floor of the same run. Only
//!   for benchmarks on streams that do not capture and contexts that are not lost: without the
//!   capture query a launch on a capturing stream would be captured as a run-once record, and
//!   without tracking a lost context's owners are not reclaimed.
//!
//! The launching thread's totals and the driver thread's totals sit on lines of their own, and each
//! figure's clock is read before its totals are written: were they on one line, each launch and
//! each trampoline would take it from the other, and the profile would measure its own false
//! sharing (it did, in the first profile runs: see `benches/HISTORY.md`).

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

use crate::own_line::OwnLine;

/// Totals written by launching threads.
struct LauncherTotals {
    enqueues: AtomicU64,
    enqueue_ns: AtomicU64,
    driver_call_ns: AtomicU64,
    capture_ns: AtomicU64,
    track_ns: AtomicU64,
    records: AtomicU64,
    record_ns: AtomicU64,
}

/// Totals written by the driver's threads.
struct TrampolineTotals {
    trampolines: AtomicU64,
    trampoline_ns: AtomicU64,
}

static LAUNCHER: OwnLine<LauncherTotals> = OwnLine(LauncherTotals {
    enqueues: AtomicU64::new(0),
    enqueue_ns: AtomicU64::new(0),
    driver_call_ns: AtomicU64::new(0),
    capture_ns: AtomicU64::new(0),
    track_ns: AtomicU64::new(0),
    records: AtomicU64::new(0),
    record_ns: AtomicU64::new(0),
});

/// What [`profile_configure`] chose, read by the launching and the driver's threads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProfileSettings {
    /// Time the launches (see [`Profile`]).
    pub timers: bool,
    /// Launch without asking whether the stream captures (ablation).
    pub skip_capture_query: bool,
    /// Formerly: launch without tracking the record for a reclaim. No longer honoured: the driver is
    /// handed the launch's ticket, so every launch takes one.
    pub skip_tracking: bool,
}

const TIMERS: u8 = 1;
const SKIP_CAPTURE_QUERY: u8 = 2;
const SKIP_TRACKING: u8 = 4;

/// The settings as bits; written between runs, read on every launch.
static SETTINGS: OwnLine<AtomicU8> = OwnLine(AtomicU8::new(0));

/// Chooses timers and ablations for the launches that follow.
///
/// # Safety
/// With an ablation on, every launch until it is switched off must be on a stream that is not
/// capturing, in a context that will not be lost (see the module documentation).
pub unsafe fn profile_configure(settings: ProfileSettings) {
    let bit = |on: bool, bit: u8| if on { bit } else { 0 };
    let bits = bit(settings.timers, TIMERS)
        | bit(settings.skip_capture_query, SKIP_CAPTURE_QUERY)
        | bit(settings.skip_tracking, SKIP_TRACKING);
    SETTINGS.store(bits, Ordering::Relaxed);
}

/// The current settings.
pub fn profile_settings() -> ProfileSettings {
    let bits = SETTINGS.load(Ordering::Relaxed);
    ProfileSettings {
        timers: bits & TIMERS != 0,
        skip_capture_query: bits & SKIP_CAPTURE_QUERY != 0,
        skip_tracking: bits & SKIP_TRACKING != 0,
    }
}

/// A timer's start, if timers are on.
#[inline]
pub(crate) fn start() -> Option<Instant> {
    (SETTINGS.load(Ordering::Relaxed) & TIMERS != 0).then(Instant::now)
}

static DRIVER_THREAD: OwnLine<TrampolineTotals> = OwnLine(TrampolineTotals {
    trampolines: AtomicU64::new(0),
    trampoline_ns: AtomicU64::new(0),
});

/// Totals since the last [`profile_reset`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Profile {
    /// Launches through `enqueue` (every launch form).
    pub enqueues: u64,
    /// Time in `enqueue`, from its start to its return (capture query, tracking, the driver call).
    pub enqueue_ns: u64,
    /// Of that, time in the driver's launch call.
    pub driver_call_ns: u64,
    /// Of that, time in the capture query.
    pub capture_ns: u64,
    /// Of that, time tracking the record for a reclaim (its state and context; a boxed record is
    /// also linked into a list).
    pub track_ns: u64,
    /// Records built (every launch form, and deferred drops).
    pub records: u64,
    /// Time building them (slot or box, writing the payload).
    pub record_ns: u64,
    /// Trampolines run (on the driver's thread).
    pub trampolines: u64,
    /// Time in the trampoline, the host function included.
    pub trampoline_ns: u64,
}

/// The totals so far.
pub fn profile_snapshot() -> Profile {
    let l = &*LAUNCHER;
    let d = &*DRIVER_THREAD;
    Profile {
        enqueues: l.enqueues.load(Ordering::Relaxed),
        enqueue_ns: l.enqueue_ns.load(Ordering::Relaxed),
        driver_call_ns: l.driver_call_ns.load(Ordering::Relaxed),
        capture_ns: l.capture_ns.load(Ordering::Relaxed),
        track_ns: l.track_ns.load(Ordering::Relaxed),
        records: l.records.load(Ordering::Relaxed),
        record_ns: l.record_ns.load(Ordering::Relaxed),
        trampolines: d.trampolines.load(Ordering::Relaxed),
        trampoline_ns: d.trampoline_ns.load(Ordering::Relaxed),
    }
}

/// Sets every total to zero.
pub fn profile_reset() {
    let l = &*LAUNCHER;
    let d = &*DRIVER_THREAD;
    for total in [
        &l.enqueues,
        &l.enqueue_ns,
        &l.driver_call_ns,
        &l.capture_ns,
        &l.track_ns,
        &l.records,
        &l.record_ns,
        &d.trampolines,
        &d.trampoline_ns,
    ] {
        total.store(0, Ordering::Relaxed);
    }
}

fn nanos_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

pub(crate) fn enqueue(started: Option<Instant>) {
    if let Some(started) = started {
        let ns = nanos_since(started);
        LAUNCHER.enqueues.fetch_add(1, Ordering::Relaxed);
        LAUNCHER.enqueue_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

pub(crate) fn driver_call(started: Option<Instant>) {
    if let Some(started) = started {
        LAUNCHER
            .driver_call_ns
            .fetch_add(nanos_since(started), Ordering::Relaxed);
    }
}

pub(crate) fn capture(started: Option<Instant>) {
    if let Some(started) = started {
        LAUNCHER
            .capture_ns
            .fetch_add(nanos_since(started), Ordering::Relaxed);
    }
}

pub(crate) fn track(started: Option<Instant>) {
    if let Some(started) = started {
        LAUNCHER
            .track_ns
            .fetch_add(nanos_since(started), Ordering::Relaxed);
    }
}

/// Adds the time from its start to its drop to the record-building total.
pub(crate) struct TimedRecord(pub(crate) Option<Instant>);

impl Drop for TimedRecord {
    fn drop(&mut self) {
        if let Some(started) = self.0 {
            let ns = nanos_since(started);
            LAUNCHER.records.fetch_add(1, Ordering::Relaxed);
            LAUNCHER.record_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }
}

pub(crate) fn trampoline(started: Option<Instant>) {
    if let Some(started) = started {
        let ns = nanos_since(started);
        DRIVER_THREAD.trampolines.fetch_add(1, Ordering::Relaxed);
        DRIVER_THREAD.trampoline_ns.fetch_add(ns, Ordering::Relaxed);
    }
}
