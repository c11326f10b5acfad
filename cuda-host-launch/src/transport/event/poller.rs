//! The event poller: one thread of this crate that queries the recorded events, newest of each
//! stream first, and completes their records on its own thread.
//!
//! - **Adaptive** (see `transport::poller_pace`): after news (a completion, or work arriving
//!   while nothing was pending) it spins for [`PollerSettings::spin`] (a busy core, the lowest
//!   latency), then parks between rounds for pauses that grow with the wait, from
//!   [`PollerSettings::interval`] to [`PollerSettings::max_interval`]; with nothing pending it
//!   parks until woken, and after [`PollerSettings::idle_exit`] it gives the idle event pools back
//!   and exits: no thread, no wake-up and no CPU while idle. A new entry wakes (or starts) it only
//!   if it parks with nothing pending or for a pause longer than `interval`; otherwise it picks
//!   new entries up within `interval` on its own, so a burst of enqueues makes no system call. Its
//!   timed parks ask Linux for 1 µs timer slack (the default 50 µs would stretch a 20 µs pause
//!   threefold).
//! - **Relaxed capture mode**: it puts itself in `CU_STREAM_CAPTURE_MODE_RELAXED` first, so its
//!   queries (and the callbacks it runs) never break another thread's global-mode capture.
//! - **Locks**: [`QUEUES`] (the per-stream queues) is held while it queries and while it gives
//!   events back to their pools; a context's reset takes it first ([`forget_context`]), so no event
//!   of a reset context is queried or reused after. Records are completed with no lock held, so a
//!   callback may enqueue more work, or even reset a context.

use std::collections::{HashMap, VecDeque};

use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUevent, CUresult};

use super::{Entry, Incoming, Work, incoming, pools};
use crate::reaper::lane;
use crate::record::layout::{Op, RecordHeader};
use crate::support::context_key::{ContextKey, Gone, Liveness};
use crate::support::crate_threads::{self, CrateThread};
use crate::support::error::Error;
use crate::support::exit_gate;
use crate::support::fast_hash::FastHash;
use crate::support::panic_report::PanicOrigin;
use crate::support::precise_sleeps::precise_sleeps;
use crate::support::relaxed_capture::enter_relaxed_mode;
use crate::support::sticky_error;
use crate::support::sync::lock;
use crate::tracking::pending;
use crate::transport::poller_barrier::RoundBarrier;
use crate::transport::poller_pace::{Pace, PollerSettings, Round, Wait, nanos};

// The settings in force, each as nanoseconds (`u64::MAX`: `Duration::MAX`), from the defaults.
static SPIN_NS: AtomicU64 = AtomicU64::new(PollerSettings::DEFAULT.spin.as_nanos() as u64);
static INTERVAL_NS: AtomicU64 = AtomicU64::new(PollerSettings::DEFAULT.interval.as_nanos() as u64);
static MAX_INTERVAL_NS: AtomicU64 =
    AtomicU64::new(PollerSettings::DEFAULT.max_interval.as_nanos() as u64);
static IDLE_EXIT_NS: AtomicU64 =
    AtomicU64::new(PollerSettings::DEFAULT.idle_exit.as_nanos() as u64);
static QUERY_GAP_NS: AtomicU64 =
    AtomicU64::new(PollerSettings::DEFAULT.query_gap.as_nanos() as u64);

/// Sets how the event poller waits, from its next round on.
pub fn set_poller_settings(settings: PollerSettings) {
    SPIN_NS.store(nanos(settings.spin), Ordering::Relaxed);
    INTERVAL_NS.store(nanos(settings.interval), Ordering::Relaxed);
    MAX_INTERVAL_NS.store(nanos(settings.max_interval), Ordering::Relaxed);
    IDLE_EXIT_NS.store(nanos(settings.idle_exit), Ordering::Relaxed);
    QUERY_GAP_NS.store(nanos(settings.query_gap), Ordering::Relaxed);
}

/// How the event poller waits now.
pub fn poller_settings() -> PollerSettings {
    let spin = SPIN_NS.load(Ordering::Relaxed);
    PollerSettings {
        spin: if spin == u64::MAX {
            Duration::MAX
        } else {
            Duration::from_nanos(spin)
        },
        interval: Duration::from_nanos(INTERVAL_NS.load(Ordering::Relaxed)),
        max_interval: Duration::from_nanos(MAX_INTERVAL_NS.load(Ordering::Relaxed)),
        idle_exit: Duration::from_nanos(IDLE_EXIT_NS.load(Ordering::Relaxed)),
        query_gap: Duration::from_nanos(QUERY_GAP_NS.load(Ordering::Relaxed)),
    }
}

