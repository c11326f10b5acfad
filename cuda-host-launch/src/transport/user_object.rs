//! Tying a repeatable record to a graph with a CUDA user object, so the graph (and every executable
//! graph made from it) owns the record, and the record is released only once they are all gone.

use std::ffi::c_void;
use std::ptr::{self, NonNull};

use cuda_dl_sys::types::{
    CUgraph, CUresult, CUuserObject, CUuserObject_flags, CUuserObjectRetain_flags,
};

use crate::enqueue::refusal::Refusal;
use crate::reaper::owned_record::OwnedRecord;
use crate::reaper::release;
use crate::record::layout::RecordHeader;
use crate::support::error::Error;

/// A record the graph now owns through a user object.
pub(crate) struct GraphOwnedRecord {
    graph: CUgraph,
    object: CUuserObject,
    header: NonNull<RecordHeader>,
}

impl GraphOwnedRecord {
    /// Creates a user object for `record` with two references, and moves one to `graph`
    /// (`cuUserObjectCreate` with `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, then `cuGraphRetainUserObject`
    /// with `CU_GRAPH_USER_OBJECT_MOVE`); the other is the caller's until [`settle`](Self::settle)
    /// or [`detach`](Self::detach), so that the record outlives the call that adds its node,
    /// whatever happens to the graph meanwhile (another thread may end a capture and destroy its
    /// graph). The destructor only queues the record for release.
    ///
    /// Done *before* the node that uses the record is added, so that no failure can leave a node
    /// pointing at freed data: if resolving or creating fails, the record goes back in the refusal
    /// (nothing else has it); if retaining fails, the user object is released, which queues the
    /// record (kept: the user object's destructor may run at any time after that).
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
        let user_data = record.as_user_data();
        let mut object: CUuserObject = ptr::null_mut();
        // SAFETY: `object` is a valid place to write; `user_data` is a live record, which the user
        // object owns from here on (its destructor queues it); two initial references (the
        // graph's, moved below, and the caller's).
        let code = unsafe {
            create(
                &mut object,
                user_data,
                Some(user_object_destructor),
                2,
                CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0,
            )
        };
        if code != CUresult::CUDA_SUCCESS {
            // No user object: the record is still ours, handed back.
            return Err(Refusal::back(
                driver_error(driver, code, "cuUserObjectCreate"),
                record,
            ));
        }
        let header = record.into_raw();
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
            // Dropping our references destroys the object, whose destructor queues the record.
            // SAFETY: we hold both references.
            let _ = unsafe { release(object, 2) };
            return Err(Refusal::kept(driver_error(
                driver,
                code,
                "cuGraphRetainUserObject",
            )));
        }
        Ok(GraphOwnedRecord {
            graph,
            object,
            header,
        })
    }

    /// The `userData` for the node.
    pub(crate) fn user_data(&self) -> *mut std::ffi::c_void {
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

    /// Undoes `attach` after the node could not be added: if `graph_lives` (as for
    /// [`settle`](Self::settle)), the graph and the caller let their references go, and the
    /// destructor queues the record (if the graph's release fails, the record is released with the
    /// graph: no node uses it). Otherwise the graph's handle may be dead, and is not touched: the
    /// caller's reference is kept for good, as in `settle`.
    pub(crate) fn detach(self, driver: &cuda_dl_sys::Driver, graph_lives: bool) {
        if !graph_lives {
            return;
        }
        if let Ok(release) = driver.raw().cuGraphReleaseUserObject() {
            // SAFETY: the graph (alive) holds the one reference `attach` moved to it.
            let _ = unsafe { release(self.graph, self.object, 1) };
        }
        self.let_go(driver);
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
/// only queues the record: no lock, no allocation, no CUDA call.
///
/// # Safety
/// Called by the driver only, with the pointer given to `cuUserObjectCreate`.
pub(crate) unsafe extern "C" fn user_object_destructor(user_data: *mut c_void) {
    if let Some(header) = NonNull::new(user_data.cast::<RecordHeader>()) {
        // SAFETY: the last reference is gone, so nothing runs the record any more; it is ours.
        unsafe { release::push(header) };
    }
}
