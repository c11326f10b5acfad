//! The set of threads that did something (ran a host function, dropped an owner), told apart by an
//! id of this module's own: an oracle that does not ask the library where it is.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How many threads a [`ThreadSet`] holds.
const CAPACITY: usize = 256;

/// The next thread id to hand out (0 means "none yet").
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's id, handed out on first use. (A const-initialised `Cell` needs no destructor,
    /// so it is fine on a driver's foreign threads.)
    static ID: Cell<u64> = const { Cell::new(0) };
}

/// The calling thread's id: unique to the thread for the process's life (never reused, unlike an
/// operating-system id).
pub fn thread_id() -> u64 {
    ID.with(|id| {
        if id.get() == 0 {
            id.set(NEXT_ID.fetch_add(1, Ordering::Relaxed));
        }
        id.get()
    })
}

/// A set of threads (up to 256), filled from any thread without a lock or an allocation, so it may
/// be used inside host functions on a driver's threads and in owners' `Drop`.
pub struct ThreadSet {
    ids: [AtomicU64; CAPACITY],
    overflowed: AtomicBool,
}

impl Default for ThreadSet {
    fn default() -> Self {
        ThreadSet::new()
    }
}

impl ThreadSet {
    /// An empty set (usable in a `static`).
    pub const fn new() -> ThreadSet {
        ThreadSet {
            ids: [const { AtomicU64::new(0) }; CAPACITY],
            overflowed: AtomicBool::new(false),
        }
    }

    /// Adds the calling thread. A few atomic loads once the thread is in; never panics (a set that
    /// is full records that it overflowed, which [`ThreadSet::ids`] reports).
    pub fn insert_current(&self) {
        let me = thread_id();
        for slot in &self.ids {
            match slot.load(Ordering::Acquire) {
                id if id == me => return,
                0 => match slot.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return,
                    Err(id) if id == me => return,
                    Err(_) => {}
                },
                _ => {}
            }
        }
        self.overflowed.store(true, Ordering::Release);
    }

    /// The threads in the set.
    ///
    /// # Panics
    /// If more threads than it holds were inserted.
    pub fn ids(&self) -> Vec<u64> {
        assert!(
            !self.overflowed.load(Ordering::Acquire),
            "more than {CAPACITY} threads in a ThreadSet"
        );
        self.ids
            .iter()
            .map(|slot| slot.load(Ordering::Acquire))
            .filter(|&id| id != 0)
            .collect()
    }

    /// The threads in both sets.
    pub fn common(&self, other: &ThreadSet) -> Vec<u64> {
        let theirs = other.ids();
        self.ids()
            .into_iter()
            .filter(|id| theirs.contains(id))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::ThreadSet;

    #[test]
    fn a_thread_in_both_sets_is_common_and_threads_apart_are_not() {
        let (ran, dropped) = (ThreadSet::new(), ThreadSet::new());
        std::thread::scope(|s| {
            s.spawn(|| ran.insert_current());
            s.spawn(|| dropped.insert_current());
        });
        assert!(ran.common(&dropped).is_empty());
        assert_eq!((ran.ids().len(), dropped.ids().len()), (1, 1));
        ran.insert_current();
        ran.insert_current();
        dropped.insert_current();
        assert_eq!(ran.ids().len(), 2, "a thread is in a set once");
        assert_eq!(ran.common(&dropped), vec![super::thread_id()]);
    }
}
