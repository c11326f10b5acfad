//! A record its launcher still owns: built, not yet handed to the driver (or handed back: see
//! `enqueue::refusal`).

use std::ffi::c_void;
use std::ptr::NonNull;

use super::release::release_here_or_defer;
use crate::record::layout::{self, Payload, RecordHeader, SharedPayload};
use crate::record::tickets;

/// A record not yet handed to the driver: releasing it is this value's job, so every early return
/// and error path drops the owners on the current thread (or, on a driver thread, defers them).
pub(crate) struct OwnedRecord(NonNull<RecordHeader>);

impl OwnedRecord {
    /// A run-once record of `payload`: pooled when small.
    #[inline]
    pub(crate) fn new<P: Payload>(payload: P) -> Self {
        OwnedRecord(layout::new_record(payload))
    }

    /// A run-once record of `payload` that lives as long as a graph: always boxed.
    pub(crate) fn boxed<P: Payload>(payload: P) -> Self {
        OwnedRecord(layout::new_boxed_record(payload))
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

impl Drop for OwnedRecord {
    fn drop(&mut self) {
        release_here_or_defer(self.0);
    }
}

// SAFETY: a record's payload is `Send` (every payload type requires it), and the record is used by
// one thread at a time: the launcher, then the driver's thread, then a releasing thread.
unsafe impl Send for OwnedRecord {}