/// The entries waiting, by context, stream id and enqueuing thread, oldest first. An emptied
/// queue is kept (its buffer reused) until the poller pauses.
#[derive(Default)]
struct Queues {
    by_stream: HashMap<(ContextKey, u64, u64), VecDeque<Entry>, FastHash>,
}

impl Queues {
    /// Whether any entry waits.
    fn pending(&self) -> bool {
        self.by_stream.values().any(|queue| !queue.is_empty())
    }
}

static QUEUES: LazyLock<Mutex<Queues>> = LazyLock::new(Mutex::default);

/// `flush`'s barrier (see `transport::poller_barrier`).
static BARRIER: RoundBarrier = RoundBarrier::new();

thread_local! {
    /// Whether this thread is the poller (a callback's `flush` must not wait for it).
    static IS_POLLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// See [`super::wait_for_poller`].
pub(super) fn wait_for_round(deadline: Option<Instant>) -> bool {
    if IS_POLLER.with(std::cell::Cell::get) {
        return true;
    }
    let request = {
        let mut incoming = incoming();
        let Some(thread) = incoming.poller.clone() else {
            return true;
        };
        // Looking now, not after a long park.
        incoming.wake_on_enqueue = false;
        let request = BARRIER.ask();
        thread.unpark();
        request
    };
    BARRIER.wait(request, deadline)
}

/// Callers of [`wait_until_given_back`] waiting now: while there are any, the poller gives its
/// pools back and exits as soon as nothing is pending and no event is out, not after
/// [`PollerSettings::idle_exit`].
static GIVE_BACK_ASKED: AtomicUsize = AtomicUsize::new(0);

/// See [`super::wait_until_given_back`].
pub(super) fn wait_until_given_back(deadline: Option<Instant>) -> bool {
    if IS_POLLER.with(std::cell::Cell::get) {
        return false;
    }
    GIVE_BACK_ASKED.fetch_add(1, Ordering::SeqCst);
    let given_back = loop {
        if incoming().poller.is_none() {
            break true;
        }
        // Wakes it for a round: it exits in the first with nothing pending and no event out, and
        // serves this request as it exits.
        if !wait_for_round(deadline) {
            break false;
        }
    };
    GIVE_BACK_ASKED.fetch_sub(1, Ordering::SeqCst);
    given_back
}

fn queues() -> MutexGuard<'static, Queues> {
    lock(&QUEUES)
}

/// Wakes the poller if it parks long (otherwise it finds the new entry soon on its own), or starts
/// it if none runs.
pub(super) fn wake_or_start(incoming: &mut Incoming) -> Result<(), Error> {
    if let Some(thread) = &incoming.poller {
        if incoming.wake_on_enqueue {
            // Under the lock the poller set it under: it parks after, or has parked; either way
            // the unpark's token wakes it.
            incoming.wake_on_enqueue = false;
            thread.unpark();
        }
        return Ok(());
    }
    let thread = crate_threads::spawn(CrateThread::EventPoller, poll_loop)
        .map_err(|e| Error::ReaperSpawn(e.to_string()))?;
    incoming.poller = Some(thread.thread().clone());
    Ok(())
}

/// See [`super::forget_gone`].
pub(super) fn forget_gone(handle: usize, look: &dyn Fn() -> Liveness, known: Gone) {
    forget_gone_locked(&mut queues(), handle, look, known);
}

/// See [`super::around_reset`].
pub(super) fn around_reset<T, E>(
    handle: usize,
    reset: impl FnOnce() -> Result<T, E>,
    look: &dyn Fn() -> Liveness,
    known: Gone,
) -> Result<T, E> {
    // The poller queries only with this lock held: while the reset runs, it queries nothing.
    let mut queues = queues();
    let result = reset();
    if result.is_ok() {
        forget_gone_locked(&mut queues, handle, look, known);
    }
    result
}

