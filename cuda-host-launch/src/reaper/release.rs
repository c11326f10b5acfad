//! Releasing records: from the cleanup queue (by the reaper, a drain or a flush), or at once when a
//! record never reached the driver; and waiting for the queue to empty ([`flush`]).
//!
//! Releasing a record drops its owners inside `catch_unwind`: a panicking `Drop` is reported through
//! the panic handler and the next record is released as usual.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::Condvar;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::batches::{Batches, FlushMark};
use super::queue::CleanupQueue;
use crate::record::layout::{Op, RecordHeader};
use crate::record::{pool, tickets};
use crate::support::error::Error;
use crate::support::host_thread::in_host_function;
use crate::support::intrusive_stack::Batch;
use crate::support::panic_report::{PanicOrigin, report_and_drop};
use crate::support::sync::{Mutex, lock};
use crate::support::thread_settings::CrateThread;
use crate::support::{crate_threads, exit_gate, forked_child};

/// The longest single wait of `flush` before it looks again.
const FLUSH_SLICE: Duration = Duration::from_millis(2);

/// The process's cleanup queue.
pub(crate) static QUEUE: CleanupQueue<RecordHeader> = CleanupQueue::new();

/// The batches taken from the queue (see `batches.rs`): taken under this lock, and a flush waits
/// on `FLUSHED` with it.
static BATCHES: Mutex<Batches> = Mutex::new(Batches::new());
static FLUSHED: Condvar = Condvar::new();

/// Pushes a record to be released: one whose host function has run (from the trampoline), one
/// whose graph is gone (from a user object's destructor), or a deferred drop.
///
/// May be called on a driver thread: no allocation, no lock, no CUDA call, no drop.
///
/// # Safety
/// `header` must be a live record that nobody else owns.
#[inline]
pub(crate) unsafe fn push(header: NonNull<RecordHeader>) {
    // SAFETY: the caller's promise.
    unsafe { QUEUE.push(header) };
}

/// Releases a record that was never handed to the driver: here, unless this is a driver thread, in
/// which case the record goes to the cleanup queue instead.
pub(crate) fn release_here_or_defer(header: NonNull<RecordHeader>) {
    if in_host_function() {
        // SAFETY: the record is ours and in no queue.
        unsafe { push(header) };
    } else {
        release_one(header, None);
    }
}

/// The reaper's current context, kept at none: a launch's owners are dropped with no context
/// current on the reaper, whatever an earlier owner's `Drop` made current (a binding's buffer
/// binds its own context, and leaves it current). Only on the reaper, this crate's own thread: a
/// thread that drains in manual mode is the user's, whose current context is theirs.
///
/// None rather than the launch's context: that handle may be dead by now (a context the user
/// created and destroyed after the host function ran), and a dead handle must not reach the
/// driver; `cuCtxSetCurrent(NULL)` is always sound. Owners that need a context bind their own.
#[derive(Default)]
pub(crate) struct ReaperContext {
    /// Whether the thread's current context is known to be none.
    clear: bool,
}

impl ReaperContext {
    /// Before a launch's owners are dropped: no context current.
    fn enter(&mut self, driver: &cuda_dl_sys::Driver) {
        if !self.clear {
            self.clear_now(driver);
        }
    }

    /// After a drop that was not looked after, or other code of the thread made a context
    /// current: what is current is not known.
    pub(crate) fn forget(&mut self) {
        self.clear = false;
    }

    /// After a launch's owners were dropped: none current again, if their `Drop` made one so.
    fn after_drop(&mut self, driver: &cuda_dl_sys::Driver) {
        self.clear_now(driver);
    }

    /// Clears the current context: asks first (a call less when none is), and clears anyway when
    /// the question fails (after a sticky error it may), since what is current is not known.
    ///
    /// `cuCtxSetCurrent(NULL)` pops one context off the thread's stack: a context pushed under it
    /// (user code's, or one a failed `cuCtxPopCurrent` left, such as an event batch's made by an
    /// enqueue in an owner's `Drop`) is current after it. So the question is asked again after
    /// each clear, and the thread is known clear only once it answers none; after a failed
    /// question it is not known, and the next record asks again.
    fn clear_now(&mut self, driver: &cuda_dl_sys::Driver) {
        self.clear = false;
        for _ in 0..CLEAR_TRIES {
            let mut now = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            let asked = unsafe { driver.cuCtxGetCurrent(&mut now) };
            if asked.is_ok() && now.is_null() {
                self.clear = true;
                return;
            }
            // SAFETY: clearing the calling thread's current context is always allowed.
            let cleared = unsafe { driver.cuCtxSetCurrent(std::ptr::null_mut()) };
            if asked.is_err() || cleared.is_err() {
                return;
            }
        }
    }
}

