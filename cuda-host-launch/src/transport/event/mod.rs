//! The event transport: the crate learns that the stream reached a point from an event recorded
//! there (`cuEventRecord`), which the watcher thread of this crate queries. No host function: the
//! enqueue is one event record (plus two capture queries and the stream's id), the stream never
//! waits, the context's driver thread is not involved, and the work that follows (dropping owners,
//! running a callback, waking a future) happens on threads of this crate, where CUDA calls are
//! allowed.
//!
//! - **Records and tickets as for host functions.** What runs at completion is a launch record
//!   (owners to drop, a callback, a future's wake-up) held by a ticket (see `record::tickets`): the
//!   poller claims it as the trampoline would, so a reclaim after a context loss and the poller
//!   release it exactly once, and [`pending_launches`](crate::pending_launches) counts it.
//! - **Events** come from a pool per primary context ([`pools`]), which retains the context while
//!   it has events out. Contexts are named by handle and `cuCtxGetId` (`support::context_key`):
//!   a primary context made again at the same handle gets a pool of its own, and a reclaim
//!   forgets only the pools and entries of contexts that are gone.
//! - **Completion is in order per stream**: the poller queries the newest event of a stream
//!   first and, if it completed, completes every older one of that stream without a query; the
//!   stream is told apart by its `cuStreamGetId` (CUDA 12.0), not its handle, which a later stream
//!   may reuse. "Older" is known only among one thread's records (two threads' hand-overs to the
//!   poller may cross their records), so the queues are per stream and enqueuing thread. See
//!   [`poller`].
//! - **Capture.** An event recorded on a capturing stream is a capture marker, not a node: it never
//!   completes in stream order, and querying it while the capture lives returns
//!   `CUDA_ERROR_CAPTURED_EVENT` *and invalidates the user's capture*. So the stream is looked at
//!   before the record: on a capturing stream everything is refused (a callback with
//!   [`Error::CaptureActive`]; a release with [`Error::ReleaseDuringCapture`], since work enqueued
//!   before the capture began is not in the graph and nothing tells when it completes, so tying
//!   the owners to the graph could release them while that work still runs: seen on the real
//!   driver). And it is looked at again
//!   after the record: a capture another thread began in between may hold the event, which is then
//!   never queried; its work stays pending until the context is reset (never early), and the call
//!   returns [`Error::CaptureActive`]. A capture begun and also ended between the two looks goes
//!   unseen here, but the event's query then answers `CUDA_ERROR_INVALID_VALUE` (the real driver's
//!   answer for an event recorded only in a capture), and the watcher treats it the same way.
//! - **A sticky error** (a query that answers a device fault; any other failure strands the
//!   stream's work the same way, but one that passes, as out of memory, is retried in a later
//!   round) means the stream's work will never complete: its futures resolve at once to
//!   [`Error::DeviceFault`] with the driver's code, and the stream's entries stay pending
//!   until the context is reset or destroyed, when the reclaim releases them (owners dropped,
//!   callbacks never run). Not earlier: device work of
//!   other streams may still use what the owners hold until the context is torn down. The pool
//!   gives its retain back as soon as none of its events is out (stranded ones are left to the
//!   context), so the user's last release destroys the context and reclaims its work.

mod learned_wait;
mod poller;
mod pools;

use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use crate::enqueue::admit::admit;
use crate::enqueue::refusal::Refusal;
use crate::enqueue::submit::submit;
use crate::reaper::owned_record::OwnedRecord;
use crate::record::ticket_id::TicketId;
use crate::support::capture::{Capture, capture_active, capture_of, captured_since};
use crate::support::context_key::{ContextKey, Gone, Liveness};
use crate::support::error::Error;
use crate::support::raw_stream::{AsRawStream, context_key_of};
use crate::support::sync::lock;
use crate::support::thread_slots::{AllLocked, Handover, Slot};
use crate::transport::bell::Ring;
use crate::transport::completion_state::CompletionState;

