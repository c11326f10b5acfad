//! Process exit and the threads that release owners.
//!
//! `exit` runs the process's exit handlers and the libraries' destructors (the CUDA driver's
//! teardown among them) while the process's other threads still run. The reaper is detached: left
//! alone, it could be inside an owner's `Drop` that calls the driver (freeing device memory) while
//! the driver is torn down, or start one afterwards: a call into a library being destroyed, which
//! may fail, hang or crash the exiting process.
//!
//! So the crate registers an exit handler (`atexit`; handlers run in the reverse order of
//! registration, so this one runs before the teardown of a driver loaded and initialised earlier)
//! at its first launch and before it starts any thread of its own ([`arm`]), once the driver is
//! loaded. Not later, from a thread's first round: a process may begin to exit meanwhile, and a
//! handler registered during `exit` runs after the handlers before it, the driver's teardown
//! among them, while the thread already calls the driver. The handler closes the gate: from then
//! on no release starts (the reaper, a `drain`, a `flush`: each stops before its next record; nor
//! a round of the watcher), and it waits, at most [`EXIT_WAIT`], for the releases in
//! progress to finish. The records not
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

/// What the exit handler closes: whether the process is exiting, and how much work it must wait
/// for. One per process ([`GATE`]); a value of its own in the unit tests.
struct Gate {
    /// Set by the exit handler: no release may start.
    closed: AtomicBool,
    /// Work in progress (releases, one per releasing thread and nesting level, and the event
    /// poller's rounds).
    in_progress: AtomicUsize,
}

static GATE: Gate = Gate::new();
static ARM: Once = Once::new();

thread_local! {
    /// How many releases the calling thread is inside (an owner's `Drop` may drain). A
    /// const-initialised `Cell` has no destructor, so the exit handler can read it on any thread.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// How many pieces of driver work ([`begin_driver_work`]) the calling thread is inside: the
    /// exit handler does not wait for its own thread's (a waker that calls `exit` on a poller).
    static WORK: Cell<usize> = const { Cell::new(0) };
}

/// One piece of work the exit handler waits for: counted from [`Gate::enter`] until dropped.
struct Entry<'g>(&'g Gate);

impl Gate {
    const fn new() -> Gate {
        Gate {
            closed: AtomicBool::new(false),
            in_progress: AtomicUsize::new(0),
        }
    }

