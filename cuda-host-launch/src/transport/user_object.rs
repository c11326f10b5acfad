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
    /// Creates a user object for `record` and moves its only reference to `graph`
    /// (`cuUserObjectCreate` with `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`, then `cuGraphRetainUserObject`
    /// with `CU_GRAPH_USER_OBJECT_MOVE`). The destructor only queues the record for release.
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
        // object owns from here on (its destructor queues it); one initial reference.
        let code = unsafe {
            create(
                &mut object,
                user_data,
                Some(user_object_destructor),
                1,
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
        // SAFETY: `graph` is a live graph (the caller's), `object` holds our one reference.
        let code = unsafe {
            retain(
                graph,
                object,
                1,
                CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0,
            )
        };
        if code != CUresult::CUDA_SUCCESS {
            // Dropping our reference destroys the object, whose destructor queues the record.
            // SAFETY: we hold one reference.
            let _ = unsafe { release(object, 1) };
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

    /// Undoes `attach` after the node could not be added: the graph lets its reference go, and the
    /// destructor queues the record. If even that fails, the record stays owned by the graph and is
    /// released with it: nothing dangles (no node uses it) and nothing leaks past the graph.
    pub(crate) fn detach(self, driver: &cuda_dl_sys::Driver) {
        if let Ok(release) = driver.raw().cuGraphReleaseUserObject() {
            // SAFETY: the graph holds the one reference `attach` moved to it.
            let _ = unsafe { release(self.graph, self.object, 1) };
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
