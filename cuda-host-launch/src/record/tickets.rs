//! The process's ticket table: what the driver is handed as a run-once launch's `userData`,
//! instead of the record's address (the table and its protocol: `ticket_table.rs`).
//!
//! - Indices: 24 bits (up to 16,777,215 launches pending at once), in chunks of 4,096 tickets
//!   allocated on first use, never freed (a late call of the driver may look at any ticket at any
//!   time).
//! - Generations: 40 bits. A stale call is recognised unless its ticket was reused 2^40 times
//!   since (about a trillion launches through that one ticket).
//! - Each thread keeps a small cache of free indices; a releasing thread's cache spills to the
//!   table's list under a mutex, from which launching threads refill (once per [`BATCH`]
//!   launches). Never touched on a driver thread.
//! - A reclaim, and [`pending_launches`](crate::pending_launches), walk the tickets handed out so
//!   far: atomics only, no lock.

use std::cell::RefCell;
use std::ptr::NonNull;

use crate::support::context_key::ContextKey;

use super::layout::RecordHeader;
use super::ticket_id::{INDEX_BITS, TicketId};
use super::ticket_table::{Candidate, FreeCache, HeldTicket, TicketTable};

const CHUNK_BITS: u32 = 12;
const CHUNKS: usize = 1 << (INDEX_BITS - CHUNK_BITS);
/// How many free indices move between a thread's cache and the table's list at a time.
const BATCH: usize = 256;
// Every index of the table fits a ticket id's index.
const _: () = assert!(CHUNKS << CHUNK_BITS == 1 << INDEX_BITS);

type Table = TicketTable<CHUNK_BITS, CHUNKS, BATCH>;

/// The process's table.
static TABLE: Table = Table::new();

/// A thread's free indices; given back to the table's list when the thread exits.
struct ThreadCache(FreeCache);

impl Drop for ThreadCache {
    fn drop(&mut self) {
        TABLE.spill(&mut self.0);
    }
}

thread_local! {
    static CACHE: RefCell<ThreadCache> = const { RefCell::new(ThreadCache(FreeCache::new())) };
}

/// Takes a ticket for a launch of `record` into `context`, and holds it (LAUNCHING). `None` if
/// every ticket is in use.
pub(crate) fn take(
    record: NonNull<RecordHeader>,
    context: ContextKey,
) -> Option<HeldTicket<'static>> {
    let (record, key) = (record.as_ptr().cast(), (context.handle, context.id));
    match CACHE.try_with(|cache| TABLE.take(Some(&mut cache.borrow_mut().0), record, key)) {
        Ok(held) => held,
        // This thread's cache is gone (the thread is exiting).
        Err(_) => TABLE.take(None, record, key),
    }
}

/// Gives a ticket back once the record of its launch is released (or about to be, by the
/// caller): a later call of its generation does nothing.
pub(crate) fn give_back(id: TicketId) {
    if CACHE
        .try_with(|cache| TABLE.give_back(Some(&mut cache.borrow_mut().0), id))
        .is_err()
    {
        // This thread's cache is gone (the thread is exiting): straight to the table's list.
        TABLE.give_back(None, id);
    }
}

/// Takes a ticket for a record about to be launched into `context`, holding the launch
/// (LAUNCHING) until the caller reports how its launch call went
/// ([`HeldTicket::launched`], or the record's release), and notes it in the record (for
/// [`forget`]). `None` if every ticket is in use.
///
/// # Safety
/// `header` must be a live run-once record, not yet tracked, owned by the caller.
pub(crate) unsafe fn track(
    header: NonNull<RecordHeader>,
    context: ContextKey,
) -> Option<HeldTicket<'static>> {
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