/// How many contexts [`ReaperContext::clear_now`] pops off the reaper's stack at most before it
/// gives up for this record (the next asks again): owners that leave more levels than that (the
/// driver keeps deeper stacks) leave the rest to the next records' clears.
const CLEAR_TRIES: usize = 64;

/// Releases a record inside the release of another (a callback carried to the lane: see
/// `lane::Call`), as a drain would: the outer release looks after the thread's context.
pub(crate) fn release_nested(header: NonNull<RecordHeader>) {
    release_one(header, None);
}

/// Releases one record: takes it out of the pending launches (gives its ticket back), reports the
/// panic its host function had, then drops its owners and frees it, catching a panic from an
/// owner's `Drop`.
fn release_one(header: NonNull<RecordHeader>, mut context: Option<&mut ReaperContext>) {
    tickets::forget(header);
    // SAFETY: the caller owns the live record.
    if let Some(panic) = unsafe { RecordHeader::dispatch(header, Op::TakePanic) } {
        // The payload's own Drop and the panic handler are user code too (caught, and never
        // unwinding out): they may make a context current, so the report comes before the clear.
        report_and_drop(PanicOrigin::HostFunction, panic);
        if let Some(reaper) = context.as_deref_mut() {
            reaper.forget();
        }
    }
    // Every record's owners, whether its launch ran or not (a reclaimed launch, a deferred drop,
    // a graph's record): an earlier owner's `Drop`, or the report above, may have made a context
    // current. Only the current context is read and cleared, never a context of the record's (it
    // may be dead).
    let driver = cuda_dl_sys::Driver::get();
    if let Some(reaper) = context.as_deref_mut() {
        match driver {
            Some(driver) => reaper.enter(driver),
            None => reaper.forget(),
        }
    }
    // SAFETY: as above; this is the record's one release. If an owner's Drop panics, unwinding still
    // drops the remaining owners and frees the memory, so the record is gone either way.
    let released = catch_unwind(AssertUnwindSafe(|| unsafe {
        RecordHeader::dispatch(header, Op::Release)
    }));
    if let Err(panic) = released {
        report_and_drop(PanicOrigin::OwnerDrop, panic);
    }
    if let (Some(reaper), Some(driver)) = (context, driver) {
        reaper.after_drop(driver);
    }
}

/// Vectors a releasing thread reuses from batch to batch (the reaper keeps one; `drain` makes one
/// per call), so that the reaper's heap stays quiet while host functions flow.
#[derive(Default)]
pub(crate) struct Scratch {
    headers: Vec<NonNull<RecordHeader>>,
    /// The reaper's (see [`ReaperContext`]); `None` for a drain on a user's thread.
    pub(crate) context: Option<ReaperContext>,
}

/// The most entries a reused vector keeps between batches (a larger batch's capacity is let go).
const SCRATCH_KEEP: usize = 4096;

/// Takes every record queued so far and releases them, oldest first, on this thread; returns how
/// many. The batch is numbered while it is taken, and counted finished once released (or put back
/// at exit), for `flush` (see `batches.rs`).
pub(crate) fn release_queued(scratch: &mut Scratch) -> u64 {
    // An empty queue takes no lock: in manual mode every launch drains.
    if QUEUE.is_empty() {
        return 0;
    }
    let (batch, number) = {
        let mut batches = lock(&BATCHES);
        let batch = QUEUE.take_all();
        if batch.is_empty() {
            return 0;
        }
        (batch, batches.take())
    };
    let released = release_batch(batch, scratch);
    let flush_waits = QUEUE.count_released(released);
    let mut batches = lock(&BATCHES);
    batches.finished(number);
    if flush_waits {
        FLUSHED.notify_all();
    }
    released
}

/// Releases the records of `batch`, oldest first; returns how many (fewer if the process began to
/// exit: the rest go back into the queue, unreleased).
fn release_batch(batch: Batch<RecordHeader>, scratch: &mut Scratch) -> u64 {
    // Once the process is exiting, nothing more is released (see `support::exit_gate`).
    // The release also marks this thread as releasing (`flush` refuses to wait for itself).
    let Some(releasing) = exit_gate::begin_releasing() else {
        // Taken too late: back into the queue, unreleased, as the process ends.
        for header in batch {
            // SAFETY: taken from the queue by this call, released by nobody.
            unsafe { QUEUE.keep(header) };
        }
        return 0;
    };
    let headers = &mut scratch.headers;
    headers.clear();
    headers.extend(batch);
    let count = headers.len() as u64;
    for (released, &header) in headers.iter().enumerate() {
        if releasing.exit_began() {
            // The rest go back into the queue, unreleased, as the process ends (a drain's scratch
            // is dropped on return: kept there, they would be reachable from nothing).
            for &rest in &headers[released..] {
                // SAFETY: taken from the queue by this call, not released.
                unsafe { QUEUE.keep(rest) };
            }
            headers.clear();
            return released as u64;
        }
        release_one(header, scratch.context.as_mut());
    }
    let headers = &mut scratch.headers;
    headers.clear();
    headers.shrink_to(SCRATCH_KEEP);
    count
}