/// Forgets the queues, hand-over entries and pools of the contexts of `handle` that are gone: the
/// contexts are collected first, under the hand-over's and the pools' locks (so none is added
/// meanwhile), then the handle is looked at (see `support::context_key`).
fn forget_gone_locked(
    queues: &mut Queues,
    handle: usize,
    look: &dyn Fn() -> Liveness,
    known: Gone,
) {
    let mut incoming = incoming();
    let mut pools = pools();
    let mut keys: Vec<ContextKey> = pools.keys_of(handle).collect();
    keys.extend(
        queues
            .by_stream
            .keys()
            .map(|(context, _, _)| *context)
            .chain(incoming.entries.iter().map(|entry| entry.context))
            .filter(|context| context.handle == handle),
    );
    if keys.is_empty() {
        return;
    }
    keys.sort_unstable();
    keys.dedup();
    let now = look();
    keys.retain(|key| now.is_gone(*key, known));
    if keys.is_empty() {
        return;
    }
    queues
        .by_stream
        .retain(|(context, _, _), _| !keys.contains(context));
    incoming
        .entries
        .retain(|entry| !keys.contains(&entry.context));
    if let Some(driver) = cuda_dl_sys::Driver::get() {
        for key in keys {
            pools.forget(driver, key);
        }
    }
}

/// What a query says about an entry.
enum Seen {
    Done,
    NotYet,
    /// Never to complete in stream order: a capture held the event (this event only), or the
    /// context failed with the sticky error `fault` (the whole stream).
    Stranded {
        fault: Option<u32>,
    },
}

fn query(driver: &cuda_dl_sys::Driver, event: usize) -> Seen {
    let Ok(query) = driver.raw().cuEventQuery() else {
        return Seen::NotYet;
    };
    // SAFETY: an event of a live pool: its context is retained, and a reset forgets it (under the
    // queues' lock, which the caller holds) before destroying it.
    let code =
        unsafe { query(ptr::with_exposed_provenance_mut::<std::ffi::c_void>(event) as CUevent) };
    match code {
        CUresult::CUDA_SUCCESS => Seen::Done,
        CUresult::CUDA_ERROR_NOT_READY => Seen::NotYet,
        // Recorded into a capture (live: CAPTURED_EVENT; ended: INVALID_VALUE): this event only.
        CUresult::CUDA_ERROR_CAPTURED_EVENT | CUresult::CUDA_ERROR_INVALID_VALUE => {
            Seen::Stranded { fault: None }
        }
        // A sticky error (or a lost context): nothing of the stream will complete.
        other => Seen::Stranded {
            fault: Some(other.0),
        },
    }
}

/// An entry that will never complete, and the sticky error that says so (none: a capture holds
/// its event).
struct Strand {
    entry: Entry,
    fault: Option<u32>,
}

/// Moves the completed entries of one stream's queue to `done` and the ones that never will to
/// `stranded`: the newest first (its completion completes every older one), else from the oldest.
fn scan(
    driver: &cuda_dl_sys::Driver,
    queue: &mut VecDeque<Entry>,
    done: &mut Vec<Entry>,
    stranded: &mut Vec<Strand>,
) {
    let Some(newest) = queue.back() else {
        return;
    };
    let whole = |queue: &mut VecDeque<Entry>, stranded: &mut Vec<Strand>, fault| {
        stranded.extend(queue.drain(..).map(|entry| Strand { entry, fault }));
    };
    match query(driver, newest.event) {
        Seen::Done => {
            done.extend(queue.drain(..));
            return;
        }
        Seen::Stranded { fault: Some(code) } => {
            whole(queue, stranded, Some(code));
            return;
        }
        Seen::Stranded { fault: None } => {
            stranded.extend(queue.pop_back().map(|entry| Strand { entry, fault: None }))
        }
        Seen::NotYet => {}
    }
    // The newest is not done: complete from the oldest while they are.
    while let Some(oldest) = queue.front() {
        match query(driver, oldest.event) {
            Seen::Done => done.extend(queue.pop_front()),
            Seen::NotYet => break,
            Seen::Stranded { fault: Some(code) } => whole(queue, stranded, Some(code)),
            Seen::Stranded { fault: None } => {
                stranded.extend(queue.pop_front().map(|entry| Strand { entry, fault: None }))
            }
        }
    }
}

