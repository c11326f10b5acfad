//! Tying a repeatable record to a graph with a CUDA user object, so the graph (and every executable
//! graph made from it) owns the record, and the record is released only once they are all gone.
//!
//! The user object owns a small **holder** record that points at the launch's record, not the
//! launch's record itself: the object's destructor may run on a driver thread at any time after
//! its last reference goes, so a call that fails after creating it could not take the record back
//! from it. Through the holder it can: it takes the pointer out before letting its references go,
//! and hands the record back to its caller ([`GraphOwnedRecord::detach`]); the destructor then
//! queues the empty holder. Otherwise the holder's release releases the record with it.

use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, Ordering};

use cuda_dl_sys::types::{
    CUgraph, CUresult, CUuserObject, CUuserObject_flags, CUuserObjectRetain_flags,
};

use crate::enqueue::refusal::Refusal;
use crate::reaper::owned_record::OwnedRecord;
use crate::reaper::release;
use crate::record::layout::{self, Payload, RecordHeader};
use crate::support::error::Error;

/// What the user object owns: the launch's record, until a failed call takes it back.
struct Holder(AtomicPtr<RecordHeader>);

impl Payload for Holder {
    /// Never launched: the node's `userData` is the record it holds.
    unsafe fn run(&mut self) {}
}

impl Drop for Holder {
    /// Released (on a releasing thread) once the user object is gone: the record it still holds
    /// goes with it.
    fn drop(&mut self) {
        if let Some(record) = NonNull::new(*self.0.get_mut()) {
            release::release_nested(record);
        }
    }
}

/// Takes the record out of a live holder: no node uses it (the call that would have added one
/// failed), so it is its caller's again.
///
/// # Safety
/// `holder` must be a live holder record (made in `attach`), whose record no node uses.
unsafe fn take_back(holder: NonNull<RecordHeader>) -> Option<OwnedRecord> {
    // SAFETY: a live record of payload `Holder` (the caller's promise), never run.
    let cell = unsafe { layout::payload::<Holder>(holder) };
    let record = NonNull::new(cell.0.swap(ptr::null_mut(), Ordering::AcqRel))?;
    // SAFETY: the holder owned the record, and gave it up just above; no node uses it.
    Some(unsafe { OwnedRecord::from_raw(record) })
}

/// A record the graph now owns through a user object.
pub(crate) struct GraphOwnedRecord {
    graph: CUgraph,
    object: CUuserObject,
    /// The launch's record: the node's `userData`.
    header: NonNull<RecordHeader>,
    /// The user object's data (see the module documentation).
    holder: NonNull<RecordHeader>,
}

impl GraphOwnedRecord {
    /// Creates a user object for `record` with two references, and moves one to `graph`
    /// (`cuUserObjectCreate` with `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, then `cuGraphRetainUserObject`
    /// with `CU_GRAPH_USER_OBJECT_MOVE`); the other is the caller's until [`settle`](Self::settle)
    /// or [`detach`](Self::detach), so that the record outlives the call that adds its node,
    /// whatever happens to the graph meanwhile (another thread may end a capture and destroy its
    /// graph). The destructor only queues the holder for release.
    ///
    /// Done *before* the node that uses the record is added, so that no failure can leave a node
    /// pointing at freed data. If any step fails, the record goes back in the refusal: nothing
    /// else uses it (a failed retain lets the object go after taking the record out of its
    /// holder).
    pub(crate) fn attach(
        driver: &cuda_dl_sys::Driver,
        graph: CUgraph,
        record: OwnedRecord,
    ) -> Result<GraphOwnedRecord, Refusal> {
        let functions = || -> Result<_, Error> {
            Ok((
                driver.raw().cuUserObjectCreate()?,
                driver.raw().cuGraphRetainUserObject()?,
                driver.raw().cuUserObjectRelease()?,
            ))
        };
        let (create, retain, release) = match functions() {
            Ok(functions) => functions,
            Err(e) => return Err(Refusal::back(e, record)),
        };
        let header = record.into_raw();
        // Boxed: it lives as long as the graph (see `layout::new_boxed_record`).
        let holder = OwnedRecord::boxed(Holder(AtomicPtr::new(header.as_ptr()))).into_raw();
        // SAFETY: the holder was made just above and is ours.
        let back = |holder| unsafe { take_back(holder) };
        let mut object: CUuserObject = ptr::null_mut();
        // SAFETY: `object` is a valid place to write; `holder` is a live record, which the user
        // object owns from here on (its destructor queues it); two initial references (the
        // graph's, moved below, and the caller's).
        let code = unsafe {
            create(
                &mut object,
                holder.as_ptr().cast(),
                Some(user_object_destructor),
                2,
                CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0,
            )
        };
        if code != CUresult::CUDA_SUCCESS {
            // No user object: the holder and the record are still ours.
            let record = back(holder);
            // SAFETY: made above, owned by nobody else, empty now.
            drop(unsafe { OwnedRecord::from_raw(holder) });
            let error = driver_error(driver, code, "cuUserObjectCreate");
            return Err(Refusal::back_if_taken(error, record));
        }
        // SAFETY: `graph` is a live graph (the caller's), `object` holds our two references.
        let code = unsafe {
            retain(
                graph,
                object,
                1,
                CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0,
            )
        };
        if code != CUresult::CUDA_SUCCESS {
            // No node uses the record: taken back, then dropping our references destroys the
            // object, whose destructor queues the empty holder.
            let record = back(holder);
            // SAFETY: we hold both references.
            let _ = unsafe { release(object, 2) };
            let error = driver_error(driver, code, "cuGraphRetainUserObject");
            return Err(Refusal::back_if_taken(error, record));
        }
        Ok(GraphOwnedRecord {
            graph,
            object,
            header,
            holder,
        })
    }

