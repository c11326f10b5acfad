//! Launches whose host function has not run yet, per context, so their owners can be reclaimed once
//! the driver can no longer run them.
//!
//! After a sticky context error (a kernel trapped: 719) the driver still accepts `cuLaunchHostFunc`
//! but never calls the function, so a record released only by its trampoline would leak. Every
//! run-once launch therefore holds a ticket (see `record::ticket_table`) from its launch until
//! its record is released: the ticket names the record and the context, and its state says who
//! owns the launch (see `record::launch_state`). A reclaim walks the tickets and
//! takes the pending launches of its context with a compare-and-swap, which the trampoline's claim
//! races: whoever wins owns the record, so it is released once. A reclaim never takes a launch
//! whose launch call has not returned (LAUNCHING), so a launch the driver refuses is released by its
//! launcher alone, and one it accepts is never released under the driver.

use std::ptr::NonNull;

use cuda_dl_sys::types::CUcontext;

use crate::reaper::release;
use crate::record::layout::{Op, RecordHeader};
use crate::record::ticket_id::TicketId;
use crate::record::tickets;
use crate::support::context_key::{Gone, Liveness};

/// Runs the launch of ticket `id` once, if this call wins it: claims it (one compare-and-swap, which
/// a reclaim races; a call of another generation, such as a replay of a graph that captured a
/// run-once launch, finds nothing to claim and touches only the ticket), hands its record to `run`,
/// then queues the record for release, unless its launcher still holds it (see
/// `record::launch_state`). Takes no lock and allocates nothing: the trampoline's path on the
/// driver's thread, and the watcher's.
#[inline(always)]
pub(crate) fn run_launch(id: TicketId, run: impl FnOnce(NonNull<RecordHeader>)) {
    // SAFETY: the cleanup queue takes a record nobody else holds.
    run_launch_then(id, run, |header| unsafe { release::push(header) });
}

/// As [`run_launch`], but the record, once nobody else holds it, goes to `release` instead of the
/// cleanup queue (the watcher sends a callback's record to the lane with its context).
#[inline(always)]
pub(crate) fn run_launch_then(
    id: TicketId,
    run: impl FnOnce(NonNull<RecordHeader>),
    release: impl FnOnce(NonNull<RecordHeader>),
) {
    tickets::run(id, run, release);
}

/// Takes every pending (never run) launch into a context of the handle `handle` that is gone, and
/// hands its record to the cleanup queue, which drops its owners. Returns how many.
///
/// Which contexts are gone is decided by `look`, made after the walk (the rule of
/// `support::context_key`): the launches walked were enqueued into contexts that lived then, so
/// one the handle no longer names is gone, and the driver will never run its host functions;
/// launches of the context the handle names now are left alone, whatever their handle. `known`
/// adds what the caller knows is gone (see [`Liveness::is_gone`]).
///
/// Launches still inside their launch call are not taken: their launcher releases them if the
/// driver refuses them, and the driver's thread runs them if it accepts them.
///
/// # Safety
/// What `known` names must be gone: destroyed, or, for a primary context, reset or released for
/// the last time (the driver can no longer run its host functions).
pub(crate) unsafe fn reclaim_gone(
    handle: usize,
    look: &dyn Fn() -> Liveness,
    known: Gone,
) -> usize {
    let candidates = tickets::pending_in(handle);
    if candidates.is_empty() {
        return 0;
    }
    let now = look();
    let mut count = 0;
    for (candidate, key) in candidates {
        if now.is_gone(key, known)
            && let Some(record) = tickets::reclaim(candidate)
        {
            // SAFETY: the reclaim owns the record now (its context is gone: its host function
            // will never run) and it is in no queue. A future waiting on it fails here, not when
            // the reaper releases it: user code on the reaper may be awaiting that future.
            unsafe {
                RecordHeader::dispatch(record, Op::Lost);
                release::push(record);
            }
            count += 1;
        }
    }
    count
}

/// The context handles of the launches pending now, each once.
pub(crate) fn pending_handles() -> Vec<usize> {
    let mut handles = Vec::new();
    tickets::for_each_pending(|context| handles.push(context.handle));
    handles.sort_unstable();
    handles.dedup();
    handles
}

/// Launches of this crate whose host function has not run (nor been reclaimed), in `context` or in
/// all contexts. Walks the tickets: a diagnostic, not for hot paths.
pub(crate) fn count(context: Option<CUcontext>) -> usize {
    let mut n = 0;
    // A snapshot: a ticket reused meanwhile is counted with its later launch's context.
    tickets::for_each_pending(|key| {
        if context.is_none_or(|c| key.handle == c.addr()) {
            n += 1;
        }
    });
    n
}

/// How many launches of this crate wait for their host function: in `context`, or in every
/// context (`None`). A launch counts from its enqueue until its host function has started, or
/// until a reclaim after its context was lost.
///
/// It walks every ticket: a diagnostic, not for a hot path.
pub fn pending_launches(context: Option<CUcontext>) -> usize {
    count(context)
}

/// The memory held by launch tickets: one small slot per launch pending at the same time, at the
/// most so far, allocated in chunks of 4,096 and never freed, since a late call of the driver (a
/// replay of a graph that captured a launch) may look at any ticket at any time (the workspace's
/// `DESIGN.md` tells more). For
/// leak checks that must tell this bounded growth from a leak.
pub fn launch_ticket_bytes() -> usize {
    tickets::memory_bytes()
}
