//! The user lane: where the crate's watching threads (the watcher) send the
//! user code they meet, so that none of it runs on a thread that watches completions.
//!
//! User code here is an owner's `Drop`, a [`spawn_after`](crate::spawn_after) callback, a caught
//! panic's report (the panic handler) and its payload's `Drop`. A watcher never runs them: it
//! pushes a record to the cleanup queue, whose thread (the reaper, or the user's drain in
//! [`CleanupMode::Manual`](crate::CleanupMode::Manual)) runs them. So an owner whose `Drop` blocks,
//! awaits a future of this crate, calls `flush` or `exit`, or panics, delays only the cleanup
//! queue, never the completion of other work.
//!
//! **Waking the lane.** A push from a driver thread wakes a parked reaper with `unpark`, and does
//! nothing while the reaper lingers (it looks again within its poll interval): a driver thread
//! must not pay for a futex wake. A watcher is a thread of this crate, which may: after its pushes
//! it rings the [`BELL`], which ends the reaper's linger at once, so a `release_after` owner is
//! dropped within a wake-up of its completion, not a poll interval later.

use std::ptr::NonNull;
use std::sync::Condvar;
use std::time::Duration;

use super::owned_record::OwnedRecord;
use super::release;
use crate::record::layout::{PanicPayload, Payload, RecordHeader};
use crate::record::payload::DeferredDrop;
use crate::support::panic_report::{PanicOrigin, report_and_drop};
use crate::support::sync::{Mutex, lock};

/// Rung by a watcher after it pushed to the cleanup queue; waited on by the lingering reaper.
struct Bell {
    rung: Mutex<bool>,
    ringing: Condvar,
}

static BELL: Bell = Bell {
    rung: Mutex::new(false),
    ringing: Condvar::new(),
};

/// Pushes a record to the cleanup queue from a watching thread of this crate (not a driver
/// thread): its release (owners dropped, and whatever else its payload's `Drop` does) runs on the
/// lane. Call [`ring`] after a round's pushes.
///
/// # Safety
/// `header` must be a live record that nobody else owns, in no queue.
pub(crate) unsafe fn push(header: NonNull<RecordHeader>) {
    // SAFETY: the caller's promise.
    unsafe { release::push(header) };
}

/// Sends `value` to the lane, which drops it.
pub(crate) fn drop_there<T: Send + 'static>(value: T) {
    // SAFETY: a new record, ours alone.
    unsafe { push(OwnedRecord::new(DeferredDrop(value)).into_raw()) };
}

/// Sends a caught panic to the lane, which reports it (the panic handler is user code) and drops
/// its payload.
pub(crate) fn report_there(origin: PanicOrigin, panic: PanicPayload) {
    drop_there(Report {
        origin,
        panic: Some(panic),
    });
}

/// Ends the reaper's linger at once, if it lingers (see the module's docs).
pub(crate) fn ring() {
    let mut rung = lock(&BELL.rung);
    *rung = true;
    BELL.ringing.notify_one();
}

/// The reaper's linger: waits until [`ring`] rang or `timeout` passed.
pub(crate) fn wait_for_ring(timeout: Duration) {
    let mut rung = lock(&BELL.rung);
    if !*rung {
        rung = BELL
            .ringing
            .wait_timeout(rung, timeout)
            .map_or_else(|p| p.into_inner().0, |(guard, _)| guard);
    }
    *rung = false;
}

/// A panic to report on the lane: reported and dropped as the record is released.
struct Report {
    origin: PanicOrigin,
    panic: Option<PanicPayload>,
}

impl Drop for Report {
    fn drop(&mut self) {
        if let Some(panic) = self.panic.take() {
            report_and_drop(self.origin, panic);
        }
    }
}

/// How often the lane tries to make a callback's context current before it drops the callback
/// unrun: a passing failure is tried again at once; a lasting one (a reset context) is not waited
/// for, so it does not hold up the lane.
const SET_CURRENT_TRIES: usize = 3;

/// A record to run on the lane, then release: what a watcher claimed for a callback, with the
/// context to make current while it runs. Its `Drop` (the lane's release of this carrier) does
/// both, putting the thread's current context back afterwards; `after` runs last (the event
/// transport takes the callback off its pool's count there, so that the pool keeps the context
/// retained until the callback ran).
pub(crate) struct Call<A: FnOnce() + Send + 'static> {
    header: NonNull<RecordHeader>,
    context: usize,
    after: Option<A>,
}

// SAFETY: the record is `Send` (every payload is), and only this carrier holds it.
unsafe impl<A: FnOnce() + Send + 'static> Send for Call<A> {}

impl<A: FnOnce() + Send + 'static> Call<A> {
    /// Sends the claimed record at `header` to the lane, which runs it with the context `context`
    /// (a handle) current and then releases it, then calls `after`.
    ///
    /// # Safety
    /// `header` must be a live record that nobody else owns, claimed to run once (its payload
    /// sound to run on a thread of this crate or a thread that drains, with `context` current).
    pub(crate) unsafe fn send(header: NonNull<RecordHeader>, context: usize, after: A) {
        drop_there(Call {
            header,
            context,
            after: Some(after),
        });
    }
}

impl<A: FnOnce() + Send + 'static> Payload for Call<A> {
    unsafe fn run(&mut self) {}
}

impl<A: FnOnce() + Send + 'static> Drop for Call<A> {
    fn drop(&mut self) {
        let driver = cuda_dl_sys::Driver::get();
        let mut before = std::ptr::null_mut();
        let context = std::ptr::with_exposed_provenance_mut(self.context);
        // SAFETY: a valid out-pointer; then the handle of a primary context that its event pool
        // retains until `after` ran (a context reset since is refused by the driver, or leaves a
        // context whose calls fail: its handle stays the primary context's). What was current is
        // put back afterwards; if that look fails, none is (the reaper keeps none current anyway).
        let entered = driver.is_some_and(|driver| unsafe {
            if driver.cuCtxGetCurrent(&mut before).is_err() {
                before = std::ptr::null_mut();
            }
            (0..SET_CURRENT_TRIES).any(|_| driver.cuCtxSetCurrent(context).is_ok())
        });
        if entered {
            // SAFETY: the record is ours alone and claimed to run once (`send`'s contract); its
            // payload catches its own panics.
            unsafe { RecordHeader::dispatch(self.header, crate::record::layout::Op::Run) };
        } else {
            release::count_callback_dropped_unrun();
        }
        // A callback whose context cannot be made current (after a reset, say) is dropped
        // unrun, with its captures.
        release::release_nested(self.header);
        if let (true, Some(driver)) = (entered, driver) {
            // SAFETY: the context that was current before (the thread's own, or none).
            let _ = unsafe { driver.cuCtxSetCurrent(before) };
        }
        if let Some(after) = self.after.take() {
            after();
        }
    }
}
