//! Stream-ordered work without a host function: [`release_after`] (drop owners once the stream's
//! earlier work has completed) and [`spawn_after`] (run a closure then, on a thread of this
//! crate, where CUDA calls are allowed). Both record an event on the stream, which the watcher thread
//! of this crate queries; the stream never waits for them.
//!
//! **Which to choose.** A host function ([`host_launch`](crate::host_launch),
//! [`launch_host_function`](crate::launch_host_function)) makes the *stream* wait until it has
//! run: use it when later work on the stream depends on what it does, or inside a graph (it is
//! captured as a node). Use these when nothing on the stream waits for the host side: releasing
//! what the GPU used, telling the host that work is done, enqueuing follow-up work. They cost a
//! fraction of a host function to enqueue, do not pass through the context's one driver thread,
//! and their closures may call CUDA.
//!
//! Both need CUDA 12.0 (`cuStreamGetId`) and a stream of a device's primary context (the one
//! cudarc and the CUDA runtime use; [`Error::NotPrimaryContext`] otherwise), which the crate
//! retains while it has events in use there.

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::launch_error::LaunchError;
use crate::reaper::owned_record::OwnedRecord;
use crate::record::layout::Payload;
use crate::record::payload::DeferredDrop;
#[cfg(doc)]
use crate::support::error::Error;
use crate::support::panic_report::{PanicOrigin, report_and_drop};
use crate::support::raw_stream::AsRawStream;
use crate::transport::event::{self, Work};
use crate::transport::watcher;

/// Keeps `owners` until all work enqueued on `stream` before this call has completed, then drops
/// them on the cleanup queue's thread (the reaper; in [`CleanupMode::Manual`](crate::CleanupMode::Manual),
/// whoever drains): never a driver thread, never the watcher (so an owner whose `Drop`
/// blocks, or awaits a future of this crate, delays no completion), never the caller's. One
/// `cuEventRecord`; no host function; the stream does not wait.
///
/// On a capturing stream the release is refused ([`Error::ReleaseDuringCapture`]): work enqueued
/// before the capture began is not in the graph, and nothing would tell when it completes. To keep
/// values alive as long as a graph, move them into a repeatable launch's closure on the capturing
/// stream ([`LaunchOptions::host_launch_repeatable`](crate::LaunchOptions::host_launch_repeatable)).
///
/// # Errors
/// A [`LaunchError`], which hands the owners back wherever no event was recorded: the work
/// enqueued before the call may still use them, so the caller decides (synchronize the stream,
/// then drop them).
/// - [`Error::ReleaseDuringCapture`] on a capturing stream: handed back; the capture is unharmed.
/// - [`Error::NotPrimaryContext`] for a stream of a context made with `cuCtxCreate`;
///   [`Error::NeedsNewerDriver`] before CUDA 12.0 (streams are told apart by `cuStreamGetId`); the
///   driver's errors (`cuEventRecord`, creating events);
///   [`Error::InsideHostFunction`] inside a host function; [`Error::TooManyPendingLaunches`];
///   [`Error::ForkedChild`]: handed back.
/// - [`Error::CaptureActive`] if another thread began a capture of the stream while this call ran:
///   kept ([`LaunchError::into_inner`] is `None`). The capture may hold the event, so it is never
///   queried, and the owners stay pending (counted by
///   [`pending_launches`](crate::pending_launches)) until the context is reset. Never early.
/// - [`Error::ThreadSpawn`] if the watcher thread could not be started: kept; the release was
///   accepted all the same (do not repeat it) and completes once a later call starts the watcher.
///
/// # Examples
/// ```
/// use cuda_host_launch::{release_after, Device, PrimaryContext, Stream};
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
/// let context = PrimaryContext::retain(Device::get(0)?)?;
/// let stream = Stream::new(&context)?;
/// let staging = vec![0u8; 1 << 20]; // read by a copy enqueued on the stream
/// // ... enqueue the copy ...
/// release_after(&stream, staging)?; // freed once the copy has completed
/// # Ok(()) }
/// ```
pub fn release_after<S: AsRawStream, O: Send + 'static>(
    stream: S,
    owners: O,
) -> Result<(), LaunchError<O>> {
    let record = OwnedRecord::new(DeferredDrop(owners));
    // SAFETY: the payload's run does nothing; its owners are dropped with the record.
    let ring = unsafe { event::enqueue(&stream, record, Work::Release) }.map_err(|refusal| {
        // SAFETY: the record was made just above with a `DeferredDrop<O>`.
        unsafe { LaunchError::unpack(refusal, |p: DeferredDrop<O>| Some(p.0)) }
    })?;
    // A watcher that cannot be started leaves the release accepted: kept.
    watcher::answer(ring).map_err(|e| LaunchError::new(e, None))
}

