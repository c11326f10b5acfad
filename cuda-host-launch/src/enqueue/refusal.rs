//! An enqueue that failed: the error, and what the caller gave if it is still theirs.

use crate::reaper::owned_record::OwnedRecord;
use crate::support::error::Error;

/// An enqueue that failed: the error, and the record if it is still the caller's (the driver never
/// took it, and nothing else holds it). `record: None` when the crate keeps it: a capture may hold
/// what was enqueued (pending until the context is gone), the work was accepted and only a later
/// step failed, or a graph's user object owns it (released with the user object).
///
/// Dropping a refusal with its record releases the record as [`OwnedRecord`]'s `Drop` does; a
/// public call gives the caller's values back instead ([`OwnedRecord::into_payload`]).
pub(crate) struct Refusal {
    pub(crate) error: Error,
    pub(crate) record: Option<OwnedRecord>,
}

impl Refusal {
    /// The driver never took `record`: it goes back to the caller with `error`.
    pub(crate) fn back(error: Error, record: OwnedRecord) -> Refusal {
        Refusal {
            error,
            record: Some(record),
        }
    }

    /// The record goes back if the failed step could take it back (`Some`), else the crate keeps
    /// it.
    pub(crate) fn back_if_taken(error: Error, record: Option<OwnedRecord>) -> Refusal {
        Refusal { error, record }
    }

    /// The crate keeps the record (see [`Refusal`]): only the error goes back.
    pub(crate) fn kept(error: Error) -> Refusal {
        Refusal {
            error,
            record: None,
        }
    }

    /// The payload handed back, if the record is the caller's, mapped by `take` to what the
    /// caller gave (its owners, its closure).
    ///
    /// # Safety
    /// The record must have been made with a payload of type `P`.
    pub(crate) unsafe fn unpack<P, T>(self, take: impl FnOnce(P) -> T) -> (Error, Option<T>) {
        // SAFETY: a refused record never ran; its payload type is the caller's promise.
        let value = self
            .record
            .map(|record| take(unsafe { record.into_payload::<P>() }));
        (self.error, value)
    }
}