/// What a stream-ordered record does when its event completes, which also says what it does on a
/// stream that is capturing when it is enqueued, and where its user code runs (never on the
/// poller: see `reaper::lane`).
#[derive(Clone)]
pub(crate) enum Work {
    /// Nothing runs: the record only holds owners, which its release drops on the cleanup
    /// queue's thread. On a capturing stream it is refused with [`Error::ReleaseDuringCapture`]:
    /// the work enqueued before the capture began is not in the graph, and nothing tells when it
    /// completes.
    Release,
    /// A callback runs on the cleanup queue's thread, in the stream's context. On a capturing
    /// stream it is refused with [`Error::CaptureActive`]: the run cannot be ordered after work
    /// that only exists in a graph.
    Call,
    /// A future's wake: the poller completes the future's state (and calls its waker, as every
    /// reactor does); the record is released on the cleanup queue's thread. If the stream's
    /// context fails, the poller resolves the future to [`Error::DeviceFault`] at once; the record
    /// stays pending for the context's reclaim. Refused on a capturing stream as `Call`.
    Wake(Arc<CompletionState<()>>),
}

impl Work {
    fn calls(&self) -> bool {
        matches!(self, Work::Call)
    }

    /// The public call that enqueues this work, for errors.
    fn operation(&self) -> &'static str {
        match self {
            Work::Release => "release_after",
            Work::Call => "spawn_after",
            Work::Wake(_) => "an event completion (CompletionMode::Event)",
        }
    }
}

/// One recorded event and the record to complete when it completes.
pub(in crate::transport) struct Entry {
    /// The stream's context (handle and id: see `support::context_key`).
    context: ContextKey,
    /// The stream's `cuStreamGetId`.
    stream: u64,
    /// The enqueuing thread's number (its slot's: `support::thread_slots`): one thread's records on a
    /// stream are in the stream's order, and so in its queue; two threads' are not (each records,
    /// then hands over, and the hand-overs may cross), so they get a queue each.
    thread: u64,
    event: usize,
    ticket: TicketId,
    work: Work,
    /// When the watcher took it from the hand-over (`None` until then): what its stream's
    /// learned wait is measured from (see `learned_wait`).
    arrived: Option<std::time::Instant>,
}

/// The hand-over from the enqueuing threads to the watcher: a slot per thread
/// (`support::thread_slots`), whose stash keeps the thread's completed events.
static HANDOVER: LazyLock<Handover<Entry, ContextKey>> = LazyLock::new(Handover::new);
static POOLS: LazyLock<Mutex<pools::Pools>> = LazyLock::new(Mutex::default);

/// A slot for threads whose own is gone (their thread-local storage is being torn down).
static SHARED_SLOT: LazyLock<Arc<Slot<Entry, ContextKey>>> = LazyLock::new(|| HANDOVER.register());

thread_local! {
    static SLOT: Arc<Slot<Entry, ContextKey>> = HANDOVER.register();
}

/// The calling thread's slot, and the number its entries get (see `support::thread_slots`).
fn my_slot() -> (Arc<Slot<Entry, ContextKey>>, u64) {
    SLOT.try_with(|slot| (Arc::clone(slot), slot.number()))
        .unwrap_or_else(|_| (Arc::clone(&SHARED_SLOT), HANDOVER.number()))
}

fn pools() -> MutexGuard<'static, pools::Pools> {
    lock(&POOLS)
}

/// `error`, from resolving a function that `operation` needs: [`Error::NeedsNewerDriver`] if the
/// driver is too old for it (which names the operation and the version, not only the function).
fn needs_newer_driver(error: cuda_dl_sys::Error, operation: &'static str) -> Error {
    match error {
        cuda_dl_sys::Error::DriverTooOld {
            function,
            required,
            found,
            ..
        } => Error::NeedsNewerDriver {
            operation,
            function,
            required: cuda_dl_sys::DriverVersion(i32::try_from(required).unwrap_or(i32::MAX)),
            found,
        },
        other => Error::Cuda(other),
    }
}

