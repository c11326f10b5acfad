//! The host-function transport: the crate learns that the stream reached a launch when the driver
//! runs the launch's host function, [`trampoline`], on its thread. A run-once launch hands the
//! driver its ticket; a repeatable one (possibly captured into a graph) hands it the record, owned
//! by the graph through a user object.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;

use super::options::{LaunchCall, LaunchOptions};
use super::user_object::GraphOwnedRecord;
use crate::enqueue::admit::admit;
use crate::enqueue::pending;
use crate::enqueue::refusal::Refusal;
use crate::enqueue::submit::submit;
use crate::reaper::owned_record::OwnedRecord;
use crate::reaper::release;
use crate::record::layout::{Op, RecordHeader, SharedPayload};
use crate::record::payload::PanicCarrier;
use crate::record::ticket_id::TicketId;
use crate::support::capture::{
    Capture, capture_active, capture_graph_legacy, capture_id_now, capture_of,
};
use crate::support::context_key::ContextKey;
use crate::support::error::Error;
use crate::support::host_thread::HostFunctionScope;
use crate::support::raw_stream::{AsRawStream, context_key_of};

/// Whether a launch's record may run more than once.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Runs {
    /// Runs once; refused on a capturing stream.
    Once,
    /// May run many times; captured as a graph node on a capturing stream.
    Repeatable,
}

/// Enqueues a built record on `stream`. On an error the record goes back in the [`Refusal`]
/// wherever the driver never took it; only once a graph's user object owns it (a launch on a
/// capturing stream whose node could not be added) does the crate keep it, and the user object
/// releases it.
///
/// # Safety
/// The record's payload must be sound to run as `runs` says on the driver's thread.
pub(crate) unsafe fn enqueue(
    stream: &impl AsRawStream,
    record: OwnedRecord,
    runs: Runs,
    options: &LaunchOptions,
) -> Result<(), Refusal> {
    // SAFETY: the caller's promise.
    unsafe { enqueue_in(stream, record, runs, options) }.map(|_| ())
}

/// As [`enqueue`]; returns the context of a launch that went to the driver as a host function
/// (`None`: captured into a graph), for a future to be watched for faults there.
///
/// # Safety
/// As [`enqueue`].
pub(crate) unsafe fn enqueue_in(
    stream: &impl AsRawStream,
    record: OwnedRecord,
    runs: Runs,
    options: &LaunchOptions,
) -> Result<Option<ContextKey>, Refusal> {
    let target = stream;
    let stream = stream.as_raw_stream();
    // Everything asked before the record is handed anywhere: an error gives it back.
    let checks = || -> Result<_, Error> {
        let admitted = admit("launching a host function")?;
        let call = LaunchCall::resolve(admitted.driver, options)?;
        let capture = capture_of(admitted.driver, stream)?;
        Ok((admitted, call, capture))
    };
    let (admitted, call, capture) = match checks() {
        Ok(checked) => checked,
        Err(e) => return Err(Refusal::back(e, record)),
    };
    let driver = admitted.driver;
    let mut launched = None;
    match (capture, runs) {
        (Capture::None, _) => {
            let context = match context_key_of(driver, target) {
                Ok(context) => context,
                Err(e) => return Err(Refusal::back(e, record)),
            };
            submit(record, context, |ticket| {
                // SAFETY: `trampoline` claims the launch through its ticket, runs the record once
                // and queues it; the ticket is never freed, so any call (even a late one) is
                // sound. The stream's validity is the `AsRawStream` guarantee.
                let (code, function) =
                    unsafe { call.call(stream, trampoline, ticket.as_user_data()) };
                driver.check(code, function).map_err(Error::from)
            })?;
            launched = Some(context);
        }
        (Capture::Active { id, .. }, Runs::Once) => {
            return Err(Refusal::back(capture_active(stream, id), record));
        }
        (Capture::Active { id, graph }, Runs::Repeatable) => {
            // User objects (11.3) come first: below them a captured launch cannot be owned by its
            // graph, and the 11.3 capture query below would not exist either.
            let (graph, id) = match captured_graph(driver, stream, id, graph) {
                Ok(captured) => captured,
                Err(e) => return Err(Refusal::back(e, record)),
            };
            let owned = GraphOwnedRecord::attach(driver, graph, record)?;
            // SAFETY: the captured node's function runs the record on every replay, through `&self`;
            // the graph owns the record until it and its executables are destroyed, and the
            // attach's own reference keeps it alive across this call whatever happens to the graph.
            let (code, function) =
                unsafe { call.call(stream, trampoline_repeatable, owned.user_data()) };
            // The capture asked about before, still there (active, or invalidated and not yet
            // ended): it went on throughout, and its graph lives, so the launch is a node of
            // that graph (or, refused, touched none). Otherwise another thread ended it meanwhile
            // (and may have destroyed its graph): see `GraphOwnedRecord::settle`.
            let same_capture = capture_id_now(driver, stream) == Some(id);
            if let Err(error) = driver.check(code, function) {
                // Refused, so no node uses the record: taken back from the user object, which
                // goes (with the graph's reference, if the graph is surely alive).
                let record = owned.detach(driver, same_capture);
                return Err(Refusal::back_if_taken(error.into(), record));
            }
            owned.settle(driver, same_capture);
        }
    }
    admitted.finish();
    Ok(launched)
}

