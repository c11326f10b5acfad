//! Tickets: what the driver is handed as a run-once launch's `userData`, instead of the record's
//! address.
//!
//! A ticket is a slot of a table that is never freed: its [`LaunchState`] (generation and state),
//! the record and the context of the launch that holds it. The `userData` is the ticket's index
//! and the generation of that launch, packed into the pointer's 64 bits. So the trampoline can
//! always look at the ticket, whatever happened to the record, and a call of an old generation (a
//! replay of a graph that captured a launch long released) is recognised and does nothing.
//!
//! - Indices: 24 bits (up to 16,777,215 launches pending at once, index 0 unused so that no
//!   `userData` is null), in chunks of 4,096 tickets allocated on first use, never freed.
//! - Generations: 40 bits. A stale call is recognised unless its ticket was reused 2^40 times
//!   since (about a trillion launches through that one ticket).
//! - Each thread keeps a small cache of free indices; a releasing thread's cache spills to a
//!   global list under a mutex, from which launching threads refill (once per [`BATCH`] launches).
//!   Never touched on a driver thread.
//! - A reclaim, and [`pending_launches`](crate::pending_launches), walk the tickets handed out so
//!   far: atomics only, no lock.

use std::cell::RefCell;
use std::ptr::{self, NonNull};
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::support::context_key::ContextKey;

use super::launch_state::{LaunchOver, LaunchState};
use super::layout::RecordHeader;
use super::ticket_id::{INDEX_BITS, INDEX_MASK, TicketId};

const CHUNK_BITS: u32 = 12;
const CHUNK_LEN: usize = 1 << CHUNK_BITS;
const CHUNKS: usize = 1 << (INDEX_BITS - CHUNK_BITS);
/// How many free indices move between a thread's cache and the global list at a time.
const BATCH: usize = 256;

/// One launch's slot.
pub(crate) struct Ticket {
    /// The launch's generation and ownership state.
    pub(crate) state: LaunchState,
    /// Written by the launcher before its launch begins; read by whoever claims it.
    record: AtomicPtr<RecordHeader>,
    /// Written by the launcher before its launch begins; read by a reclaim and a count.
    context: AtomicUsize,
    /// The context's `cuCtxGetId` (0 before 12.0): the handle alone may name a later context.
    context_id: AtomicU64,
}

impl Ticket {
    /// The record of the launch whose generation the caller claimed (or holds).
    pub(crate) fn record(&self) -> Option<NonNull<RecordHeader>> {
        // Written before the launch began (Release), read after a claim (Acquire); never null for
        // a launch that began.
        NonNull::new(self.record.load(Ordering::Relaxed))
    }

    /// The context handle of the launch whose generation the caller saw pending.
    pub(crate) fn context(&self) -> usize {
        self.context.load(Ordering::Relaxed)
    }

    /// The context (handle and id) of the launch whose generation the caller saw pending.
    pub(crate) fn context_key(&self) -> ContextKey {
        ContextKey {
            handle: self.context.load(Ordering::Relaxed),
            id: self.context_id.load(Ordering::Relaxed),
        }
    }
}

/// The chunks; a chunk, once stored, is never freed or replaced.
static DIRECTORY: [AtomicPtr<Ticket>; CHUNKS] = [const { AtomicPtr::new(ptr::null_mut()) }; CHUNKS];
/// Indices handed out so far are `1..HIGH`; their chunks are allocated.
static HIGH: AtomicU32 = AtomicU32::new(1);
/// Guards growing (a new index, a new chunk).
static GROW: Mutex<()> = Mutex::new(());
/// Free indices not in any thread's cache.
static FREE: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// A thread's free indices; given back to the global list when the thread exits.
struct Cache(Vec<u32>);

impl Drop for Cache {
    fn drop(&mut self) {
        lock(&FREE).append(&mut self.0);
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = const { RefCell::new(Cache(Vec::new())) };
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The ticket at `index`, if it was ever handed out.
#[inline]
pub(crate) fn ticket(index: u32) -> Option<&'static Ticket> {
    let chunk = DIRECTORY
        .get(index as usize >> CHUNK_BITS)?
        .load(Ordering::Acquire);
    if chunk.is_null() {
        return None;
    }
    // SAFETY: a stored chunk holds CHUNK_LEN tickets and is never freed; the offset is below it.
    Some(unsafe { &*chunk.add(index as usize & (CHUNK_LEN - 1)) })
}

/// A free index: from this thread's cache, else a batch from the global list, else a new one.
/// `None` if every index is in use.
fn take_index() -> Option<u32> {
    let cached = CACHE.try_with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.0.is_empty() {
            let mut free = lock(&FREE);
            let from = free.len().saturating_sub(BATCH);
            cache.0.extend(free.drain(from..));
        }
        cache.0.pop()
    });
    match cached {
        Ok(Some(index)) => Some(index),
        // The global list was empty too.
        Ok(None) => new_index(),
        // This thread's cache is gone (the thread is exiting).
        Err(_) => lock(&FREE).pop().or_else(new_index),
    }
}

