//! Futures of stream work: [`completion`] (all work enqueued so far has finished) and
//! [`host_launch_async`] (a closure's result, in stream order). Runtime-agnostic: only
//! `std::task::Waker`.
//!
//! Four ways to learn that the stream got there ([`CompletionMode`]):
//! - `Auto` (the default, and [`completion`]): `Event` where it can, else `HostFunction` (a
//!   stream of a context made with `cuCtxCreate`, or a driver before 12.0).
//! - `Event`: no host function. The stream records an event, which the watcher of this crate
//!   (thread `cuda-hl-events`, which also wakes the task) queries (see
//!   [`spawn_after`](crate::spawn_after)); the watcher spins briefly after news, then looks at
//!   pauses that grow with the wait (1/16 of it, 20 µs to 250 µs: see
//!   [`PollerSettings`](crate::PollerSettings)). While it has events in a context the crate
//!   retains that primary context (until about 100 ms after the last completion), so a raw
//!   `cuDevicePrimaryCtxReset` meanwhile breaks its contract: reset through
//!   [`PrimaryContext::reset`](crate::PrimaryContext::reset) (`RELIABILITY.md`, "Primary contexts
//!   only").
//! - `HostFunction`: a host function of this crate completes the future and wakes the task with
//!   `wake_by_ref` on the driver's thread. The wake waits for the driver's thread to wake up (tens
//!   of microseconds), and that thread is shared with every other host function of the context.
//! - `LowLatency`: no host function. The stream writes a flag into host memory
//!   (`cuStreamWriteValue64`) and the watcher thread of this crate wakes the task (see
//!   `transport/low_latency.rs`): a few microseconds after any wait, at the cost of a core that spins
//!   while such a future waits.
//!
//! **Which to choose.** `Auto`, unless one of these matters more than the default's latency and
//! enqueue cost, which `BENCHMARKS.md` gives measured: `HostFunction` costs no CPU at all while a
//! future waits, where the watcher costs CPU for as long as any future waits, and its wake-up
//! does not depend on how long the wait was (the watcher sees a completion up to 1/16 of its wait
//! late, at most `max_interval`). `LowLatency` wakes
//! soonest and keeps a core busy meanwhile. [`host_launch_async`] always wakes from its own host function: the result
//! exists only once that function has run, on the driver's thread, so another transport would only
//! add a step.
//!
//! A future whose context fails (a sticky error) resolves to [`Error::ContextLost`] once the
//! context is reset or destroyed and its pending launches reclaimed (see [`crate::reclaim_pending`]):
//! the driver never runs the host function, so without the reclaim it could never resolve.
//! Dropping a future early is fine: the host function (or the flag write) still happens, and
//! everything is released as usual; the waker is dropped with the shared state, never on a driver
//! thread.
//!
//! A waker that panics when woken does not unwind into the driver (nor stop the low-latency
//! poller): the panic is caught where the wake happened and reported through the panic handler
//! ([`PanicOrigin::Waker`]) by the thread that releases the launch's record (or by the watcher); the
//! future is resolved all the same.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::launch_error::LaunchError;
use crate::reaper::owned_record::OwnedRecord;
use crate::record::layout::{PanicPayload, Payload};
use crate::support::context_key::ContextKey;
use crate::support::error::Error;
use crate::support::panic_report::{PanicOrigin, report_and_drop};
use crate::support::raw_stream::AsRawStream;
use crate::transport::completion_state::{CompletionState, WatchedFuture};
use crate::transport::event::{self, Work};
use crate::transport::host_function::{Runs, enqueue_in};
use crate::transport::low_latency;
use crate::transport::options::LaunchOptions;
use crate::transport::watcher;

/// How a completion learns that the stream reached it (see the module's docs for which to choose).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum CompletionMode {
    /// `Event` where it can, `HostFunction` for a stream of a context that is not a device's
    /// primary context, or on a driver before 12.0 (the default).
    #[default]
    Auto,
    /// A host function of this crate: no CPU while the future waits, any stream of any context.
    HostFunction,
    /// A flag written by the stream into host memory and a polling thread: lower latency, no
    /// host function, some CPU while futures wait. Needs CUDA 12.0 (`cuCtxGetId`).
    LowLatency,
    /// An event recorded on the stream, which the watcher of this crate queries (see
    /// [`spawn_after`](crate::spawn_after)): no host function, the cheapest enqueue. Needs CUDA
    /// 12.0 and a stream of a primary context.
    Event,
}

