//! Launches whose host function has not run yet, per context, so their owners can be reclaimed once
//! the driver can no longer run them.
//!
//! After a sticky context error (a kernel trapped: 719) the driver still accepts `cuLaunchHostFunc`
//! but never calls the function, so a record released only by its trampoline would leak. Every
//! run-once launch therefore holds a ticket (see `record::tickets`) from its launch until
//! its record is released: the ticket names the record and the context, and its state says who
//! owns the launch (see `record::launch_state`). A reclaim walks the tickets and
//! takes the pending launches of its context with a compare-and-swap, which the trampoline's claim
//! races: whoever wins owns the record, so it is released once. A reclaim never takes a launch
//! whose launch call has not returned (LAUNCHING), so a launch the driver refuses is released by its
//! launcher alone, and one it accepts is never released under the driver.

use std::ptr::NonNull;

use cuda_dl_sys::types::CUcontext;

use crate::reaper::owned_record::{OwnedRecord, Refusal};
use crate::reaper::release;
use crate::record::launch_state::{Claim, LaunchOver};
use crate::record::layout::RecordHeader;
use crate::record::ticket_id::TicketId;
use crate::record::tickets::{self, HeldTicket};
use crate::support::context_key::{ContextKey, Gone, Liveness};
use crate::support::error::Error;

/// Takes a ticket for a record about to be launched into `context`, holding the launch
/// (LAUNCHING) until the caller reports how its launch call went
/// ([`HeldTicket::launched`], or the record's release). Returns the held ticket, whose id is the
/// launch's `userData`.
///
/// # Errors
/// [`Error::TooManyPendingLaunches`] if every ticket is in use.
///
/// # Safety
/// `header` must be a live run-once record, not yet tracked, owned by the caller.
pub(crate) unsafe fn track(
    header: NonNull<RecordHeader>,
    context: ContextKey,
) -> Result<HeldTicket, Error> {
    // SAFETY: the caller's promise.
    unsafe { tickets::track(header, context) }.ok_or(Error::TooManyPendingLaunches)
}

/// A record tracked for its launch ([`track_record`]): the caller owns it until its launch call has
/// returned, and then either [releases it](Tracked::refused) or [hands it over](Tracked::hand_over).
pub(crate) struct Tracked {
    header: NonNull<RecordHeader>,
    ticket: HeldTicket,
}

/// Tracks `record`, about to be launched into `context` ([`track`]); if that fails the record goes
/// back to the caller in the refusal.
#[inline]
pub(crate) fn track_record(record: OwnedRecord, context: ContextKey) -> Result<Tracked, Refusal> {
    let header = record.into_raw();
    // SAFETY: a live record (run-once, or a repeatable one that runs once), ours, untracked.
    match unsafe { track(header, context) } {
        Ok(ticket) => Ok(Tracked { header, ticket }),
        Err(e) => {
            // SAFETY: `header` came from `into_raw` just above; nobody else has it.
            Err(Refusal::back(e, unsafe { OwnedRecord::from_raw(header) }))
        }
    }
}

impl Tracked {
    /// The ticket to give the driver (a host function's user data, the poller's entry).
    #[inline]
    pub(crate) fn id(&self) -> TicketId {
        self.ticket.id
    }

    /// The launch call failed: the driver never had the record, which is the caller's again (to
    /// hand back; its ticket is given back with it, when it is unpacked or released).
    pub(crate) fn refused(self) -> OwnedRecord {
        // SAFETY: `header` came from `into_raw` in `track_record`; the launch was refused, so nobody
        // else has it (a reclaim never takes a launch whose ticket is still held).
        unsafe { OwnedRecord::from_raw(self.header) }
    }

    /// The launch call succeeded: hands the launch over to whoever runs it (the driver's thread,
    /// the poller), or queues the record for release if that already ran it.
    #[inline]
    pub(crate) fn hand_over(self) {
        if self.ticket.launched() == LaunchOver::Push {
            // SAFETY: the launch has run and no one else holds the record.
            unsafe { release::push(self.header) };
        }
    }
}

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
    let Some(ticket) = tickets::ticket(id.index()) else {
        return;
    };
    let Claim::Run(claim) = ticket.state.claim_run(id.generation()) else {
        return;
    };
    let Some(header) = ticket.record() else {
        return;
    };
    // The claim makes the launch's live record this call's to run, once.
    run(header);
    if ticket.state.run_over(id.generation(), claim) {
        // Ownership passes to `release` (no one else holds the record any more).
        release(header);
    }
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
    let mut candidates = Vec::new();
    tickets::for_each(|ticket| {
        if let Some(generation) = ticket.state.pending_generation()
            && ticket.context() == handle
        {
            candidates.push((ticket, generation, ticket.context_key()));
        }
    });
    if candidates.is_empty() {
        return 0;
    }
    let now = look();
    let mut count = 0;
    for (ticket, generation, key) in candidates {
        if now.is_gone(key, known)
            && ticket.state.claim_reclaim(generation)
            && let Some(record) = ticket.record()
        {
            // SAFETY: the reclaim owns the record now (its context is gone: its host function
            // will never run) and it is in no queue.
            unsafe { release::push(record) };
            count += 1;
        }
    }
    count
}

/// The context handles of the launches pending now, each once.
pub(crate) fn pending_handles() -> Vec<usize> {
    let mut handles = Vec::new();
    tickets::for_each(|ticket| {
        if ticket.state.is_pending() {
            handles.push(ticket.context());
        }
    });
    handles.sort_unstable();
    handles.dedup();
    handles
}

/// Launches of this crate whose host function has not run (nor been reclaimed), in `context` or in
/// all contexts. Walks the tickets: a diagnostic, not for hot paths.
pub(crate) fn count(context: Option<CUcontext>) -> usize {
    let mut n = 0;
    tickets::for_each(|ticket| {
        // The context is read after the state was seen pending (Acquire), so it is the one of that
        // launch, or of a later one if the ticket was reused meanwhile (a count is a snapshot).
        if ticket.state.is_pending() && context.is_none_or(|c| ticket.context() == c.addr()) {
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