/// An index never handed out before, with its chunk allocated.
#[cold]
fn new_index() -> Option<u32> {
    let _grow = lock(&GROW);
    let index = HIGH.load(Ordering::Relaxed);
    if u64::from(index) > INDEX_MASK {
        return None;
    }
    let slot = &DIRECTORY[index as usize >> CHUNK_BITS];
    if slot.load(Ordering::Relaxed).is_null() {
        let chunk: Box<[Ticket]> = (0..CHUNK_LEN)
            .map(|_| Ticket {
                state: LaunchState::new(),
                record: AtomicPtr::new(ptr::null_mut()),
                context: AtomicUsize::new(0),
                context_id: AtomicU64::new(0),
            })
            .collect();
        // Leaked on purpose: tickets are never freed (a late call may look at one at any time).
        slot.store(Box::leak(chunk).as_mut_ptr(), Ordering::Release);
    }
    HIGH.store(index + 1, Ordering::Release);
    Some(index)
}

/// A ticket its launcher holds (LAUNCHING) until its launch call returned.
pub(crate) struct HeldTicket {
    /// The id the driver gets as `userData`, and the record's to give back on release.
    pub(crate) id: TicketId,
    ticket: &'static Ticket,
}

impl HeldTicket {
    /// The launch call returned success: hands the launch over to the driver's thread (or tells
    /// the launcher to queue the record, if its host function already ran).
    pub(crate) fn launched(self) -> LaunchOver {
        self.ticket.state.launched(self.id.generation())
    }
}

/// Takes a ticket for a launch of `record` into `context`, and holds it (LAUNCHING). `None` if
/// every ticket is in use.
pub(crate) fn take(record: NonNull<RecordHeader>, context: ContextKey) -> Option<HeldTicket> {
    let index = take_index()?;
    let ticket = ticket(index)?;
    let generation = ticket.state.next_generation();
    ticket.record.store(record.as_ptr(), Ordering::Relaxed);
    ticket.context.store(context.handle, Ordering::Relaxed);
    ticket.context_id.store(context.id, Ordering::Relaxed);
    // Release: the record and context above are seen by whoever sees this generation.
    ticket.state.begin(generation);
    Some(HeldTicket {
        id: TicketId::new(index, generation)?,
        ticket,
    })
}

/// Gives a ticket back once the record of its launch is released (or about to be, by the
/// caller): a later call of its generation does nothing.
pub(crate) fn give_back(id: TicketId) {
    let Some(ticket) = ticket(id.index()) else {
        return;
    };
    ticket.state.retire(id.generation());
    let index = id.index();
    let kept = CACHE.try_with(|cache| {
        let mut cache = cache.borrow_mut();
        cache.0.push(index);
        if cache.0.len() >= 2 * BATCH {
            let from = cache.0.len() - BATCH;
            lock(&FREE).extend(cache.0.drain(from..));
        }
    });
    if kept.is_err() {
        // This thread's cache is gone (the thread is exiting): straight to the global list.
        lock(&FREE).push(index);
    }
}

/// Takes a ticket for a record about to be launched into `context`, holding the launch
/// (LAUNCHING) until the caller reports how its launch call went
/// ([`HeldTicket::launched`], or the record's release). Returns the held ticket, whose id is the
/// launch's `userData`; `None` if every ticket is in use.
///
/// # Safety
/// `header` must be a live run-once record, not yet tracked, owned by the caller.
pub(crate) unsafe fn track(
    header: NonNull<RecordHeader>,
    context: ContextKey,
) -> Option<HeldTicket> {
    let held = take(header, context)?;
    // SAFETY: the record is live and ours.
    unsafe { RecordHeader::ticket(header) }.with_mut(|ticket| {
        // SAFETY: the record is ours; nobody else reads this field before the launch.
        unsafe { *ticket = Some(held.id) }
    });
    Some(held)
}

/// Before a record is released: gives its launch's ticket back, if it was launched. Called by
/// whoever releases the record (never on a driver thread).
pub(crate) fn forget(header: NonNull<RecordHeader>) {
    // SAFETY: the record is live and the caller's.
    let launched = unsafe { RecordHeader::ticket(header) }.with_mut(|ticket| {
        // SAFETY: the caller owns the record; the launcher's write is ordered before this read.
        unsafe { (*ticket).take() }
    });
    if let Some(launched) = launched {
        give_back(launched);
    }
}