/// A future that resolves once the work enqueued on a stream before [`completion`] was called has
/// finished.
///
/// # Errors (as its output)
/// [`Error::ContextLost`] if the context had a sticky error and was then reset or destroyed.
#[must_use = "a completion does nothing unless awaited (dropping it early is fine)"]
pub struct Completion {
    shared: Arc<CompletionState<()>>,
}

impl Completion {
    /// Blocks the calling thread until the completion resolves: for synchronous code and tests,
    /// where there is no async runtime (in async code, `.await` it instead).
    ///
    /// # Errors
    /// What awaiting it returns ([`Error::ContextLost`]); [`Error::InsideHostFunction`] inside a
    /// host function, which must not wait for the stream (its driver thread would wait for
    /// itself); [`Error::WaitOnWatcher`] on the crate's watcher (its start hook, a waker it calls),
    /// for the same reason.
    ///
    /// # Examples
    /// ```
    /// use cuda_host_launch::{completion, host_launch, Device, PrimaryContext, Stream};
    /// # fn main() -> Result<(), cuda_host_launch::Error> {
    /// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
    /// let context = PrimaryContext::retain(Device::get(0)?)?;
    /// let stream = Stream::new(&context)?;
    /// host_launch(&stream, || println!("in stream order"))?;
    /// completion(&stream)?.wait()?; // the host function has run
    /// # Ok(()) }
    /// ```
    pub fn wait(self) -> Result<(), Error> {
        crate::support::block_on::wait("Completion::wait", self)
    }
}

impl Future for Completion {
    type Output = Result<(), Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.shared.poll_result(cx)
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("pending", &self.shared.is_pending())
            .finish()
    }
}

/// A future of all work enqueued on `stream` so far ([`CompletionMode::Auto`]: an event the
/// crate's poller queries where it can, a host function elsewhere).
///
/// # Errors
/// As [`spawn_after`](crate::spawn_after) or [`host_launch`](crate::host_launch): the driver
/// cannot be loaded, the stream is capturing ([`Error::CaptureActive`]), a driver error, or this
/// is a host function.
///
/// # Examples
/// ```
/// use cuda_host_launch::{completion, Device, PrimaryContext, Stream};
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
/// let context = PrimaryContext::retain(Device::get(0)?)?;
/// let stream = Stream::new(&context)?;
/// // ... enqueue work on the stream, then wait for it: `.await` in async code (no thread
/// // blocked), or `wait()` in synchronous code:
/// completion(&stream)?.wait()?;
/// # Ok(()) }
/// ```
pub fn completion<S: AsRawStream>(stream: S) -> Result<Completion, Error> {
    CompletionMode::Auto.completion(stream)
}

impl CompletionMode {
    /// [`completion`] in this mode.
    ///
    /// # Errors
    /// A capturing stream is refused with [`Error::CaptureActive`] in every mode.
    /// - `Auto`: as [`completion`].
    /// - `Event`: as [`spawn_after`](crate::spawn_after), [`Error::NotPrimaryContext`] included
    ///   (a capture another thread began while this call ran is refused too).
    /// - `HostFunction`: as [`host_launch`](crate::host_launch).
    /// - `LowLatency`: the errors of `cuStreamWriteValue64`, of `cuCtxGetId` (`DriverTooOld`
    ///   before 12.0) and of registering the flag memory (`cuMemHostRegister`). The stream is
    ///   looked at again after the flag write: a capture another thread began meanwhile took the
    ///   write into its graph, and the completion is refused too (that flag slot is never used
    ///   again, so replays of the graph resolve nothing). A capture begun and also ended while this
    ///   call runs goes unseen: that future resolves at the graph's first replay, and no later
    ///   future is resolved by a replay.
    ///
    /// # Examples
    /// ```
    /// use cuda_host_launch::{CompletionMode, Device, PrimaryContext, Stream};
    /// # fn main() -> Result<(), cuda_host_launch::Error> {
    /// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
    /// let context = PrimaryContext::retain(Device::get(0)?)?;
    /// let stream = Stream::new(&context)?;
    /// // Woken by the watcher thread a few microseconds after the stream gets there (`.await` it
    /// // in async code).
    /// CompletionMode::LowLatency.completion(&stream)?.wait()?;
    /// # Ok(()) }
    /// ```
    pub fn completion<S: AsRawStream>(self, stream: S) -> Result<Completion, Error> {
        let shared = match self {
            CompletionMode::Auto => match by_event(&stream) {
                Err(e) if event_unavailable(&e) => by_host_function(&stream),
                done => done,
            }?,
            CompletionMode::Event => by_event(&stream)?,
            CompletionMode::HostFunction => by_host_function(&stream)?,
            CompletionMode::LowLatency => {
                let shared = CompletionState::new();
                let ring = low_latency::register(&stream, Arc::clone(&shared))?;
                watcher::answer(ring)?;
                shared
            }
        };
        Ok(Completion { shared })
    }
}

