//! A record its launcher still owns: built, not yet handed to the driver (or handed back), and
//! what an enqueue that failed gives back ([`Refusal`]).

use std::ffi::c_void;
use std::ptr::NonNull;

use super::release::release_here_or_defer;
use crate::record::layout::{self, Payload, RecordHeader, SharedPayload};
use crate::record::tickets;
use crate::support::error::Error;

/// A record not yet handed to the driver: releasing it is this value's job, so every early return
/// and error path drops the owners on the current thread (or, on a driver thread, defers them).
pub(crate) struct OwnedRecord(NonNull<RecordHeader>);

impl OwnedRecord {
    /// A run-once record of `payload`: pooled when small.
    #[inline]
    pub(crate) fn new<P: Payload>(payload: P) -> Self {
        OwnedRecord(layout::new_record(payload))
    }

    /// A repeatable launch's record of `payload` (it may be captured): pooled when small.
    #[inline]
    pub(crate) fn repeatable<P: SharedPayload>(payload: P) -> Self {
        OwnedRecord(layout::new_shared_record(payload))
    }

    /// A graph host node's record of `payload`: always boxed (it lives as long as its graph).
    pub(crate) fn graph_node<P: SharedPayload>(payload: P) -> Self {
        OwnedRecord(layout::new_node_record(payload))
    }

    /// A record holding a copy of `bytes` for `f`; `None` if the size overflows the address space.
    pub(crate) fn bytes(f: unsafe extern "C" fn(*mut c_void), bytes: &[u8]) -> Option<Self> {
        layout::new_bytes_record(f, bytes).map(OwnedRecord)
    }

    /// The address to pass as `userData`.
    pub(crate) fn as_user_data(&self) -> *mut c_void {
        self.0.as_ptr().cast()
    }

    /// Hands ownership to the driver (the trampoline will release it).
    pub(crate) fn into_raw(self) -> NonNull<RecordHeader> {
        let header = self.0;
        std::mem::forget(self);
        header
    }

    /// Takes ownership of a record previously turned `into_raw` whose launch did not happen.
    ///
    /// # Safety
    /// `header` must come from [`OwnedRecord::into_raw`] and not be owned by anyone else.
    pub(crate) unsafe fn from_raw(header: NonNull<RecordHeader>) -> Self {
        OwnedRecord(header)
    }

    /// The payload, moved out of the record (which is freed; its ticket, if it was tracked, given
    /// back): what a launch the driver never took hands back to its caller. Nothing is dropped.
    ///
    /// # Safety
    /// The record must have been made with a payload of type `P`, and never run.
    pub(crate) unsafe fn into_payload<P>(self) -> P {
        let header = self.into_raw();
        tickets::forget(header);
        // SAFETY: ours, live, of payload `P` (the caller's promise), never run, in no queue; its
        // ticket was given back just above.
        unsafe { layout::take_payload(header) }
    }
}

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

impl Drop for OwnedRecord {
    fn drop(&mut self) {
        release_here_or_defer(self.0);
    }
}

// SAFETY: a record's payload is `Send` (every payload type requires it), and the record is used by
// one thread at a time: the launcher, then the driver's thread, then a releasing thread.
unsafe impl Send for OwnedRecord {}