/// Calls `f` with every ticket handed out so far (some free, some in use).
pub(crate) fn for_each(mut f: impl FnMut(&'static Ticket)) {
    let high = HIGH.load(Ordering::Acquire);
    for index in 1..high {
        if let Some(ticket) = ticket(index) {
            f(ticket);
        }
    }
}

/// The memory the tickets hold: every chunk allocated so far (never freed).
pub(crate) fn memory_bytes() -> usize {
    let handed_out = HIGH.load(Ordering::Acquire) as usize;
    handed_out.div_ceil(CHUNK_LEN) * CHUNK_LEN * size_of::<Ticket>()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Taken by every test here: they share the table and the list of free tickets.
    static TABLE: Mutex<()> = Mutex::new(());

    #[test]
    fn tickets_given_back_are_reused_and_their_old_generation_is_stale() {
        let _table = lock(&TABLE);
        let record = NonNull::<RecordHeader>::dangling();
        let none = ContextKey { handle: 0, id: 0 };
        let first = take(record, none).unwrap().id;
        give_back(first);
        let before = memory_bytes();
        // Many launches, one pending at a time: the table does not grow.
        for _ in 0..3 * CHUNK_LEN {
            let id = take(record, none).unwrap().id;
            give_back(id);
        }
        assert_eq!(memory_bytes(), before, "tickets given back were not reused");
        // A call of the first launch's generation finds its ticket retired.
        let ticket = ticket(first.index()).unwrap();
        assert_eq!(
            ticket.state.claim_run(first.generation()),
            crate::record::launch_state::Claim::Skip
        );
    }

    /// Launches pending at once get distinct tickets across many chunks, each found again by its
    /// index. (Mutation testing: with the directory sized `1 << (24 / 12)` chunks instead of
    /// `1 << (24 - 12)`, the fifth chunk's first ticket indexed past the directory.)
    #[test]
    fn tickets_held_at_once_span_many_chunks() {
        let _table = lock(&TABLE);
        let record = NonNull::<RecordHeader>::dangling();
        let none = ContextKey { handle: 0, id: 0 };
        let held: Vec<TicketId> = (0..5 * CHUNK_LEN)
            .map(|_| take(record, none).expect("a ticket").id)
            .collect();
        let mut indices: Vec<u32> = held.iter().map(|id| id.index()).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), held.len(), "a ticket handed out twice");
        assert!(held.iter().all(|id| ticket(id.index()).is_some()));
        for id in held {
            give_back(id);
        }
    }

    /// A thread's cached free tickets go back to the shared list when it exits, for other threads
    /// to reuse. (Mutation testing: with the cache's drop doing nothing, an exiting thread's free
    /// tickets were lost for good: a program that starts and ends threads grew its table until
    /// launches failed.)
    #[test]
    fn an_exiting_threads_free_tickets_go_back_to_the_shared_list() {
        let _table = lock(&TABLE);
        let given_back: Vec<u32> = std::thread::spawn(|| {
            let record = NonNull::<RecordHeader>::dangling();
            let none = ContextKey { handle: 0, id: 0 };
            // Fewer than the cache keeps: all of them stay in this thread's cache.
            let held: Vec<TicketId> = (0..BATCH)
                .map(|_| take(record, none).expect("a ticket").id)
                .collect();
            let indices = held.iter().map(|id| id.index()).collect();
            for id in held {
                give_back(id);
            }
            indices
        })
        .join()
        .expect("the thread");
        let free = lock(&FREE);
        let lost = given_back.iter().filter(|i| !free.contains(i)).count();
        assert_eq!(
            lost, 0,
            "free tickets of an exited thread not in the shared list"
        );
    }

    #[test]
    fn a_late_call_of_a_retired_launch_is_refused_after_its_ticket_is_reused() {
        use crate::record::launch_state::{Claim, RunClaim};
        let _table = lock(&TABLE);
        let record = NonNull::<RecordHeader>::dangling();
        let none = ContextKey { handle: 0, id: 0 };
        // A launch runs and is released: its ticket retires.
        let old = take(record, none).unwrap();
        let old_id = old.id;
        assert_eq!(old.launched(), LaunchOver::Done);
        let slot = ticket(old_id.index()).unwrap();
        let run = slot.state.claim_run(old_id.generation());
        assert_eq!(run, Claim::Run(RunClaim::Pending));
        assert!(slot.state.run_over(old_id.generation(), RunClaim::Pending));
        give_back(old_id);
        // The same ticket (this thread's cache hands it out again) for the next launch, pending:
        // a late call of the old one (a replay of a graph that captured it) must touch nothing.
        let new = take(record, none).unwrap();
        let new_id = new.id;
        assert_eq!(new_id.index(), old_id.index(), "the ticket was not reused");
        assert_eq!(new.launched(), LaunchOver::Done);
        assert_eq!(
            slot.state.claim_run(old_id.generation()),
            Claim::Skip,
            "a call of the retired launch was accepted as the pending launch of its ticket"
        );
        assert_ne!(new_id.generation(), old_id.generation());
        assert_eq!(slot.state.pending_generation(), Some(new_id.generation()));
        // The new launch's own call still runs it, once.
        let run = slot.state.claim_run(new_id.generation());
        assert_eq!(run, Claim::Run(RunClaim::Pending));
        assert_eq!(slot.state.claim_run(new_id.generation()), Claim::Skip);
        give_back(new_id);
    }
}