/// A completion's record: runs when the stream got there.
fn completion_record(shared: &Arc<CompletionState<()>>) -> OwnedRecord {
    OwnedRecord::new(CompletionPayload::new(shared))
}

/// `CompletionMode::HostFunction`'s enqueue.
fn by_host_function(stream: &impl AsRawStream) -> Result<Arc<CompletionState<()>>, Error> {
    let shared = CompletionState::new();
    // SAFETY: the payload's run only stores a flag and wakes a waker by reference. A refused
    // record holds only the shared state: released here (no one waits on it).
    let launched = unsafe {
        enqueue_in(
            stream,
            completion_record(&shared),
            Runs::Once,
            &LaunchOptions::default(),
        )
    }
    .map_err(|refusal| refusal.error)?;
    watch_for_faults(launched, &shared);
    Ok(shared)
}

/// Has a future that waits on a host function watched for a fault of its context (the driver
/// never runs the host function after one): see `low_latency::watch_for_faults`. A watcher that
/// cannot be started leaves the future unwatched: it then resolves at the context's reset, as
/// before; the launch itself succeeded.
fn watch_for_faults<T: Send + 'static>(
    launched: Option<ContextKey>,
    shared: &Arc<CompletionState<T>>,
) {
    if let Some(key) = launched {
        let future = Box::new(WatchedFuture(Arc::downgrade(shared)));
        let _ = watcher::answer(low_latency::watch_for_faults(key, future));
    }
}

/// `CompletionMode::Event`'s enqueue.
fn by_event(stream: &impl AsRawStream) -> Result<Arc<CompletionState<()>>, Error> {
    let shared = CompletionState::new();
    let work = Work::Wake(Arc::clone(&shared));
    // SAFETY: the payload's run only stores a flag and wakes a waker by reference. A refused
    // record holds only the shared state: released here (no one waits on it).
    let ring = unsafe { event::enqueue(stream, completion_record(&shared), work) }
        .map_err(|refusal| refusal.error)?;
    watcher::answer(ring)?;
    Ok(shared)
}

/// Whether `Event` refused a completion for a reason that `HostFunction` does not share (then
/// nothing was enqueued, and the refused future was never seen).
fn event_unavailable(error: &Error) -> bool {
    matches!(
        error,
        Error::NotPrimaryContext { .. }
            | Error::NeedsNewerDriver { .. }
            | Error::Cuda(
                cuda_dl_sys::Error::DriverTooOld { .. } | cuda_dl_sys::Error::SymbolMissing { .. }
            )
    )
}

/// The record of a host-function or event completion, and the part of a [`host_launch_async`]
/// record that completes its future: the future's shared state, failed if released unrun.
struct CompletionPayload<T> {
    shared: Arc<CompletionState<T>>,
    /// The waker's panic when the run woke it, carried to the releasing thread.
    waker_panic: Option<PanicPayload>,
}

impl<T> CompletionPayload<T> {
    fn new(shared: &Arc<CompletionState<T>>) -> Self {
        CompletionPayload {
            shared: Arc::clone(shared),
            waker_panic: None,
        }
    }

    /// Resolves the future to `result` and wakes its task (by reference), keeping a waker's panic.
    fn complete(&mut self, result: Result<T, PanicPayload>) {
        self.waker_panic = self.shared.complete(result);
    }
}

impl<T> CompletionPayload<T> {
    /// Its context is gone: fails the future now, on the reclaiming thread (see `Op::Lost`),
    /// keeping a waker's panic for the release.
    fn lost(&mut self) {
        // A lost record never ran: no waker's panic is kept yet.
        if self.waker_panic.is_none() {
            self.waker_panic = self.shared.fail();
        }
    }
}

