//! The record pool (`record/pool.rs`), the library's own [`RecordPool`], with three slots per
//! segment and no segment kept by a trim: slots handed out in address order from segments,
//! counted back slot by slot (one atomic decrement each), a segment listed free by the release
//! that brings its count to zero, an exiting thread giving back the slots it never handed out,
//! and trims freeing listed segments.
//!
//! Each slot's contents are a `loom::cell::UnsafeCell` of the model, one per slot address: the
//! launcher writes it after `allocate`, the thread that frees the slot reads it first. So loom
//! reports a slot handed out again (or its segment reused) before its last use is ordered before
//! that hand-out. A slot handed out twice while in use fails the model's own check, and the models
//! end with every segment back on the free list and freed by a trim.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex as StdMutex;

use super::*;
use crate::record::pool::{Local, RecordPool};

/// Four slots per segment (the header and three for records), none kept by `trim`.
type Pool = RecordPool<4, 0>;

/// The cell standing for one slot's record.
struct SlotCell(UnsafeCell<usize>);

// SAFETY: shared between the model's threads on purpose: loom checks every access to it.
unsafe impl Send for SlotCell {}
// SAFETY: as above.
unsafe impl Sync for SlotCell {}

/// The pool and the model's view of the slots.
struct Model {
    pool: Pool,
    /// One cell per slot address, standing for the record a slot holds.
    cells: StdMutex<HashMap<usize, Arc<SlotCell>>>,
    /// The slots handed out and not yet freed.
    live: StdMutex<HashSet<usize>>,
}

// SAFETY: the pool is made for concurrent use (its lock and atomics); the maps are behind mutexes.
unsafe impl Send for Model {}
// SAFETY: as above.
unsafe impl Sync for Model {}

impl Model {
    fn new() -> Arc<Model> {
        Arc::new(Model {
            pool: Pool::new(),
            cells: StdMutex::new(HashMap::new()),
            live: StdMutex::new(HashSet::new()),
        })
    }

    fn cell(&self, slot: usize) -> Arc<SlotCell> {
        let mut cells = self.cells.lock().unwrap();
        Arc::clone(
            cells
                .entry(slot)
                .or_insert_with(|| Arc::new(SlotCell(UnsafeCell::new(0)))),
        )
    }

    /// Allocates a slot with `local` and writes `record` into it, as a launcher builds a record.
    fn launch(&self, local: &Local<4>, record: usize) -> usize {
        let slot = self.pool.allocate(local).memory.as_ptr() as usize;
        assert!(
            self.live.lock().unwrap().insert(slot),
            "slot {slot:#x} handed out while in use"
        );
        // SAFETY: the slot is ours; loom checks this write is ordered after the slot's last use.
        self.cell(slot).0.with_mut(|cell| unsafe { *cell = record });
        slot
    }

    /// Reads the record in `slot` and frees the slot, as the releasing thread does.
    fn release(&self, slot: usize, record: usize) {
        // SAFETY: the slot is ours to release; loom checks the read is ordered after the write.
        let seen = self.cell(slot).0.with(|cell| unsafe { *cell });
        assert_eq!(seen, record, "slot {slot:#x} overwritten while in use");
        assert!(self.live.lock().unwrap().remove(&slot));
        // SAFETY: a slot of this pool, holding no live value any more, freed once.
        unsafe { self.pool.free(NonNull::new(slot as *mut u8).unwrap()) };
    }

    /// Once every thread is done: every segment is free, and a trim frees them all.
    fn check_everything_back(&self) {
        assert!(self.live.lock().unwrap().is_empty());
        let (all, free) = self.pool.segment_counts();
        assert_eq!(
            all, free,
            "a segment with no slot in use is not listed free"
        );
        assert_eq!(self.pool.trim(), all);
        assert_eq!(self.pool.segment_counts(), (0, 0));
    }
}