    /// The `userData` for the node.
    pub(crate) fn user_data(&self) -> *mut c_void {
        self.header.as_ptr().cast()
    }

    /// After the node was added: `in_graph` says that it is a node of the graph `attach` was
    /// given (the graph lived throughout: the caller's, or a capture that is still the same one).
    /// The caller's reference then goes, and the graph alone owns the record. Otherwise (a capture
    /// another thread ended meanwhile) the launch may be a plain host function on the stream or a
    /// node of another capture, whose calls no one can count: the caller's reference is kept for
    /// good, and the record with it (a leak, never a use after free).
    pub(crate) fn settle(self, driver: &cuda_dl_sys::Driver, in_graph: bool) {
        if in_graph {
            self.let_go(driver);
        }
    }

    /// Undoes `attach` after the node could not be added (the call failed, so nothing uses the
    /// record): takes the record back for the caller, and lets the caller's reference go. The
    /// graph's goes too if `graph_lives` (as for [`settle`](Self::settle)); otherwise its handle
    /// may be dead and is not touched (the object, with the empty holder, goes with the graph).
    /// If the graph's release fails, the holder goes with the graph.
    pub(crate) fn detach(
        self,
        driver: &cuda_dl_sys::Driver,
        graph_lives: bool,
    ) -> Option<OwnedRecord> {
        // SAFETY: our holder, alive while we hold our reference; the node was not added.
        let record = unsafe { take_back(self.holder) };
        if graph_lives && let Ok(release) = driver.raw().cuGraphReleaseUserObject() {
            // SAFETY: the graph (alive) holds the one reference `attach` moved to it.
            let _ = unsafe { release(self.graph, self.object, 1) };
        }
        self.let_go(driver);
        record
    }

    /// Lets the caller's reference go.
    fn let_go(self, driver: &cuda_dl_sys::Driver) {
        if let Ok(release) = driver.raw().cuUserObjectRelease() {
            // SAFETY: the caller's reference, released once (this consumes `self`).
            let _ = unsafe { release(self.object, 1) };
        }
    }
}

fn driver_error(driver: &cuda_dl_sys::Driver, code: CUresult, function: &'static str) -> Error {
    Error::Cuda(driver.describe(code, Some(function)).into())
}

/// The destructor of the user object that ties a repeatable record to its graph: the driver calls it
/// (on a thread of its own) once the graph and every executable graph made from it are gone. It
/// only queues the holder (whose release releases the record): no lock, no allocation, no CUDA
/// call.
///
/// # Safety
/// Called by the driver only, with the pointer given to `cuUserObjectCreate`.
pub(crate) unsafe extern "C" fn user_object_destructor(user_data: *mut c_void) {
    if let Some(header) = NonNull::new(user_data.cast::<RecordHeader>()) {
        // SAFETY: the last reference is gone, so nothing runs the record any more; the holder (and
        // the record in it, if any) is ours.
        unsafe { release::push(header) };
    }
}
