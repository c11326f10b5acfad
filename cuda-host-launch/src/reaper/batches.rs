//! The batches taken from the cleanup queue, numbered in the order they were taken: what
//! [`flush`](crate::flush) waits for.
//!
//! Counting records cannot tell a flush when the records it must see are released. With two
//! releasing threads (a [`drain`](crate::drain) beside the reaper, or two drains in manual mode) a
//! later batch may finish first, and its records bring the released count up to the flush's target
//! while an earlier batch is still dropping owners the flush must wait for. So every take that
//! finds records is numbered under one lock (takes are ordered), and a flush waits for batches by
//! number ([`Batches::mark`]): those still being released when it began, and, if records were
//! queued then, the next one taken, since a take takes everything queued.
//!
//! The lock is held for the take and the bookkeeping only, never while owners are dropped: a
//! batch costs its releasing thread two uncontended lock round trips.

/// Batches taken and those still being released.
pub(crate) struct Batches {
    /// How many batches (with records) were taken: the next one's number.
    taken: u64,
    /// The numbers of the batches taken and not yet released in full.
    unfinished: Vec<u64>,
}

/// What one flush waits for: every batch numbered below `before`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlushMark {
    before: u64,
}

impl Batches {
    /// None taken yet.
    pub(crate) const fn new() -> Batches {
        Batches {
            taken: 0,
            unfinished: Vec::new(),
        }
    }

    /// A batch with records was just taken (under the same lock): returns its number, which
    /// [`Batches::finished`] is given once the batch is released (or put back at exit).
    pub(crate) fn take(&mut self) -> u64 {
        let number = self.taken;
        self.taken += 1;
        self.unfinished.push(number);
        number
    }

    /// Batch `number` is released in full.
    pub(crate) fn finished(&mut self, number: u64) {
        if let Some(at) = self.unfinished.iter().position(|&n| n == number) {
            self.unfinished.swap_remove(at);
        }
    }

    /// The mark of a flush that begins now, with records queued (`queued`) or none: every batch
    /// taken so far, and the next one if records are queued (it takes them all).
    pub(crate) fn mark(&self, queued: bool) -> FlushMark {
        FlushMark {
            before: self.taken + u64::from(queued),
        }
    }

    /// Whether every batch `mark` waits for was taken and released.
    pub(crate) fn reached(&self, mark: FlushMark) -> bool {
        self.taken >= mark.before && self.unfinished.iter().all(|&n| n >= mark.before)
    }
}

#[cfg(test)]
mod tests {
    use super::Batches;

    /// A flush waits for the batch released before it began only if that batch is unfinished,
    /// and a later batch's finish does not stand in for it (the two-drainer bug: counting records
    /// let the later batch's count reach the flush's target).
    #[test]
    fn a_later_batch_does_not_finish_an_earlier_ones_flush() {
        let mut batches = Batches::new();
        let first = batches.take();
        let mark = batches.mark(false);
        assert!(
            !batches.reached(mark),
            "the first batch is still being released"
        );
        let second = batches.take();
        batches.finished(second);
        assert!(
            !batches.reached(mark),
            "a later batch finished, the first not"
        );
        batches.finished(first);
        assert!(batches.reached(mark));
    }

    /// Records queued when the flush began are in the next batch taken: the flush waits for it to
    /// be taken and released, and not for batches after it.
    #[test]
    fn records_queued_at_the_mark_wait_for_the_next_batch() {
        let mut batches = Batches::new();
        let mark = batches.mark(true);
        assert!(!batches.reached(mark), "nothing taken yet");
        let next = batches.take();
        assert!(!batches.reached(mark), "taken, not released");
        let later = batches.take();
        batches.finished(next);
        assert!(batches.reached(mark), "a later batch is not waited for");
        batches.finished(later);
        let idle = batches.mark(false);
        assert!(
            batches.reached(idle),
            "nothing queued, nothing being released"
        );
    }
}
