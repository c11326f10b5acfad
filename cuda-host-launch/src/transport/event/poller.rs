//! The watcher: one thread of this crate that queries the recorded events, newest of each
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Instant;

use cuda_dl_sys::types::{CUevent, CUresult};

use super::learned_wait::{self, LearnedWaits};
use super::{Entry, HANDOVER, Work, pools};
use crate::enqueue::pending;
use crate::reaper::{lane, release};
use crate::record::layout::{Op, RecordHeader};
use crate::support::context_key::{ContextKey, Gone, Liveness};
use crate::support::fast_hash::FastHash;
use crate::support::panic_report::PanicOrigin;
use crate::support::sticky_error;
use crate::support::sync::lock;
use crate::support::thread_slots::AllLocked;
use crate::transport::poller_pace::{LONGEST_PAUSE, Pace, PollerSettings, Round, Wait};

/// The entries waiting, by context, stream id and enqueuing thread, oldest first. An emptied
/// queue is kept (its buffer reused) until the poller pauses.
#[derive(Default)]
pub(in crate::transport) struct Queues {
    by_stream: HashMap<(ContextKey, u64, u64), VecDeque<Entry>, FastHash>,
}

impl Queues {
    /// Whether any entry waits.
    fn pending(&self) -> bool {
        self.by_stream.values().any(|queue| !queue.is_empty())
    }
}

static QUEUES: LazyLock<Mutex<Queues>> = LazyLock::new(Mutex::default);

/// Callers of [`wait_until_given_back`] waiting now: while there are any, the event side gives
/// its pools back as soon as nothing is pending and no event is out, not after
/// [`PollerSettings::idle_exit`], and the watcher stops as soon as both sides are idle.
static GIVE_BACK_ASKED: AtomicUsize = AtomicUsize::new(0);

/// Whether a caller waits for the pools to be given back (the watcher then stops without waiting
/// for its idle exit).
pub(in crate::transport) fn give_back_asked() -> bool {
    GIVE_BACK_ASKED.load(Ordering::SeqCst) > 0
}