/// Runs the launch of ticket `id` once, if this call wins it (see [`TicketTable::run`]): `run`
/// gets its record, then `release` gets it unless its launcher still holds it. Takes no lock and
/// allocates nothing: the trampoline's path on the driver's thread, and the watcher's.
#[inline(always)]
pub(crate) fn run(
    id: TicketId,
    run: impl FnOnce(NonNull<RecordHeader>),
    release: impl FnOnce(NonNull<RecordHeader>),
) {
    TABLE.run(
        id,
        |record| {
            // Never null for a launch that began (`take` stores a `NonNull`).
            if let Some(header) = NonNull::new(record.cast()) {
                run(header);
            }
        },
        |record| {
            if let Some(header) = NonNull::new(record.cast()) {
                release(header);
            }
        },
    );
}

/// The launches pending now whose context handle is `handle`, with the context each was read
/// with (see [`TicketTable::pending_in`]).
pub(crate) fn pending_in(handle: usize) -> Vec<(Candidate<'static>, ContextKey)> {
    TABLE
        .pending_in(handle)
        .into_iter()
        .map(|candidate| {
            let (handle, id) = candidate.context;
            (candidate, ContextKey { handle, id })
        })
        .collect()
}

/// A reclaim's claim of a launch [`pending_in`] found: its record, if the claim won.
pub(crate) fn reclaim(candidate: Candidate<'static>) -> Option<NonNull<RecordHeader>> {
    TABLE
        .reclaim(candidate)
        .and_then(|record| NonNull::new(record.cast()))
}

/// Calls `f` with the context of every launch in progress or pending now (a snapshot).
pub(crate) fn for_each_pending(mut f: impl FnMut(ContextKey)) {
    TABLE.for_each_pending(|(handle, id)| f(ContextKey { handle, id }));
}

/// The memory the tickets hold: every chunk allocated so far (never freed).
pub(crate) fn memory_bytes() -> usize {
    TABLE.memory_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Mutex;

    use crate::record::launch_state::LaunchOver;
    use crate::support::sync::lock;

    /// Taken by every test here: they share the table and the list of free tickets.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn tickets_given_back_are_reused_and_their_old_generation_is_stale() {
        let _serial = lock(&SERIAL);
        let record = NonNull::<RecordHeader>::dangling();
        let none = ContextKey { handle: 0, id: 0 };
        let first = take(record, none).unwrap().id;
        give_back(first);
        let before = memory_bytes();
        // Many launches, one pending at a time: the table does not grow.
        for _ in 0..3 << CHUNK_BITS {
            let id = take(record, none).unwrap().id;
            give_back(id);
        }
        assert_eq!(memory_bytes(), before, "tickets given back were not reused");
        // A call of the first launch's generation finds its ticket retired.
        let ticket = TABLE.ticket(first.index()).unwrap();
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
        let _serial = lock(&SERIAL);
        let record = NonNull::<RecordHeader>::dangling();
        let none = ContextKey { handle: 0, id: 0 };
        let held: Vec<TicketId> = (0..5 << CHUNK_BITS)
            .map(|_| take(record, none).expect("a ticket").id)
            .collect();
        let mut indices: Vec<u32> = held.iter().map(|id| id.index()).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), held.len(), "a ticket handed out twice");
        assert!(held.iter().all(|id| TABLE.ticket(id.index()).is_some()));
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
        let _serial = lock(&SERIAL);
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
        let free = TABLE.free_listed();
        let lost = given_back.iter().filter(|i| !free.contains(i)).count();
        assert_eq!(
            lost, 0,
            "free tickets of an exited thread not in the shared list"
        );
    }

    #[test]
    fn a_late_call_of_a_retired_launch_is_refused_after_its_ticket_is_reused() {
        use crate::record::launch_state::{Claim, RunClaim};
        let _serial = lock(&SERIAL);
        let record = NonNull::<RecordHeader>::dangling();
        let none = ContextKey { handle: 0, id: 0 };
        // A launch runs and is released: its ticket retires.
        let old = take(record, none).unwrap();
        let old_id = old.id;
        assert_eq!(old.launched(), LaunchOver::Done);
        let slot = TABLE.ticket(old_id.index()).unwrap();
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
