//! Process exit and the threads that release owners.
//!
//! `exit` runs the process's exit handlers and the libraries' destructors (the CUDA driver's
//! teardown among them) while the process's other threads still run. The reaper is detached: left
//! alone, it could be inside an owner's `Drop` that calls the driver (freeing device memory) while
//! the driver is torn down, or start one afterwards: a call into a library being destroyed, which
//! may fail, hang or crash the exiting process.
//!
//! So the reaper, once the driver is loaded and before it releases anything, registers an exit
//! handler (`atexit`; handlers run in the reverse order of registration, so this one runs before
//! the teardown of a driver loaded and initialised earlier). The handler closes the gate: from then
//! on no release starts (the reaper, a `drain`, a `flush`: each stops before its next record), and
//! it waits, at most [`EXIT_WAIT`], for the releases in progress to finish. The records not
//! released stay so, as the process ends: their owners' `Drop` does not run, as for any value alive
//! at `exit`. A release that outlasts the wait (an owner's `Drop` that blocks) goes on while the
//! process exits, as before.
//!
//! A thread that calls `exit` from inside a release (an owner's `Drop` that exits) does not wait
//! for itself. In a forked child (see `forked_child`) the inherited handler does nothing.

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
#[cfg(target_os = "linux")]
use std::time::{Duration, Instant};

/// The longest the exit handler waits for the releases in progress. (The handler is registered on
/// Linux only; elsewhere nothing waits.)
#[cfg(target_os = "linux")]
pub(crate) const EXIT_WAIT: Duration = Duration::from_secs(1);

/// Set by the exit handler: no release may start.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// Releases in progress (batches being released, one per releasing thread and nesting level).
static RELEASING: AtomicUsize = AtomicUsize::new(0);
static ARM: Once = Once::new();

thread_local! {
    /// How many releases the calling thread is inside (an owner's `Drop` may drain). A
    /// const-initialised `Cell` has no destructor, so the exit handler can read it on any thread.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Whether the calling thread is releasing a batch of records (running an owner's `Drop` or the
/// panic handler for the cleanup queue: the reaper, or a thread that drains).
pub(crate) fn releasing_here() -> bool {
    DEPTH.with(Cell::get) > 0
}

/// Counts work in progress that the exit handler waits for, unless the process is exiting (then
/// returns `false` and counts nothing). The SeqCst pair (this increment then the look at CLOSED,
/// against the handler's store to CLOSED then its look at RELEASING): either the handler sees
/// this work and waits for it, or this work sees the handler's mark and does not start.
#[inline]
fn enter() -> bool {
    RELEASING.fetch_add(1, Ordering::SeqCst);
    if CLOSED.load(Ordering::SeqCst) {
        RELEASING.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    true
}

/// A release in progress: the exit handler waits for it to end.
pub(crate) struct Releasing(());

/// Begins a release, unless the process is exiting.
#[inline]
pub(crate) fn begin_releasing() -> Option<Releasing> {
    if !enter() {
        return None;
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    Some(Releasing(()))
}

impl Releasing {
    /// Whether the process began to exit since: the release stops before its next record.
    #[inline]
    pub(crate) fn exit_began(&self) -> bool {
        CLOSED.load(Ordering::Relaxed)
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        RELEASING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Driver work of one of this crate's own threads that runs users' code but releases no record
/// (the event poller's queries and callbacks): the exit handler waits for it as for a release,
/// and it does not start once the process is exiting. Unlike [`begin_releasing`] it does not mark
/// the thread as releasing (a callback may `flush`: the reaper releases, not this thread).
pub(crate) struct DriverWork(());

/// Begins driver work, unless the process is exiting.
#[inline]
pub(crate) fn begin_driver_work() -> Option<DriverWork> {
    enter().then_some(DriverWork(()))
}

impl Drop for DriverWork {
    fn drop(&mut self) {
        RELEASING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// For the reaper, before each batch: registers the exit handler once the driver is loaded (so it
/// runs before the driver's teardown), and once the process is exiting, parks the calling thread
/// for good instead of returning.
#[inline]
pub(crate) fn arm_or_stop() {
    if !ARM.is_completed() && cuda_dl_sys::Driver::get().is_some() {
        arm();
    }
    if CLOSED.load(Ordering::Relaxed) {
        loop {
            std::thread::park();
        }
    }
}

#[cold]
fn arm() {
    ARM.call_once(|| {
        #[cfg(target_os = "linux")]
        // SAFETY: `close_and_wait` is an `extern "C" fn()` that touches only this module's
        // statics and the calling thread's const-initialised thread-local. If registration fails
        // (out of memory), exit behaves as without the handler.
        unsafe {
            libc::atexit(close_and_wait);
        }
    });
}

/// The exit handler: no release starts from now on; waits (bounded) for those in progress, other
/// than the calling thread's own.
#[cfg(target_os = "linux")]
extern "C" fn close_and_wait() {
    if crate::support::forked_child::is_forked_child() {
        return;
    }
    CLOSED.store(true, Ordering::SeqCst);
    let own = DEPTH.with(Cell::get);
    let deadline = Instant::now() + EXIT_WAIT;
    while RELEASING.load(Ordering::SeqCst) > own && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(100));
    }
}
