//! One drop counter per owner, for load tests that launch very many owners and then check that
//! every one was dropped exactly once.
//!
//! [`Drops`](super::Drops) records each drop (thread, time) under a lock: right for a few owners,
//! too heavy for millions. A [`CountedOwner`] does one relaxed add on its own counter.

use std::sync::atomic::{AtomicU8, Ordering};

/// `n` drop counters, all 0, that live until the process exits (owners may be dropped after the
/// test's stack frame is gone: by the reaper, or never, if a test fails).
#[derive(Debug, Clone, Copy)]
pub struct DropCounts(&'static [AtomicU8]);

impl DropCounts {
    /// `n` counters at zero.
    pub fn new(n: usize) -> DropCounts {
        DropCounts(Box::leak((0..n).map(|_| AtomicU8::new(0)).collect()))
    }

    /// An owner that adds one to counter `index` when it is dropped.
    ///
    /// # Panics
    /// If `index` is out of range.
    #[track_caller]
    pub fn owner(self, index: usize) -> CountedOwner {
        assert!(index < self.0.len(), "counter {index} of {}", self.0.len());
        CountedOwner {
            counts: self,
            index,
        }
    }

    /// How many counters there are.
    pub fn len(self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(self) -> bool {
        self.0.is_empty()
    }

    /// Owners never dropped.
    pub fn never(self) -> usize {
        self.0
            .iter()
            .filter(|c| c.load(Ordering::Relaxed) == 0)
            .count()
    }

    /// Owners dropped more than once.
    pub fn more_than_once(self) -> usize {
        self.0
            .iter()
            .filter(|c| c.load(Ordering::Relaxed) > 1)
            .count()
    }

    /// Frees the counters, for a test that runs under LeakSanitizer and is done with them.
    ///
    /// # Safety
    /// No owner of these counters may be alive, or be made, and no copy of `self` may be used
    /// afterwards.
    pub unsafe fn free(self) {
        // SAFETY: the counters came from `Box::leak` in `new`; the caller promises nothing refers
        // to them any more.
        drop(unsafe { Box::from_raw(std::ptr::from_ref(self.0).cast_mut()) });
    }
}

/// Adds one to its counter of a [`DropCounts`] when dropped.
#[derive(Debug)]
pub struct CountedOwner {
    counts: DropCounts,
    index: usize,
}

impl Drop for CountedOwner {
    fn drop(&mut self) {
        self.counts.0[self.index].fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_never_once_and_twice() {
        let counts = DropCounts::new(3);
        drop(counts.owner(1));
        drop(counts.owner(2));
        drop(counts.owner(2));
        assert_eq!(
            (counts.len(), counts.never(), counts.more_than_once()),
            (3, 1, 1)
        );
        // SAFETY: every owner is gone and `counts` is not used again.
        unsafe { counts.free() };
    }
}
