//! Model checks, with loom, of the ticket table (`record/ticket_table.rs`): the library's own
//! [`TicketTable`], small (chunks of two tickets, two chunks, free indices moved one at a time), so
//! that growing, the free list and reuse all happen within a few steps.
//!
//! - Launchers taking tickets at once get distinct ones, each found by its index, even while
//!   another grows the table; indices given back (through the caches and the table's list) are
//!   reused, and a call of an old generation finds nothing to run.
//! - A reclaim's walk races a ticket's run, release and reuse by a new launch: the walk's claim
//!   takes only the generation it saw, and a launch it claims is the one of that generation (its
//!   record is what the claim reads, ordered after the launcher's writes: each record is a
//!   `loom::cell::UnsafeCell` that the launcher writes before its take and the claimer reads).
//!
//! Run them with `scripts/loom loom_tickets`.

use std::collections::HashSet;
use std::ptr;
use std::sync::{Arc, Mutex as StdMutex};

use loom::cell::UnsafeCell;
use loom::thread;

use super::check;
use crate::record::launch_state::{Claim, LaunchOver};
use crate::record::ticket_table::{FreeCache, TicketTable};

/// Two chunks of two tickets (indices 1, 2 and 3), free indices moved one at a time.
type Table = TicketTable<1, 2, 1>;

/// A record: the cell its launcher writes before the launch and whoever runs or reclaims it reads.
struct Record(UnsafeCell<usize>);

// SAFETY: shared between the model's threads on purpose: loom checks every access to the cell.
unsafe impl Send for Record {}
// SAFETY: as above.
unsafe impl Sync for Record {}

impl Record {
    fn new() -> Arc<Record> {
        Arc::new(Record(UnsafeCell::new(0)))
    }

    /// The launcher fills the record, then hands out its address.
    fn fill(&self, value: usize) -> *mut () {
        self.0.with_mut(|p| {
            // SAFETY: loom checks that nobody reads it concurrently.
            unsafe { *p = value }
        });
        ptr_of(self)
    }

    /// What the launcher wrote (loom reports a read not ordered after that write).
    fn read(&self) -> usize {
        self.0.with(|p| {
            // SAFETY: loom checks the order against the launcher's write.
            unsafe { *p }
        })
    }
}

/// Reads the record at `address`, a record's address as [`Record::fill`] handed it out to the
/// table (the model keeps every record alive until it ends).
fn read_at(address: *mut ()) -> usize {
    // SAFETY: `address` is a live `Record`'s (see above); `read` takes `&self`.
    unsafe { &*address.cast::<Record>() }.read()
}

fn ptr_of(record: &Record) -> *mut () {
    ptr::from_ref(record).cast_mut().cast()
}

/// The shared table, in a plain `Arc` (see `loom_models`).
fn table() -> Arc<Table> {
    Arc::new(Table::new())
}

#[test]
fn loom_tickets_taken_at_once_are_distinct_and_reused_with_a_new_generation() {
    check("tickets_taken_at_once", 3, || {
        let table = table();
        let (a, b) = (Record::new(), Record::new());
        // The indices held now: a ticket is never handed to a second launch while held.
        let held_now = Arc::new(StdMutex::new(HashSet::new()));
        let launcher = |record: Arc<Record>, value: usize| {
            let table = Arc::clone(&table);
            let held_now = Arc::clone(&held_now);
            thread::spawn(move || {
                let mut cache = FreeCache::new();
                let held = table
                    .take(Some(&mut cache), record.fill(value), (1, 1))
                    .expect("a ticket");
                let id = held.id;
                assert!(
                    held_now.lock().unwrap().insert(id.index()),
                    "one ticket held by two launches"
                );
                assert_eq!(held.launched(), LaunchOver::Done);
                // The ticket found by its index holds this launch: the run reads its record.
                let mut ran = 0;
                table.run(id, |r| ran = read_at(r), |_| {});
                assert_eq!(ran, value, "a ticket ran another launch's record");
                held_now.lock().unwrap().remove(&id.index());
                table.give_back(Some(&mut cache), id);
                table.spill(&mut cache);
                id
            })
        };
        let (first, second) = (launcher(Arc::clone(&a), 1), launcher(Arc::clone(&b), 2));
        let (first, second) = (first.join().unwrap(), second.join().unwrap());
        // Both indices are free again: the next launches reuse them, in a new generation, and a
        // call of an old generation finds nothing to run.
        let c = Record::new();
        let mut cache = FreeCache::new();
        let held = table
            .take(Some(&mut cache), c.fill(3), (1, 1))
            .expect("a reused ticket");
        let again = held.id;
        assert_eq!(held.launched(), LaunchOver::Done);
        assert!([first.index(), second.index()].contains(&again.index()));
        let old = if again.index() == first.index() {
            first
        } else {
            second
        };
        assert_ne!(again.generation(), old.generation());
        let mut stale_ran = false;
        table.run(old, |_| stale_ran = true, |_| {});
        assert!(!stale_ran, "a call of an old generation ran the new launch");
        let ticket = table.ticket(again.index()).unwrap();
        assert_eq!(ticket.state.pending_generation(), Some(again.generation()));
        assert_eq!(ticket.state.claim_run(old.generation()), Claim::Skip);
    });
}