/// Completes one entry whose event completed, on this thread, as the trampoline would on the
/// driver's: claims it through its ticket (a reclaim may have taken it), then hands what is user
/// code to the lane (`reaper::lane`), never running it here: a release's owners are dropped
/// there, a callback runs there (in the stream's context, which its pool keeps retained until
/// then: `call` is its count there), and a future's record is released there after this thread
/// completed the future.
/// Returns whether it pushed anything to the lane.
fn complete(entry: Entry, call: Option<Arc<AtomicUsize>>) -> bool {
    let Entry {
        context,
        ticket,
        work,
        ..
    } = entry;
    // The lane takes a callback off its pool's count once it ran (or here, if it never will).
    let ran = move || {
        if let Some(call) = call {
            call.fetch_sub(1, Ordering::AcqRel);
        }
    };
    let mut pushed = false;
    match work {
        Work::Release => pending::run_launch_then(
            ticket,
            |_| {},
            |header| {
                // SAFETY: nobody else holds the record now.
                unsafe { lane::push(header) };
                pushed = true;
            },
        ),
        Work::Wake(_) => pending::run_launch_then(
            ticket,
            // SAFETY: `run_launch_then` hands the record claimed for this call, to run once on
            // this thread; a future's payload only completes its state and wakes its waker.
            |header| unsafe {
                RecordHeader::dispatch(header, Op::Run);
            },
            |header| {
                // SAFETY: nobody else holds the record now.
                unsafe { lane::push(header) };
                pushed = true;
            },
        ),
        Work::Call => {
            let mut ran = Some(ran);
            pending::run_launch_then(
                ticket,
                |_| {},
                |header| {
                    if let Some(ran) = ran.take() {
                        // SAFETY: claimed for this call and held by nobody else; a callback's
                        // payload is sound to run on the lane with its stream's context current
                        // (the enqueue's contract).
                        unsafe { lane::Call::send(header, context.handle, ran) };
                        pushed = true;
                    }
                },
            );
            if let Some(ran) = ran {
                // Reclaimed meanwhile: nothing runs.
                ran();
            }
        }
    }
    pushed
}

/// Resolves the futures among `stranded` entries whose context failed: each to
/// [`Error::DeviceFault`](crate::Error::DeviceFault) with the driver's code, at once. Their
/// records stay pending (what they hold is kept until the context's reclaim), as do the
/// callbacks' and releases' (a callback never runs after a fault: it is dropped unrun then).
fn fault_futures(stranded: &[Strand]) {
    for strand in stranded {
        if let (Some(code), Work::Wake(shared)) = (strand.fault, &strand.entry.work)
            && sticky_error::is_sticky(CUresult(code))
            && let Some(panic) = shared.fault(code)
        {
            lane::report_there(PanicOrigin::Waker, panic);
        }
    }
}

/// Parks for up to `pause`, unless entries are waiting already; an enqueue meanwhile ends the park
/// (see [`Incoming::wake_on_enqueue`]).
fn park_unless_enqueued(pause: Duration) {
    let mut incoming = incoming();
    if !incoming.entries.is_empty() {
        return;
    }
    // Under the lock the enqueues push under: the next enqueue wakes this thread (its unpark's
    // token ends the park even if it comes first).
    incoming.wake_on_enqueue = true;
    drop(incoming);
    std::thread::park_timeout(pause);
}