/// Runs `f` once all work enqueued on `stream` before this call has completed, on the cleanup
/// queue's thread (the reaper; in [`CleanupMode::Manual`](crate::CleanupMode::Manual), whoever
/// drains); the stream does not wait for it. Because that is not a driver thread, **`f` may call
/// CUDA**: free memory, enqueue more work, launch more releases or callbacks, and await a
/// completion of this crate (the watcher, which resolves those, runs no user code).
///
/// The callbacks of all streams run one after another on that one thread, with the owners of
/// released work, in the order their streams got there: a long callback delays the others and
/// the owners' drops (device work and futures are not delayed). A callback must not block waiting
/// for another callback or owner's drop; `flush` there returns
/// [`Error::FlushOnReleasingThread`]. A panic in `f` is caught and reported
/// ([`PanicOrigin::Callback`]); the thread goes on.
///
/// `f` runs with the stream's context current, and what it captured (and did not move out) is
/// dropped as it returns, in that context, as part of its run. A value that must be dropped with
/// no context current, as owners are, goes to [`release_after`] instead. If the context cannot
/// be made current (it was reset since), `f` is dropped unrun. After a sticky error in the
/// context (a trapped kernel) `f` never runs: the watcher's query that answers the error drops it
/// unrun, on the cleanup queue's thread, at once. Either way
/// [`CleanupStats::callbacks_dropped_unrun`](crate::CleanupStats::callbacks_dropped_unrun) counts
/// it.
///
/// # Errors
/// - [`Error::CaptureActive`] on a capturing stream (`f` cannot be ordered after work that only
///   exists in a graph: use a repeatable host function there,
///   [`LaunchOptions::host_launch_repeatable`](crate::LaunchOptions::host_launch_repeatable)):
///   `f` is handed back, unrun. If another thread began a capture of it while this call ran,
///   `CaptureActive` too, but kept ([`LaunchError::into_inner`] is `None`): `f` never runs; it
///   is dropped when the context is reset.
/// - As [`release_after`] otherwise: `f` is handed back, unrun, wherever no event was recorded.
///
/// # Examples
/// ```
/// use cuda_host_launch::{spawn_after, Device, PrimaryContext, Stream};
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
/// let context = PrimaryContext::retain(Device::get(0)?)?;
/// let stream = Stream::new(&context)?;
/// spawn_after(&stream, || println!("the stream got here"))?;
/// # Ok(()) }
/// ```
pub fn spawn_after<S, F>(stream: S, f: F) -> Result<(), LaunchError<F>>
where
    S: AsRawStream,
    F: FnOnce() + Send + 'static,
{
    let record = OwnedRecord::new(Callback(Some(f)));
    // SAFETY: the payload's run calls a `Send` closure once on the cleanup queue's thread (a
    // thread of this crate, or one that drains: never a driver thread), catching panics.
    let ring = unsafe { event::enqueue(&stream, record, Work::Call) }.map_err(|refusal| {
        // SAFETY: the record was made just above with a `Callback<F>` (a refused one never ran,
        // so it still holds `f`).
        unsafe { LaunchError::unpack(refusal, |p: Callback<F>| p.0) }
    })?;
    // A watcher that cannot be started leaves the callback accepted: kept.
    watcher::answer(ring).map_err(|e| LaunchError::new(e, None))
}

/// A [`spawn_after`] callback: called once, its panic reported where it ran.
struct Callback<F>(Option<F>);

impl<F: FnOnce() + Send + 'static> Payload for Callback<F> {
    unsafe fn run(&mut self) {
        if let Some(f) = self.0.take()
            && let Err(panic) = catch_unwind(AssertUnwindSafe(f))
        {
            // The cleanup queue's thread runs user code: the handler may run here.
            report_and_drop(PanicOrigin::Callback, panic);
        }
    }
}