/// The graph and id of the capture a repeatable launch on a capturing stream goes into (`graph`
/// and `id`, or asked of the driver where its capture query gave no graph, nor a true id: before
/// 12.3), once user objects are known to exist (11.3). A capture that ended since the first look
/// refuses the launch (`CaptureActive`, the record handed back: the caller may launch again).
fn captured_graph(
    driver: &cuda_dl_sys::Driver,
    stream: cuda_dl_sys::types::CUstream,
    id: u64,
    graph: cuda_dl_sys::types::CUgraph,
) -> Result<(cuda_dl_sys::types::CUgraph, u64), Error> {
    driver.raw().cuUserObjectCreate()?;
    if !graph.is_null() {
        return Ok((graph, id));
    }
    capture_graph_legacy(driver, stream)?.ok_or_else(|| capture_active(stream, id))
}

/// The host function the driver calls for every run-once launch of this crate: `userData` is the
/// launch's ticket id (see `record::tickets`).
///
/// Claims the launch (one compare-and-swap on its ticket: from then on neither a reclaim nor a
/// later call can take it), runs the record's payload, then pushes the record onto the cleanup
/// queue, unless its launcher still holds it (see `record::launch_state`). Takes no lock, allocates
/// nothing, calls no CUDA function and never drops an owner.
///
/// # Safety
/// Called by the driver only, with the `userData` of a launch made by this crate.
pub(crate) unsafe extern "C" fn trampoline(user_data: *mut c_void) {
    let Some(id) = TicketId::from_user_data(user_data) else {
        return;
    };
    // A call of a launch that ran already, was reclaimed, or is over (a replay of a graph that
    // captured a run-once launch, after the first) is not this call's to run.
    pending::run_launch(id, |header| {
        let _scope = HostFunctionScope::enter();
        // SAFETY: `run_launch` hands the launch's live record claimed for this call, to run once
        // on this thread.
        unsafe { RecordHeader::dispatch(header, Op::Run) };
    });
}

/// The host function for repeatable records: runs the payload and keeps the record (its graph owns
/// it and releases it through `user_object_destructor`).
///
/// # Safety
/// Called by the driver only, with the `userData` of a node made by this crate.
pub(crate) unsafe extern "C" fn trampoline_repeatable(user_data: *mut c_void) {
    let Some(header) = NonNull::new(user_data.cast::<RecordHeader>()) else {
        return;
    };
    let _scope = HostFunctionScope::enter();
    // SAFETY: the record is live while its graph is; repeatable records run through `&self`.
    unsafe { RecordHeader::dispatch(header, Op::Run) };
}

/// A closure that may run many times: panics are caught on every run and sent to the cleanup queue
/// to be reported.
pub(crate) struct RepeatableClosure<F>(pub(crate) F);

impl<F: Fn() + Send + Sync + 'static> SharedPayload for RepeatableClosure<F> {
    unsafe fn run_shared(&self) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(&self.0)) {
            // Allocating here is fine: the panic machinery has just allocated the payload too.
            let carrier = OwnedRecord::new(PanicCarrier(Some(panic)));
            // SAFETY: a fresh record, handed to the queue, which reports and frees it.
            unsafe { release::push(carrier.into_raw()) };
        }
    }
}