#[test]
fn loom_tickets_a_walk_claims_only_the_generation_it_saw() {
    // The context (handle 1, id 2) is gone; (1, 1) lives.
    const GONE: (usize, u64) = (1, 2);
    check("tickets_walk_and_reuse", 3, || {
        let table = table();
        let (first, second) = (Record::new(), Record::new());
        // A launch pending in the living context.
        let mut cache = FreeCache::new();
        let held = table
            .take(Some(&mut cache), first.fill(1), (1, 1))
            .expect("a ticket");
        let first_id = held.id;
        assert_eq!(held.launched(), LaunchOver::Done);
        // The driver's thread runs it; its release gives the ticket back, and a new launch (of
        // the context that is then lost) takes the same ticket.
        let driver = {
            let table = Arc::clone(&table);
            let second = Arc::clone(&second);
            thread::spawn(move || {
                let mut ran = 0;
                let mut released = false;
                table.run(first_id, |r| ran = read_at(r), |_| released = true);
                assert_eq!((ran, released), (1, true));
                table.give_back(Some(&mut cache), first_id);
                let held = table
                    .take(Some(&mut cache), second.fill(2), GONE)
                    .expect("the ticket again");
                assert_eq!(
                    held.id.index(),
                    first_id.index(),
                    "the ticket was not reused"
                );
                let id = held.id;
                assert_eq!(held.launched(), LaunchOver::Done);
                id
            })
        };
        // A reclaim of the lost context walks meanwhile.
        let reclaim = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                let mut reclaimed = Vec::new();
                for candidate in table.pending_in(1) {
                    if candidate.context == GONE
                        && let Some(record) = table.reclaim(candidate)
                    {
                        reclaimed.push(read_at(record));
                    }
                }
                reclaimed
            })
        };
        let reclaimed = reclaim.join().unwrap();
        let second_id = driver.join().unwrap();
        assert!(
            reclaimed.iter().all(|&value| value == 2),
            "a reclaim took a launch of a living context (or a stale record): {reclaimed:?}"
        );
        let ticket = table.ticket(second_id.index()).unwrap();
        if reclaimed.is_empty() {
            // The walk came before the second launch: it is still pending, for a later reclaim.
            assert_eq!(
                ticket.state.pending_generation(),
                Some(second_id.generation())
            );
        } else {
            assert_eq!(reclaimed.len(), 1);
            assert_eq!(ticket.state.pending_generation(), None);
            assert_eq!(ticket.state.claim_run(second_id.generation()), Claim::Skip);
        }
    });
}

/// A walk that sees a generation pending (a reclaim's) or in progress (a count's) reads that generation's context (or a later one), never
/// an earlier launch's: else a reclaim would leave the launch of a lost context pending for good.
#[test]
fn loom_tickets_a_walk_reads_the_context_of_the_generation_it_saw() {
    check("tickets_walk_context", 3, || {
        let table = table();
        let old = Record::new();
        let mut cache = FreeCache::new();
        // An earlier launch of the ticket, in context (1, 1), run and released.
        let held = table
            .take(Some(&mut cache), old.fill(1), (1, 1))
            .expect("a ticket");
        let old_id = held.id;
        assert_eq!(held.launched(), LaunchOver::Done);
        table.run(old_id, |_| {}, |_| {});
        table.give_back(Some(&mut cache), old_id);
        let new = Record::new();
        let launcher = {
            let table = Arc::clone(&table);
            let new = Arc::clone(&new);
            thread::spawn(move || {
                let held = table
                    .take(Some(&mut cache), new.fill(2), (1, 2))
                    .expect("the ticket again");
                let id = held.id;
                assert_eq!(held.launched(), LaunchOver::Done);
                id
            })
        };
        let walker = {
            let table = Arc::clone(&table);
            thread::spawn(move || -> Vec<(usize, u64)> {
                // A reclaim's walk, and a count's.
                let mut seen: Vec<(usize, u64)> = table
                    .pending_in(1)
                    .iter()
                    .map(|candidate| candidate.context)
                    .collect();
                table.for_each_pending(|context| seen.push(context));
                seen
            })
        };
        let seen = walker.join().unwrap();
        let new_id = launcher.join().unwrap();
        assert_ne!(new_id.generation(), old_id.generation());
        assert!(
            seen.iter().all(|&context| context == (1, 2)),
            "a walk saw the new launch pending with the old launch's context: {seen:?}"
        );
    });
}