impl Payload for CompletionPayload<()> {
    unsafe fn run(&mut self) {
        self.complete(Ok(()));
    }

    fn lost(&mut self) {
        CompletionPayload::lost(self);
    }
}

impl<T> Drop for CompletionPayload<T> {
    fn drop(&mut self) {
        // Released without having run: the context was lost (or the launch failed, in which case
        // no one waits on the future). Runs on the releasing thread, never a driver thread.
        let failed = self.shared.fail();
        report_waker_panics(self.waker_panic.take(), failed);
    }
}

/// Reports and drops the panics of a record's waker (on the releasing thread, never a driver
/// thread: its `Drop` runs there).
fn report_waker_panics(ran: Option<PanicPayload>, failed: Option<PanicPayload>) {
    for panic in [ran, failed].into_iter().flatten() {
        report_and_drop(PanicOrigin::Waker, panic);
    }
}

/// A future of a host closure's result: see [`host_launch_async`].
#[must_use = "the closure runs anyway; the future only carries its result"]
pub struct HostLaunchFuture<T> {
    shared: Arc<CompletionState<T>>,
}

impl<T> HostLaunchFuture<T> {
    /// Blocks the calling thread until the closure has run, and returns its result: as
    /// [`Completion::wait`].
    ///
    /// # Errors
    /// As [`Completion::wait`], and [`Error::HostFunctionPanicked`] if the closure panicked.
    pub fn wait(self) -> Result<T, Error> {
        crate::support::block_on::wait("HostLaunchFuture::wait", self)
    }
}

impl<T> Future for HostLaunchFuture<T> {
    type Output = Result<T, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.shared.poll_result(cx)
    }
}

impl<T> std::fmt::Debug for HostLaunchFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLaunchFuture")
            .field("pending", &self.shared.is_pending())
            .finish()
    }
}

/// Runs `f` in stream order (as [`host_launch`](crate::host_launch)) and returns a future of its
/// result. A panic in `f` resolves the future to [`Error::HostFunctionPanicked`].
///
/// `f` is called once through `&mut` (its captures are dropped afterwards, off the driver's
/// thread; [`host_launch`](crate::host_launch) says why that makes the bound `FnMut`). Its result is made on the driver's thread and moved to the awaiting task; if the future
/// was dropped, the result is dropped with the launch record, off the driver's thread.
///
/// # Errors
/// As [`host_launch`](crate::host_launch): the [`LaunchError`] hands `f` back, unrun.
///
/// # Examples
/// ```
/// use cuda_host_launch::{host_launch_async, Device, PrimaryContext, Stream};
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
/// let context = PrimaryContext::retain(Device::get(0)?)?;
/// let stream = Stream::new(&context)?;
/// let thread = host_launch_async(&stream, || std::thread::current().name().map(String::from))?;
/// println!("ran on {:?}", thread.wait()?); // `thread.await?` in async code
/// # Ok(()) }
/// ```
pub fn host_launch_async<S, F, T>(stream: S, f: F) -> Result<HostLaunchFuture<T>, LaunchError<F>>
where
    S: AsRawStream,
    F: FnMut() -> T + Send + 'static,
    T: Send + 'static,
{
    let shared = CompletionState::new();
    let record = OwnedRecord::new(AsyncPayload {
        f,
        done: CompletionPayload::new(&shared),
    });
    // SAFETY: the payload's run calls a `Send` closure once, catching panics, then stores the
    // result and wakes by reference.
    let launched = unsafe { enqueue_in(&stream, record, Runs::Once, &LaunchOptions::default()) }
        .map_err(|refusal| {
            // SAFETY: the record was made just above with an `AsyncPayload<F, T>`. Its shared
            // state is dropped with it (the future was never returned: no one waits).
            unsafe { LaunchError::unpack(refusal, |p: AsyncPayload<F, T>| Some(p.f)) }
        })?;
    watch_for_faults(launched, &shared);
    Ok(HostLaunchFuture { shared })
}

/// A [`host_launch_async`] record: the closure, and what completes its future (which fails it if
/// the record is released unrun).
struct AsyncPayload<F, T> {
    f: F,
    done: CompletionPayload<T>,
}

impl<F: FnMut() -> T + Send + 'static, T: Send + 'static> Payload for AsyncPayload<F, T> {
    unsafe fn run(&mut self) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut self.f));
        self.done.complete(result);
    }

    fn lost(&mut self) {
        self.done.lost();
    }
}