fn poll_loop() {
    let Some(driver) = cuda_dl_sys::Driver::get() else {
        // Never: an enqueue loaded the driver before starting this thread.
        incoming().poller = None;
        return;
    };
    IS_POLLER.with(|p| p.set(true));
    // Queries (and wakers) are "unsafe" calls in the capture sense.
    let _ = enter_relaxed_mode();
    // Its timed parks (the interval) are short: keep them so.
    precise_sleeps();
    let mut pace = Pace::start();
    let mut done: Vec<Entry> = Vec::new();
    let mut stranded: Vec<Strand> = Vec::new();
    // For each of `done`: a callback's count in its pool (see `Pools::call_out`).
    let mut calls: Vec<Option<Arc<AtomicUsize>>> = Vec::new();
    let mut idle_since: Option<Instant> = None;
    loop {
        let settings = poller_settings();
        let round_began = Instant::now();
        // Once the process is exiting this thread parks for good (no query after the driver's
        // teardown); until then the exit handler waits for the round in progress.
        exit_gate::arm_or_stop();
        let Some(work) = exit_gate::begin_driver_work() else {
            continue;
        };
        // The flushes this round serves: those that asked before it looks.
        let serving = BARRIER.round_begins();
        let mut queues = queues();
        let was_idle = !queues.pending();
        let arrived;
        // Pools given back this round: their contexts, once released, may be gone.
        let mut released = Vec::new();
        let mut exit = false;
        // The newest request when this thread decided to exit (under the hand-over's lock, which
        // a flush asks under): a flush that asks later finds no poller, or the next one.
        let mut served_at_exit = serving;
        {
            let mut incoming = incoming();
            // It is looking now: an enqueue need not wake it.
            incoming.wake_on_enqueue = false;
            arrived = !incoming.entries.is_empty();
            for entry in incoming.entries.drain(..) {
                queues
                    .by_stream
                    .entry((entry.context, entry.stream, entry.thread))
                    .or_default()
                    .push_back(entry);
            }
            if !queues.pending() {
                let idle = *idle_since.get_or_insert_with(Instant::now);
                let asked = GIVE_BACK_ASKED.load(Ordering::SeqCst) > 0;
                if asked || idle.elapsed() >= settings.idle_exit {
                    // Under the hand-over's lock, then the pools': an enqueue that took an event
                    // keeps this thread (its event is out); one that has not yet finds no poller
                    // and starts another.
                    let mut pools = pools();
                    if !pools.any_out() {
                        released = pools.give_back_done(driver, true);
                        incoming.poller = None;
                        served_at_exit = BARRIER.round_begins();
                        exit = true;
                    }
                }
            } else {
                idle_since = None;
            }
        }
        if !exit {
            for queue in queues.by_stream.values_mut() {
                scan(driver, queue, &mut done, &mut stranded);
            }
        }
        let nothing_pending = !queues.pending();
        if nothing_pending || exit {
            // Paused or gone: the emptied queues of streams that may never come back go.
            queues.by_stream.retain(|_, queue| !queue.is_empty());
        }
        if !done.is_empty() || !stranded.is_empty() {
            // Under the queues' lock: a reset cannot forget a pool between the query and this.
            let mut pools = pools();
            calls.clear();
            for entry in &done {
                pools.give_back(
                    driver,
                    entry.context,
                    ptr::with_exposed_provenance_mut::<std::ffi::c_void>(entry.event) as CUevent,
                );
                // A callback keeps its pool's context retained until it ran on the lane.
                calls.push(
                    entry
                        .work
                        .calls()
                        .then(|| pools.call_out(entry.context))
                        .flatten(),
                );
            }
            if !stranded.is_empty() {
                for strand in &stranded {
                    // Its record stays pending (counted, reclaimed with its context).
                    pools.strand(strand.entry.context);
                }
                // A pool left with stranded events and none out holds its context for nothing:
                // the user's last release must be able to destroy it (and reclaim its work).
                released = pools.give_back_done(driver, false);
            }
        }
        drop(queues);
        let progress = !done.is_empty();
        fault_futures(&stranded);
        stranded.clear();
        let mut pushed = false;
        for (entry, call) in done.drain(..).zip(calls.drain(..)) {
            pushed |= complete(entry, call);
        }
        if pushed {
            lane::ring();
        }
        // Inside the exit gate (no driver call after the teardown), with no lock held: a
        // reclaim takes the locks. Only the work of contexts that are gone is taken.
        for (device, handle) in released {
            crate::transport::reclaim_after_release(driver, device, handle);
        }
        drop(work);
        if exit {
            BARRIER.round_done(served_at_exit);
            break;
        }
        BARRIER.round_done(serving);
        let round = Round {
            progress,
            arrived,
            was_idle,
            pending: !nothing_pending,
        };
        match pace.after_round(Instant::now(), round, &settings) {
            // Spinning: no query before the gap is over (a flush's or an enqueue's unpark does not
            // end a spin; the next round is at most a gap away).
            Some(Wait::Spin) => {
                let next = round_began + settings.query_gap;
                while Instant::now() < next {
                    std::hint::spin_loop();
                }
            }
            // A short pause: work enqueued meanwhile waits for it.
            Some(Wait::Park(pause)) if pause <= settings.interval => {
                std::thread::park_timeout(pause);
            }
            // A longer one, or nothing pending: an enqueue wakes it.
            Some(Wait::Park(pause)) => park_unless_enqueued(pause),
            None => park_unless_enqueued(settings.idle_exit),
        }
    }
    pace.count_cpu();
}
