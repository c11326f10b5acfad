//! The one submit path of a ticketed launch (a host function's, an event's): the step of the
//! protocol where the record passes from its launcher to whoever runs it (see the module above).

use crate::reaper::owned_record::OwnedRecord;
use crate::reaper::release;
use crate::record::launch_state::LaunchOver;
use crate::record::ticket_id::TicketId;
use crate::record::tickets;
use crate::support::context_key::ContextKey;
use crate::support::error::Error;

use super::refusal::Refusal;

/// Submits `record`, about to be launched into `context`: takes a ticket for it and holds the
/// launch (LAUNCHING: no reclaim takes it meanwhile), then calls `launch` with the ticket's id (the
/// transport's launch call: `cuLaunchHostFunc` with the id as `userData`, or `cuEventRecord` with
/// the id kept for the watcher).
///
/// - `launch` returns `Ok`: the driver has the launch. It is handed over (PENDING) to whoever runs
///   it (the driver's thread, the watcher) or a reclaim; if its host function ran meanwhile, the
///   record is queued for release here. Returns the ticket's id (the watcher's entry names it)
///   and what `launch` returned.
/// - `launch` returns `Err`: the driver never had it. The record is the caller's again and goes
///   back in the [`Refusal`], with the error (its ticket is given back as it is unpacked or
///   released).
///
/// # Errors
/// [`Error::TooManyPendingLaunches`] if every ticket is in use, or `launch`'s error; the record
/// goes back with either.
#[inline]
pub(crate) fn submit<T>(
    record: OwnedRecord,
    context: ContextKey,
    launch: impl FnOnce(TicketId) -> Result<T, Error>,
) -> Result<(TicketId, T), Refusal> {
    let header = record.into_raw();
    // SAFETY: a live record (run-once, or a repeatable one that runs once), ours, untracked.
    let Some(held) = (unsafe { tickets::track(header, context) }) else {
        // SAFETY: `header` came from `into_raw` just above; nobody else has it.
        let record = unsafe { OwnedRecord::from_raw(header) };
        return Err(Refusal::back(Error::TooManyPendingLaunches, record));
    };
    let id = held.id;
    match launch(id) {
        Ok(launched) => {
            // The driver has it: hand it over (or, if its host function already ran, queue it).
            if held.launched() == LaunchOver::Push {
                // SAFETY: the launch has run and no one else holds the record.
                unsafe { release::push(header) };
            }
            Ok((id, launched))
        }
        Err(error) => {
            // SAFETY: `header` came from `into_raw` above; the launch was refused, so nobody
            // else has it (a reclaim never takes a launch whose ticket is still held).
            let record = unsafe { OwnedRecord::from_raw(header) };
            Err(Refusal::back(error, record))
        }
    }
}