/// See [`super::wait_until_given_back`].
pub(super) fn wait_until_given_back(deadline: Option<Instant>) -> bool {
    if crate::support::crate_threads::current()
        == Some(crate::support::thread_settings::CrateThread::Watcher)
    {
        return false;
    }
    GIVE_BACK_ASKED.fetch_add(1, Ordering::SeqCst);
    let given_back = loop {
        if pools().is_empty() {
            break true;
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            break false;
        }
        if crate::transport::bell::running() {
            // A round of both sides: the event side gives the pools back in the first with
            // nothing pending and no event out.
            crate::transport::bell::wait_for_round(deadline);
        } else {
            // Between an enqueue's ring and the watcher's start: it comes at once.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };
    GIVE_BACK_ASKED.fetch_sub(1, Ordering::SeqCst);
    given_back
}

pub(in crate::transport) fn queues() -> MutexGuard<'static, Queues> {
    lock(&QUEUES)
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

/// Forgets the queues, hand-over entries, stashed events and pools of the contexts of `handle`
/// that are gone: the contexts are collected first, under every slot's lock and the pools' (so
/// none is added meanwhile), then the handle is looked at (see `support::context_key`).
fn forget_gone_locked(
    queues: &mut Queues,
    handle: usize,
    look: &dyn Fn() -> Liveness,
    known: Gone,
) {
    HANDOVER.with_all_locked(|slots| {
        let mut pools = pools();
        // A stashed event's context has a pool (the event is counted out of it).
        let mut keys: Vec<ContextKey> = pools.keys_of(handle).collect();
        keys.extend(
            queues
                .by_stream
                .keys()
                .map(|(context, _, _)| *context)
                .chain(slots.entries().map(|entry| entry.context))
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
        slots.forget(|context| keys.contains(&context), |entry| entry.context);
        if let Some(driver) = cuda_dl_sys::Driver::get() {
            for key in keys {
                pools.forget(driver, key);
            }
        }
    });
}

/// Gives the events of `events` back to their pools.
fn to_pools(
    driver: &cuda_dl_sys::Driver,
    pools: &mut super::pools::Pools,
    events: &[(ContextKey, usize)],
) {
    for &(context, event) in events {
        pools.give_back(
            driver,
            context,
            ptr::with_exposed_provenance_mut::<std::ffi::c_void>(event) as CUevent,
        );
    }
}

/// Takes every slot's stash back into the pools (one slot at a time: a stashed event its thread
/// took meanwhile is an event out).
fn recall_stashes(driver: &cuda_dl_sys::Driver) {
    let mut recalled = Vec::new();
    HANDOVER.recall(|context, event| recalled.push((context, event)));
    if !recalled.is_empty() {
        to_pools(driver, &mut pools(), &recalled);
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
        // A failure that says nothing about the work: asked again in a later round. (Taken for a
        // loss, an injected out-of-memory left the stream's futures, releases and callbacks
        // waiting until the context's reset.)
        code if passing(code) => Seen::NotYet,
        // A sticky error, a lost context, or a failure this crate cannot read: nothing of the
        // stream will complete in its order; its work waits for the reclaim (and, on a sticky
        // error, its futures and callbacks end at once: `end_faulted`).
        code => Seen::Stranded {
            fault: Some(code.0),
        },
    }
}

/// Whether a query's failure `code` passes: a resource the driver could not get just then, or a
/// capture elsewhere that refused the query (the watcher's relaxed capture mode should prevent it).
fn passing(code: CUresult) -> bool {
    matches!(
        code,
        CUresult::CUDA_ERROR_OUT_OF_MEMORY
            | CUresult::CUDA_ERROR_OPERATING_SYSTEM
            | CUresult::CUDA_ERROR_TIMEOUT
            | CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            | CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
            | CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
    )
}

/// An entry that will never complete, and the sticky error that says so (none: a capture holds
/// its event).
struct Strand {
    entry: Entry,
    fault: Option<u32>,
}

/// Moves the completed entries of one stream's queue to `done` and the ones that never will to
/// `stranded`: the newest first (its completion completes every older one), else from the oldest.
/// Returns the newest's arrival if it was the one queried done (a sample of the stream's wait).
fn scan(
    driver: &cuda_dl_sys::Driver,
    queue: &mut VecDeque<Entry>,
    done: &mut Vec<Entry>,
    stranded: &mut Vec<Strand>,
) -> Option<Instant> {
    let newest = queue.back()?;
    let whole = |queue: &mut VecDeque<Entry>, stranded: &mut Vec<Strand>, fault| {
        stranded.extend(queue.drain(..).map(|entry| Strand { entry, fault }));
    };
    match query(driver, newest.event) {
        Seen::Done => {
            let arrived = newest.arrived;
            done.extend(queue.drain(..));
            return arrived;
        }
        Seen::Stranded { fault: Some(code) } => {
            whole(queue, stranded, Some(code));
            return None;
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
    None
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

/// Ends what waits among `stranded` entries whose context failed with a sticky error, at once:
/// a future resolves to [`Error::DeviceFault`](crate::Error::DeviceFault) with the driver's code
/// (its record stays pending until the context's reclaim); a callback, which would never run, is
/// claimed and dropped unrun on the lane, its captures with it, and counted
/// ([`CleanupStats::callbacks_dropped_unrun`](crate::CleanupStats::callbacks_dropped_unrun)). A
/// release's owners stay pending until the reset or the last release: what they hold may still
/// be in use by the device as far as the host can tell. Returns whether it pushed to the lane.
fn end_faulted(stranded: &[Strand]) -> bool {
    let mut pushed = false;
    for strand in stranded {
        let Some(code) = strand.fault else { continue };
        if !sticky_error::is_sticky(CUresult(code)) {
            continue;
        }
        match &strand.entry.work {
            Work::Wake(shared) => {
                if let Some(panic) = shared.fault(code) {
                    lane::report_there(PanicOrigin::Waker, panic);
                }
            }
            Work::Call => pending::run_launch_then(
                strand.entry.ticket,
                |_| {},
                |header| {
                    release::count_callback_dropped_unrun();
                    // SAFETY: claimed for this call, nobody else holds the record now; its
                    // release drops the callback unrun.
                    unsafe { lane::push(header) };
                    pushed = true;
                },
            ),
            Work::Release => {}
        }
    }
    pushed
}

/// The event side of the watcher (`transport::watcher`): the entries it completed or stranded in
/// its last round (kept to reuse their buffers), its pace, and since when it has had nothing
/// pending.
pub(in crate::transport) struct EventWatch {
    pace: Pace,
    done: Vec<Entry>,
    stranded: Vec<Strand>,
    /// For each of `done`: a callback's count in its pool (see `Pools::call_out`).
    calls: Vec<Option<Arc<AtomicUsize>>>,
    idle_since: Option<Instant>,
    /// When it next looks for pools idle while other work is pending (`Pools::give_back_idle_for`).
    next_pool_look: Instant,
    /// When its last round began (while it spins, the next waits for the query gap).
    round_began: Instant,
    /// How long each stream's work usually takes (for [`PollerSettings::learned_spin`]).
    learned: LearnedWaits,
    /// The windows of the streams pending after a round (kept to reuse the buffer).
    windows: Vec<Option<learned_wait::Window>>,
    /// The events of `done`, with their threads' numbers, on their way to the stashes (kept to
    /// reuse the buffer).
    returns: Vec<(u64, ContextKey, usize)>,
    /// Events on their way back to their pools (kept to reuse the buffer).
    overflow: Vec<(ContextKey, usize)>,
    /// The entries of one slot, swapped out of it (`Handover::take_entries`; empty between
    /// rounds, kept for its buffer).
    handed: Vec<Entry>,
}

impl EventWatch {
    pub(in crate::transport) fn new() -> EventWatch {
        EventWatch {
            pace: Pace::start(),
            done: Vec::new(),
            stranded: Vec::new(),
            calls: Vec::new(),
            idle_since: None,
            next_pool_look: Instant::now(),
            round_began: Instant::now(),
            learned: LearnedWaits::default(),
            windows: Vec::new(),
            returns: Vec::new(),
            overflow: Vec::new(),
            handed: Vec::new(),
        }
    }

    /// One round: takes the entries handed over, queries the newest event of each stream and
    /// completes what completed (user code to the lane), strands what never will. With nothing
    /// pending for the settings' `idle_exit`, gives the idle pools back (their retains: the user's
    /// last release can then destroy the context). Called inside the exit gate. Returns what it
    /// saw, and when it wants to look again (`None`: when woken).
    pub(in crate::transport) fn round(
        &mut self,
        driver: &cuda_dl_sys::Driver,
        settings: &PollerSettings,
    ) -> (Round, Option<Wait>) {
        // The last round looked at every stream then pending.
        let looked_before = self.round_began;
        self.round_began = Instant::now();
        let mut queues = queues();
        let was_idle = !queues.pending();
        let arrived;
        // Pools given back this round: their contexts, once released, may be gone.
        let mut released = Vec::new();
        {
            // It is looking now: an enqueue need not wake it.
            HANDOVER.looking();
            let began = self.round_began;
            arrived = HANDOVER.take_entries(&mut self.handed, |entries| {
                for mut entry in entries.drain(..) {
                    entry.arrived = Some(began);
                    queues
                        .by_stream
                        .entry((entry.context, entry.stream, entry.thread))
                        .or_default()
                        .push_back(entry);
                }
            });
            if !queues.pending() {
                let idle = *self.idle_since.get_or_insert_with(Instant::now);
                if give_back_asked() || idle.elapsed() >= settings.idle_exit {
                    // The stashes first, then the pools: an enqueue that took an event keeps its
                    // pool (its event is out).
                    recall_stashes(driver);
                    if let Some(given_back) = pools().give_back_all_if_none_out(driver) {
                        released = given_back;
                    }
                }
            } else {
                self.idle_since = None;
                // Work is pending, maybe in one context only: another context's pool that has
                // held its context for nothing for `idle_exit` goes back now, not once every
                // context is idle (the user's last release of it must be able to destroy it and
                // reclaim its work). Looked at four times per `idle_exit` at most.
                if self.round_began >= self.next_pool_look {
                    self.next_pool_look = self.round_began + settings.idle_exit / 4;
                    recall_stashes(driver);
                    released =
                        pools().give_back_idle_for(driver, self.round_began, settings.idle_exit);
                }
            }
        }
        for (&(context, stream, _), queue) in &mut queues.by_stream {
            let (oldest, before) = (queue.front().and_then(|entry| entry.arrived), queue.len());
            if let Some(arrived) = scan(driver, queue, &mut self.done, &mut self.stranded) {
                self.learned
                    .learn_seen((context, stream), arrived, looked_before, Instant::now());
            } else if let Some(oldest) = oldest.filter(|_| queue.len() < before) {
                // Completed oldest first, newer work still pending: no sample, but one seen
                // earlier than learned ends the stream's regular pauses.
                self.learned
                    .seen_early_maybe((context, stream), oldest, Instant::now());
            }
        }
        let nothing_pending = !queues.pending();
        // When the oldest entry of each stream pending is expected to complete (what it waits for
        // next; `None`: not known).
        self.windows.clear();
        if settings.learned_spin && !nothing_pending {
            self.learned.windows_of(
                queues
                    .by_stream
                    .iter()
                    .filter_map(|(&(context, stream, _), queue)| {
                        Some(((context, stream), queue.front()?.arrived, queue.len()))
                    }),
                &mut self.windows,
            );
        }
        if nothing_pending {
            // Paused: the emptied queues of streams that may never come back go.
            queues.by_stream.retain(|_, queue| !queue.is_empty());
        }
        if !self.done.is_empty() || !self.stranded.is_empty() {
            // Under the queues' lock: a reset cannot forget a pool (or clear the stashes) between
            // the query and this. The completed events go to the stashes of the threads that
            // recorded them (no pool's lock held: an enqueue takes its slot's, then the pools').
            self.returns.clear();
            self.returns.extend(
                self.done
                    .iter()
                    .map(|entry| (entry.thread, entry.context, entry.event)),
            );
            self.overflow.clear();
            let overflow = &mut self.overflow;
            HANDOVER.stash(&mut self.returns, |context, event| {
                overflow.push((context, event))
            });
            if !self.stranded.is_empty() {
                // A pool left with stranded events holds its context for nothing once none is out
                // (below): its stashed events are not out.
                HANDOVER.recall(|context, event| overflow.push((context, event)));
            }
            let mut pools = pools();
            to_pools(driver, &mut pools, &self.overflow);
            self.calls.clear();
            for entry in &self.done {
                // A callback keeps its pool's context retained until it ran on the lane.
                self.calls.push(
                    entry
                        .work
                        .calls()
                        .then(|| pools.call_out(entry.context))
                        .flatten(),
                );
            }
            if !self.stranded.is_empty() {
                for strand in &self.stranded {
                    // Its record stays pending (counted, reclaimed with its context).
                    pools.strand(strand.entry.context);
                }
                // A pool left with stranded events and none out holds its context for nothing:
                // the user's last release must be able to destroy it (and reclaim its work).
                released.extend(pools.give_back_done(driver, false));
            }
        }
        drop(queues);
        let progress = !self.done.is_empty();
        let mut pushed = end_faulted(&self.stranded);
        self.stranded.clear();
        for (entry, call) in self.done.drain(..).zip(self.calls.drain(..)) {
            pushed |= complete(entry, call);
        }
        if pushed {
            lane::ring();
        }
        // With no lock held: a reclaim takes the locks. Only the work of contexts that are gone
        // is taken.
        for (device, handle) in released {
            crate::transport::reclaim_after_release(driver, device, handle);
        }
        let round = Round {
            progress,
            arrived,
            was_idle,
            pending: !nothing_pending,
        };
        let now = Instant::now();
        let wait = self.pace.after_round(now, round, settings);
        (
            round,
            learned_wait::adjust(
                wait,
                now,
                self.windows.iter().copied(),
                settings.max_interval.min(LONGEST_PAUSE),
            ),
        )
    }

    /// When this side wants its next round, after one that said `wait` (`None`: not before an
    /// enqueue wakes the watcher, or its idle pools are due back). While it spins, a round every
    /// `query_gap` at most: every query takes the driver's lock, which the enqueues also take;
    /// but none inside the window of long work, whose end is expected now
    /// ([`learned_wait::spins_without_gap`]).
    pub(in crate::transport) fn next_round(
        &self,
        wait: Option<Wait>,
        settings: &PollerSettings,
    ) -> Option<Instant> {
        match wait {
            Some(Wait::Spin)
                if learned_wait::spins_without_gap(
                    self.windows.iter().copied(),
                    Instant::now(),
                ) =>
            {
                Some(self.round_began)
            }
            Some(Wait::Spin) => Some(self.round_began + settings.query_gap),
            Some(Wait::Park(pause)) => Some(Instant::now() + pause),
            None => self
                .idle_since
                .filter(|_| !pools().is_empty())
                .map(|idle| idle + settings.idle_exit),
        }
    }

    /// Whether an enqueue must wake the watcher for this side to see it soon: it waits for a
    /// pause longer than its shortest, or for nothing (`support::thread_slots`' `wake_on_enqueue`, which an
    /// enqueue takes under its slot's lock after handing over); `false` if entries already wait
    /// (the watcher must not park then).
    pub(in crate::transport) fn ask_to_be_woken(
        wait: Option<Wait>,
        settings: &PollerSettings,
    ) -> bool {
        let long = match wait {
            Some(Wait::Spin) => false,
            Some(Wait::Park(pause)) => pause > settings.interval,
            None => true,
        };
        if !long {
            // The round cleared it already: it looks again soon on its own.
            return true;
        }
        HANDOVER.ask_to_be_woken()
    }

    /// Whether nothing is pending or handed over, with no event out: the watcher may stop. Its
    /// idle pools are given back, the stashes first (under every slot's lock, which the caller
    /// holds, then the pools'): an enqueue that took an event keeps the watcher (its event is out).
    pub(in crate::transport) fn stop_if_idle(
        driver: &cuda_dl_sys::Driver,
        slots: &mut AllLocked<'_, '_, Entry, ContextKey>,
        queues: &Queues,
    ) -> Option<Vec<(cuda_dl_sys::types::CUdevice, usize)>> {
        if queues.pending() || !slots.no_entries() {
            return None;
        }
        let mut pools = pools();
        slots.recall(|context, event| to_pools(driver, &mut pools, &[(context, event)]));
        pools.give_back_all_if_none_out(driver)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// While it spins, the next round waits for the query gap, unless the window of long work is
    /// open now; a short work's open window keeps the gap. (Mutation testing: the match guard.)
    #[test]
    fn a_spinning_side_waits_for_its_query_gap_outside_the_window_of_long_work() {
        let settings = PollerSettings::DEFAULT;
        let mut watch = EventWatch::new();
        let began = watch.round_began;
        let gapped = Some(began + settings.query_gap);
        assert_eq!(watch.next_round(Some(Wait::Spin), &settings), gapped);
        let open = |long| learned_wait::Window {
            from: began,
            until: began + Duration::from_secs(3600),
            regular: true,
            long,
        };
        watch.windows.push(Some(open(false)));
        assert_eq!(watch.next_round(Some(Wait::Spin), &settings), gapped);
        watch.windows.push(Some(open(true)));
        assert_eq!(watch.next_round(Some(Wait::Spin), &settings), Some(began));
    }
}
