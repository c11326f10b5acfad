//! [`flush`]: the barrier after which every release and callback of completed work is done; and
//! [`quiesce`]: that, then the crate's event resources given back, for leak checks.

use std::time::{Duration, Instant};

use crate::reaper::release;
use crate::support::error::Error;
use crate::support::host_thread::refuse_inside_host_function;
use crate::support::{crate_threads, exit_gate, forked_child};
use crate::transport;

/// Waits until every release and callback of work that has completed is done, or `timeout`
/// passes: after a [`Stream::synchronize`](crate::Stream::synchronize) (or any point where you know
/// the stream's work has completed), `flush` returns only once the owners of that work are
/// dropped and its callbacks have returned, whichever way the crate learns of it:
///
/// - host functions ([`host_launch`](crate::host_launch), ...): the owners of every host function
///   that has run, and of every graph whose user object the driver has destroyed;
/// - events ([`release_after`](crate::release_after), [`spawn_after`](crate::spawn_after),
///   event completions): the watcher finishes a round begun after this call (every entry
///   whose event had completed by then: callbacks run, futures woken, owners queued), then their
///   owners are dropped;
/// - low-latency completions: the watcher finishes a round, waking every future whose flag was
///   written.
///
/// It also releases the work of contexts that are gone without this crate seeing it (another
/// binding released a context for the last time, or destroyed it, after a sticky error): their
/// work will never complete (see [`reclaim_pending`](crate::reclaim_pending)). In manual mode it
/// drains the cleanup queue itself. Once everything is released it gives the record pool's surplus
/// memory back to the system (free 4 KiB segments of slots, beyond 512 KiB of them), as the reaper
/// does when it goes idle.
///
/// Work still pending on its stream is not waited for: synchronize the stream first to include
/// it. The driver destroys a graph's user objects asynchronously, so owners tied to a graph may
/// reach the queue a little after `cuGraphDestroy` returns.
///
/// **At process exit** the crate's threads stop before the driver is torn down: records still
/// pending or queued are not released (their owners' `Drop` does not run, as for any value alive
/// at `exit`), and a callback whose event completed may not run. Synchronize and `flush` before
/// exiting where that matters.
///
/// `flush` does not give back what the crate keeps for later work: the watcher's pooled events
/// (made in batches of 32) and its retain of each primary context it watches stay until it has
/// been idle for [`PollerSettings::idle_exit`](crate::PollerSettings::idle_exit) (100 ms). A leak
/// check (a driver's live-object count, such as the fake driver's `live_objects`) calls
/// [`quiesce`] instead, which returns once they are given back.
///
/// A `timeout` too long to add to the clock (`Duration::MAX`) waits as long as it takes. Called by
/// the thread that is releasing records (inside an owner's `Drop`, or the panic handler, whether
/// on the reaper or on a thread that drains), it returns [`Error::FlushOnReleasingThread`] at once:
/// the records it would wait for include the one that thread is releasing. A
/// [`spawn_after`](crate::spawn_after) callback runs there too (it is released with its record).
/// Called on another thread of the crate (a start hook, a waker the watcher calls), it returns
/// [`Error::FlushOnCrateThread`] at once, for the same reason.
///
/// # Errors
/// [`Error::FlushTimedOut`] with the number still waiting; [`Error::InsideHostFunction`] if called
/// from a host function (the reaper cannot be waited for there);
/// [`Error::FlushOnReleasingThread`] if called by the releasing thread;
/// [`Error::FlushOnCrateThread`] on another thread of the crate; [`Error::ProcessExiting`] once
/// the process began to exit (before or while it waited); [`Error::ForkedChild`] in a child forked
/// after the first launch.
pub fn flush(timeout: Duration) -> Result<(), Error> {
    refuse_inside_host_function("flush")?;
    if exit_gate::releasing_here() {
        return Err(Error::FlushOnReleasingThread);
    }
    if let Some(thread) = crate_threads::current() {
        return Err(Error::FlushOnCrateThread { thread });
    }
    forked_child::check()?;
    if exit_gate::exiting() {
        return Err(Error::ProcessExiting);
    }
    // None: beyond what the clock can represent, so never reached.
    let deadline = Instant::now().checked_add(timeout);
    // Work of contexts that are gone will never complete: released now, it reaches the queue.
    transport::sweep_gone();
    // What the watcher completes reaches the queue before the queue is waited for.
    let pollers = transport::wait_for_pollers(deadline);
    let queue = release::flush_queue(deadline, timeout);
    if exit_gate::exiting() {
        // The process began to exit while this waited: the crate's threads stopped.
        return Err(Error::ProcessExiting);
    }
    match (pollers, queue) {
        (true, result) => result,
        // The watcher did not finish its round in time: the flush did not see everything.
        (false, Ok(())) => Err(Error::FlushTimedOut {
            waiting: 1,
            timeout,
        }),
        (false, Err(e)) => Err(e),
    }
}

/// [`flush`], then makes the watcher give back what it keeps for later work, and waits until
/// it did: its events are destroyed and its retains of primary contexts released (the next
/// [`release_after`](crate::release_after), [`spawn_after`](crate::spawn_after) or event
/// completion makes them again). The watcher thread itself stops once nothing is pending, as
/// always. For leak checks in tests: after the streams are
/// synchronized and `quiesce` returned, the crate holds no event and no context retain, so a
/// driver's count of live objects (the fake driver's `live_objects`,
/// `fake_cuda::fixture::LiveObjects`) is back where it was before the crate's first use, with no
/// sleep, whatever [`PollerSettings::idle_exit`](crate::PollerSettings::idle_exit) is.
///
/// Not given back: what the caller holds ([`Stream`](crate::Stream)s, [`PrimaryContext`](crate::PrimaryContext)s,
/// graphs), and the low-latency mode's flag pages ([`CompletionMode::LowLatency`](crate::CompletionMode::LowLatency):
/// host memory registered in a context, one `cuMemHostRegister` per 4 KiB page), kept while their
/// context lives. Work other threads enqueue meanwhile keeps the poller running; it is waited for
/// until `timeout`.
///
/// ```
/// use std::time::Duration;
/// use cuda_host_launch::{release_after, quiesce, Device, PrimaryContext, Stream};
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// let fake = fake_cuda::fixture::lock(); // a test's turn with the fake driver
/// let context = PrimaryContext::retain(Device::get(0)?)?;
/// let before = fake.live_objects_now();
/// let stream = Stream::new(&context)?;
/// release_after(&stream, vec![0u8; 1024])?;
/// stream.synchronize()?;
/// drop(stream);
/// quiesce(Duration::from_secs(10))?;
/// assert!(fake.live_objects_now().grown_since(&before).is_empty());
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`flush`]'s, and [`Error::QuiesceTimedOut`] if the poller still had events out at `timeout`
/// (work still pending on a stream, or a callback still running).
pub fn quiesce(timeout: Duration) -> Result<(), Error> {
    let deadline = Instant::now().checked_add(timeout);
    flush(timeout)?;
    if transport::event::wait_until_given_back(deadline) {
        Ok(())
    } else {
        Err(Error::QuiesceTimedOut { timeout })
    }
}