/// A launcher fills its segment while another thread frees (and trims) the first records: the
/// segment is listed, and reused, only once all its slots are free.
#[test]
fn loom_segments_are_reused_only_when_all_their_slots_are_free() {
    check(
        "pool: launcher x 4 allocations + exit, reaper x 2 frees + trim",
        4,
        || {
            let model = Model::new();
            let local = Local::new();
            let first = [model.launch(&local, 1), model.launch(&local, 2)];
            let reaper = {
                let model = Arc::clone(&model);
                thread::spawn(move || {
                    model.release(first[0], 1);
                    model.release(first[1], 2);
                    model.pool.trim();
                })
            };
            // The third slot of the first segment, then the first of another.
            let third = model.launch(&local, 3);
            let fourth = model.launch(&local, 4);
            model.release(third, 3);
            model.release(fourth, 4);
            model.pool.thread_exits(&local);
            reaper.join().unwrap();
            model.check_everything_back();
        },
    );
}

/// A launcher exits (giving back its unissued slots) while another thread frees its one record:
/// whichever brings the count to zero lists the segment, once, and the next thread reuses it.
#[test]
fn loom_an_exiting_thread_and_a_free_race_to_list_the_segment() {
    check(
        "pool: launcher exits while its record is freed, then reuse",
        4,
        || {
            let model = Model::new();
            let launcher = {
                let model = Arc::clone(&model);
                thread::spawn(move || {
                    let local = Local::new();
                    let slot = model.launch(&local, 1);
                    let freer = {
                        let model = Arc::clone(&model);
                        thread::spawn(move || model.release(slot, 1))
                    };
                    model.pool.thread_exits(&local);
                    freer
                })
            };
            launcher.join().unwrap().join().unwrap();
            assert_eq!(
                model.pool.segment_counts(),
                (1, 1),
                "the segment not listed once"
            );
            // The next launcher takes that segment instead of allocating one.
            let local = Local::new();
            let again = model.launch(&local, 2);
            assert_eq!(
                model.pool.segment_counts(),
                (1, 0),
                "a free segment not reused"
            );
            model.release(again, 2);
            model.pool.thread_exits(&local);
            model.check_everything_back();
        },
    );
}

/// Two threads free the slots of a full segment; the one whose free lists it may take it again at
/// once: the slots' last uses on the other thread come before its new records (the count's
/// AcqRel), whoever frees last.
#[test]
fn loom_a_segment_freed_on_two_threads_is_reused_after_both_are_done_with_it() {
    check(
        "pool: two threads free a full segment, one reuses it",
        4,
        || {
            let model = Model::new();
            let local = Local::new();
            let slots = [1, 2, 3].map(|record| (model.launch(&local, record), record));
            // Every slot of the segment is handed out: nothing left to give back.
            model.pool.thread_exits(&local);
            let other = {
                let model = Arc::clone(&model);
                thread::spawn(move || {
                    model.release(slots[0].0, slots[0].1);
                    model.release(slots[1].0, slots[1].1);
                })
            };
            let local = Local::new();
            model.release(slots[2].0, slots[2].1);
            let again = model.launch(&local, 4);
            model.release(again, 4);
            model.pool.thread_exits(&local);
            other.join().unwrap();
            model.check_everything_back();
        },
    );
}

/// Two launchers each need a segment while a third thread frees a full one and trims: a launcher
/// finding none listed allocates with the lock let go and registers under it, so the registry
/// stays whole whichever way the three interleave (each segment once, its index right for a
/// trim's removal), and a segment freed meanwhile is taken by at most one of them.
#[test]
fn loom_two_launchers_allocating_segments_while_a_third_thread_frees_and_trims() {
    check(
        "pool: two launchers take or allocate segments, a third frees one and trims",
        3,
        || {
            let model = Model::new();
            let first = Local::new();
            let full = [1, 2, 3].map(|record| (model.launch(&first, record), record));
            model.pool.thread_exits(&first);
            let launcher = {
                let model = Arc::clone(&model);
                thread::spawn(move || {
                    let local = Local::new();
                    let slot = model.launch(&local, 10);
                    model.release(slot, 10);
                    model.pool.thread_exits(&local);
                })
            };
            let reaper = {
                let model = Arc::clone(&model);
                thread::spawn(move || {
                    for (slot, record) in full {
                        model.release(slot, record);
                    }
                    model.pool.trim();
                })
            };
            let local = Local::new();
            let slot = model.launch(&local, 20);
            model.release(slot, 20);
            model.pool.thread_exits(&local);
            launcher.join().unwrap();
            reaper.join().unwrap();
            model.check_everything_back();
        },
    );
}