/// Records an event on `stream` and hands `record` to the watcher, which completes it (runs its
/// payload on its own thread, then queues it for release) once the event completed; returns the
/// ring for the caller to answer (`watcher::answer`: a watcher that cannot be started leaves the
/// work accepted, and the crate keeps it). On an error the record goes back in the [`Refusal`]
/// wherever no event of it was recorded; the crate keeps it only once the event is recorded (a
/// capture may hold it: pending until its context is gone).
///
/// # Safety
/// The record's payload must be sound to run once on the poller's thread (a thread of this crate
/// where CUDA calls are allowed).
pub(crate) unsafe fn enqueue(
    stream: &impl AsRawStream,
    record: OwnedRecord,
    work: Work,
) -> Result<Ring, Refusal> {
    let raw = stream.as_raw_stream();
    // Everything asked before an event is taken: an error gives the record back.
    let checks = || -> Result<_, Error> {
        let admitted = admit("enqueuing a stream-ordered release or callback")?;
        // After `admit`: a forked child is refused before it takes a lock that a thread of its
        // parent may have held at the fork.
        let (slot, number) = my_slot();
        let driver = admitted.driver;
        let record_event = driver.raw().cuEventRecord()?;
        // What the poller calls for this entry, resolved now: a driver without them refuses the
        // work here, rather than leave it pending for good.
        driver.raw().cuEventQuery()?;
        if work.calls() {
            driver.raw().cuCtxSetCurrent()?;
            driver.raw().cuCtxGetCurrent()?;
        }
        // 12.0: streams are told apart by their id (see the module's docs).
        let stream_id = driver
            .raw()
            .cuStreamGetId()
            .map_err(|e| needs_newer_driver(e, work.operation()))?;
        if let Capture::Active { id, .. } = capture_of(driver, raw)? {
            return Err(match work {
                Work::Call | Work::Wake(_) => capture_active(raw, id),
                Work::Release => Error::ReleaseDuringCapture {
                    stream: raw.addr(),
                    capture_id: id,
                },
            });
        }
        let context = context_key_of(driver, stream)?;
        // An event of this thread's stash (no lock but its slot's), else the context's pool,
        // which refuses a context that is not primary before anything else is asked.
        let stashed = slot.lock().take_stashed(context);
        let event = match stashed {
            Some(event) => std::ptr::with_exposed_provenance_mut(event),
            None => match take_from_pool(driver, context) {
                Ok(event) => event,
                Err(e) => {
                    // A pool this call made, whose first events could not be created, holds its
                    // context retained: given back as a refused event's pool is.
                    give_back_refused(driver, &slot, context, None);
                    return Err(e);
                }
            },
        };
        Ok((
            admitted,
            slot,
            number,
            record_event,
            stream_id,
            context,
            event,
        ))
    };
    let (admitted, slot, number, record_event, stream_id, context, event) = match checks() {
        Ok(checked) => checked,
        Err(e) => return Err(Refusal::back(e, record)),
    };
    let driver = admitted.driver;
    let id = match stream.ids_hint() {
        Some(ids) => ids.stream,
        None => {
            let mut id = 0;
            // SAFETY: a valid stream (the `AsRawStream` guarantee) and out-pointer.
            let code = unsafe { stream_id(raw, &mut id) };
            if let Err(e) = driver.check(code, "cuStreamGetId") {
                give_back_refused(driver, &slot, context, Some(event));
                return Err(Refusal::back(e.into(), record));
            }
            id
        }
    };
    let submitted = submit(record, context, |_| {
        // SAFETY: an event of the stream's context (its pool's), and a valid stream.
        let code = unsafe { record_event(event, raw) };
        driver.check(code, "cuEventRecord")?;
        // A capture another thread began since the first look may hold the event.
        Ok(captured_since(driver, raw))
    });
    // From here the watcher (or a reclaim) owns the record, unless it came back refused.
    let (ticket_id, captured) = match submitted {
        Ok(submitted) => submitted,
        Err(refusal) => {
            // Not recorded (or no ticket): the record goes back, and the event to its pool.
            give_back_refused(driver, &slot, context, Some(event));
            return Err(refusal);
        }
    };
    if let Some(error) = captured {
        // Never queried: pending until the context is gone, which the pool does not hold up (it
        // gives its retain back once none of its events is out). The crate keeps the record.
        let released = {
            let mut pools = pools();
            pools.strand(context);
            pools.give_back_done(driver, false)
        };
        for (device, handle) in released {
            crate::transport::reclaim_after_release(driver, device, handle);
        }
        return Err(Refusal::kept(error));
    }
    let ring = {
        let mut held = slot.lock();
        slot.hand_over(
            &mut held,
            Entry {
                context,
                stream: id,
                thread: number,
                event: event.expose_provenance(),
                ticket: ticket_id,
                work,
                arrived: None,
            },
        );
        // Under the slot's lock: the watcher cannot decide to stop meanwhile.
        super::bell::ring_events(|| HANDOVER.take_wake())
    };
    drop(slot);
    admitted.finish();
    Ok(ring)
}