/// Releases, on the calling thread, every record queued so far; returns how many.
///
/// Works in either mode (in reaper mode it just does the reaper's work sooner). Inside a host
/// function it does nothing and returns 0: owners are never dropped on a driver thread. Nor on the
/// crate's watcher (a start hook there, or an enqueue in its manual-mode drain): owners' `Drop` is
/// user code, and the watcher must never wait for it. It also returns 0 in a child forked after
/// the first launch (the queue holds copies of the parent's records) and once the process is
/// exiting.
///
/// The owners' `Drop` runs in the calling thread's stream-capture interaction mode: see
/// [`CleanupMode::Manual`](crate::CleanupMode::Manual) for what that means while a graph is captured.
pub fn drain() -> u64 {
    // The empty queue first: a manual-mode launch drains after every enqueue, mostly finding
    // nothing, and then pays one load, not the thread-local looks below.
    if QUEUE.is_empty()
        || in_host_function()
        || forked_child::is_forked_child()
        || crate_threads::current() == Some(CrateThread::Watcher)
    {
        return 0;
    }
    release_queued(&mut Scratch::default())
}

/// Waits until every record queued so far is released, or `deadline` passes (`None`: no
/// deadline): the owners of every host function that has run, and of every graph whose user
/// object the driver has destroyed. In manual mode it drains the queue itself. Once everything is
/// released it gives the record pool's surplus back. The public `flush` checks its caller first
/// (not a host function, not the releasing thread, not a forked child).
///
/// # Errors
/// [`Error::FlushTimedOut`] with the number still waiting (`timeout` is what the caller asked).
pub(crate) fn flush_queue(deadline: Option<Instant>, timeout: Duration) -> Result<(), Error> {
    let target = QUEUE.queued();
    // Every record queued by now is in a batch this mark covers (see `batches.rs`).
    let mark: FlushMark = lock(&BATCHES).mark(!QUEUE.is_empty());
    QUEUE.flush_waiting(true);
    let result = loop {
        if !QUEUE.has_reaper() {
            drain();
        }
        let batches = lock(&BATCHES);
        if batches.reached(mark) {
            break Ok(());
        }
        let now = Instant::now();
        if deadline.is_some_and(|deadline| now >= deadline) {
            break Err(Error::FlushTimedOut {
                // At least the batch still being released.
                waiting: target.saturating_sub(QUEUE.released()).max(1),
                timeout,
            });
        }
        // Bounded waits: in manual mode nobody notifies, and a host function may be pushing as we
        // look; a short slice keeps both cheap and correct.
        let slice = deadline.map_or(FLUSH_SLICE, |deadline| (deadline - now).min(FLUSH_SLICE));
        let _ = FLUSHED
            .wait_timeout(batches, slice)
            .unwrap_or_else(|p| p.into_inner());
    };
    QUEUE.flush_waiting(false);
    if result.is_ok() {
        // Everything released so far is back in the record pool: give its surplus segments back.
        pool::trim();
    }
    result
}

/// Counters of the cleanup queue, for tests and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CleanupStats {
    /// Records queued for release: host functions of this crate that have run, graphs whose owners
    /// the driver let go, deferred drops.
    pub queued: u64,
    /// Records released from the queue (their owners dropped).
    pub released: u64,
    /// [`spawn_after`](crate::spawn_after) callbacks dropped without running, their captures with
    /// them: their context failed (a sticky error such as a trapped kernel: the stream never gets
    /// there), or could not be made current when their turn came (reset meanwhile).
    pub callbacks_dropped_unrun: u64,
}

/// A snapshot of the cleanup queue's counters.
pub fn cleanup_stats() -> CleanupStats {
    CleanupStats {
        queued: QUEUE.queued(),
        released: QUEUE.released(),
        callbacks_dropped_unrun: CALLBACKS_DROPPED_UNRUN.load(Ordering::Relaxed),
    }
}

/// See [`CleanupStats::callbacks_dropped_unrun`].
static CALLBACKS_DROPPED_UNRUN: AtomicU64 = AtomicU64::new(0);

/// Counts a callback dropped without running.
pub(crate) fn count_callback_dropped_unrun() {
    CALLBACKS_DROPPED_UNRUN.fetch_add(1, Ordering::Relaxed);
}