    /// Counts work in progress that the exit handler waits for, unless the process is exiting
    /// (then counts nothing). The SeqCst pair (this increment then the look at `closed`, against
    /// the handler's store to `closed` then its look at the count): either the handler sees this
    /// work and waits for it, or this work sees the handler's mark and does not start.
    #[inline]
    fn enter(&self) -> Option<Entry<'_>> {
        self.in_progress.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.in_progress.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        // Made only now: an `Entry` dropped un-counts, so one made for a refused entry would
        // un-count someone else's work and end the handler's wait early.
        Some(Entry(self))
    }

    /// No work starts from now on. (Only Linux registers the handler that calls it.)
    #[cfg(any(target_os = "linux", test))]
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Work in progress.
    #[cfg(any(target_os = "linux", test))]
    fn in_progress(&self) -> usize {
        self.in_progress.load(Ordering::SeqCst)
    }
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        self.0.in_progress.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether the calling thread is releasing a batch of records (running an owner's `Drop` or the
/// panic handler for the cleanup queue: the reaper, or a thread that drains).
pub(crate) fn releasing_here() -> bool {
    DEPTH.with(Cell::get) > 0
}

/// A release in progress: the exit handler waits for it to end.
pub(crate) struct Releasing(Entry<'static>);

/// Begins a release, unless the process is exiting.
#[inline]
pub(crate) fn begin_releasing() -> Option<Releasing> {
    let entry = GATE.enter()?;
    DEPTH.with(|d| d.set(d.get() + 1));
    Some(Releasing(entry))
}

impl Releasing {
    /// Whether the process began to exit since: the release stops before its next record.
    #[inline]
    pub(crate) fn exit_began(&self) -> bool {
        self.0.0.closed()
    }
}

impl Drop for Releasing {
    fn drop(&mut self) {
        // Then the entry (a field) is dropped: the handler stops waiting for this release.
        DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Driver work of one of this crate's own threads that runs users' code but releases no record
/// (the watcher's queries and callbacks): the exit handler waits for it as for a release,
/// and it does not start once the process is exiting. Unlike [`begin_releasing`] it does not mark
/// the thread as releasing (a callback may `flush`: the reaper releases, not this thread).
pub(crate) struct DriverWork {
    _entry: Entry<'static>,
}

/// Begins driver work, unless the process is exiting.
#[inline]
pub(crate) fn begin_driver_work() -> Option<DriverWork> {
    let entry = GATE.enter()?;
    WORK.with(|w| w.set(w.get() + 1));
    Some(DriverWork { _entry: entry })
}

impl Drop for DriverWork {
    fn drop(&mut self) {
        // Then the entry (a field) is dropped: the handler stops waiting for this work.
        WORK.with(|w| w.set(w.get().saturating_sub(1)));
    }
}

/// Whether the process is exiting (the exit handler ran): nothing is released or completed from
/// now on, so whoever waits for that (`flush`) stops waiting.
pub(crate) fn exiting() -> bool {
    GATE.closed()
}

/// Registers the exit handler, once, if the driver is loaded (so that it runs before the driver's
/// teardown). Called at each launch and before the crate starts a thread: so the handler is in
/// place before any thread of the crate calls the driver, unless the process began to exit before
/// the crate's first launch (a thread of the user's calling the crate while another exits).
#[inline]
pub(crate) fn arm() {
    if !armed() && cuda_dl_sys::Driver::get().is_some() {
        register();
    }
}

/// Whether the exit handler is registered.
#[inline]
pub(crate) fn armed() -> bool {
    ARM.is_completed()
}

/// For the crate's threads, before each batch or round: [`arm`], and once the process is exiting,
/// parks the calling thread for good instead of returning.
#[inline]
pub(crate) fn arm_or_stop() {
    arm();
    if GATE.closed() {
        loop {
            std::thread::park();
        }
    }
}

#[cold]
fn register() {
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
    GATE.close();
    let own = DEPTH.with(Cell::get) + WORK.with(Cell::get);
    let deadline = Instant::now() + EXIT_WAIT;
    while GATE.in_progress() > own && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[cfg(test)]
mod tests {
    use super::Gate;

    /// Work that asks to start once the gate is closed is refused and counts nothing: the
    /// handler goes on waiting for the work in progress, and for nothing else. (Found by the
    /// torture harness: a refused poller round un-counted another round still running, so the
    /// handler stopped waiting and that round queried the driver after its teardown.)
    #[test]
    fn a_refused_entry_leaves_the_count_of_work_in_progress_alone() {
        let gate = Gate::new();
        let running = gate.enter().expect("an open gate lets work start");
        assert_eq!(gate.in_progress(), 1);
        gate.close();
        for _ in 0..3 {
            assert!(gate.enter().is_none(), "a closed gate lets nothing start");
        }
        assert_eq!(
            gate.in_progress(),
            1,
            "the running work is still waited for"
        );
        drop(running);
        assert_eq!(gate.in_progress(), 0);
    }

    /// Each entry counts once and is un-counted once, nested or not.
    #[test]
    fn entries_count_until_they_are_dropped() {
        let gate = Gate::new();
        let a = gate.enter().unwrap();
        let b = gate.enter().unwrap();
        assert_eq!(gate.in_progress(), 2);
        drop(a);
        assert_eq!(gate.in_progress(), 1);
        assert!(!gate.closed());
        drop(b);
        assert_eq!(gate.in_progress(), 0);
    }
}