/// An event of `context`'s pool. A dry pool's batch is made here with the pools' lock let go (its
/// reservation keeps the pool): the watcher's rounds and the other threads' enqueues, which take
/// that lock, do not wait for this thread's `cuEventCreate` calls.
fn take_from_pool(
    driver: &cuda_dl_sys::Driver,
    context: ContextKey,
) -> Result<cuda_dl_sys::types::CUevent, Error> {
    // Its own statement: the pools' lock is let go before the events are made.
    let taken = pools().take(driver, context)?;
    if let Some(event) = taken {
        return Ok(event);
    }
    let mut made = Vec::with_capacity(pools::BATCH);
    let result = pools::make_events(driver, context.raw(), &mut made);
    let event = pools().settle(context, &mut made, result.is_ok());
    result?;
    // Some whenever `make_events` succeeded (it made one at least); a null event would be
    // refused by its record, as an error.
    Ok(event.unwrap_or(std::ptr::null_mut()))
}

/// Gives back the event of an enqueue that failed (if it took one), and the pool too if none of
/// its events is out and no poller runs: a pool holds its context retained, and only the poller
/// gives idle pools back (when it goes idle), so without one a pool that a failed enqueue made
/// would keep its context, and the work pending there, for good (a context whose sticky error has
/// surfaced refuses every record). Under the thread's slot's lock, then the pools', as the
/// watcher decides to stop (under every slot's): either it still runs and gives the pool back
/// when it stops, or it is gone and this does (no stash holds an event then: the watcher takes
/// them back as it stops, and only a watcher fills them).
fn give_back_refused(
    driver: &cuda_dl_sys::Driver,
    slot: &Slot<Entry, ContextKey>,
    context: ContextKey,
    event: Option<cuda_dl_sys::types::CUevent>,
) {
    let released = {
        // Held as the watcher decides to stop: it still runs, or it is gone.
        let _held = slot.lock();
        let mut pools = pools();
        if let Some(event) = event {
            pools.give_back(driver, context, event);
        }
        if !super::bell::running() {
            pools.give_back_if_idle(driver, context)
        } else {
            None
        }
    };
    if let Some((device, handle)) = released {
        crate::transport::reclaim_after_release(driver, device, handle);
    }
}

/// Forgets the pools and queued entries of the contexts of `handle` that are gone (`look`,
/// `known`: see `support::context_key`): the poller never queries their events again, and
/// their pools' retains are released. Their records stay pending, for the reclaim.
pub(crate) fn forget_gone(handle: usize, look: &dyn Fn() -> Liveness, known: Gone) {
    poller::forget_gone(handle, look, known);
}

/// The context handles that have an event pool.
pub(crate) fn pool_handles() -> Vec<usize> {
    pools().handles()
}

/// The watcher's event side, and what it needs to decide to stop.
pub(super) use poller::{EventWatch, queues};

/// Runs `f` with every slot of the hand-over locked (see `support::thread_slots`): the watcher decides to
/// stop under them.
pub(super) fn with_all_slots_locked<R>(
    f: impl FnOnce(&mut AllLocked<'_, '_, Entry, ContextKey>) -> R,
) -> R {
    HANDOVER.with_all_locked(f)
}

/// The watcher stops, or looks now: no enqueue need wake it.
pub(super) fn no_wake_needed() {
    HANDOVER.looking();
}

/// Makes the watcher's event side give its pools back (destroying their events and releasing
/// their contexts' retains) as soon as nothing is pending and no event is out, and waits until no
/// pool is left, or `deadline` passes (false). False at once on the watcher itself.
pub(crate) fn wait_until_given_back(deadline: Option<std::time::Instant>) -> bool {
    poller::wait_until_given_back(deadline)
}

/// Runs `reset` (a reset of the primary context of `handle`) while the poller queries nothing,
/// and if it succeeds forgets the context that was reset (as [`forget_gone`] does, under the same
/// lock: the reset destroyed its events; their records stay pending, for the reclaim). If it
/// fails, nothing is forgotten: the context lives on and its events still complete.
pub(crate) fn around_reset<T, E>(
    handle: usize,
    reset: impl FnOnce() -> Result<T, E>,
    look: &dyn Fn() -> Liveness,
    known: Gone,
) -> Result<T, E> {
    poller::around_reset(handle, reset, look, known)
}
