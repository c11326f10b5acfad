//! The cleanup queue's lock-free core: a multi-producer stack of records taken whole by a consumer,
//! its counters, and the wake-up protocol between the pushes (on driver threads) and the reaper.
//!
//! The library has one queue, a `static` in `release.rs`; the loom models make one per execution.
//!
//! **The wake-up protocol.** The push that finds the stack empty wakes the reaper
//! (`Thread::unpark`: a futex wake on Linux, no lock a launcher could hold); pushes onto a
//! non-empty stack do not, so a burst of host functions costs one wake-up per batch. Before it
//! parks, the reaper looks at the stack once more ([`CleanupQueue::reaper_may_park`]). A SeqCst
//! fence on each side (after the push, before the look at the reaper's handle; before the
//! reaper's look at the stack) makes sure that either the push sees the reaper or the reaper sees
//! the push. The reaper's start publishes its handle and then unparks it once
//! ([`CleanupQueue::set_reaper`]), for a push that ran before the handle was there.

use std::ptr::{self, NonNull};

use crate::support::intrusive_stack::{Batch, IntrusiveStack, Linked};
use crate::support::own_line::OwnLine;
use crate::support::sync::thread::Thread;
use crate::support::sync::{AtomicPtr, AtomicU64, AtomicUsize, Ordering, fence};

/// See the module documentation.
pub(crate) struct CleanupQueue<N: Linked> {
    /// Pushed by driver threads, taken by consumers.
    stack: OwnLine<IntrusiveStack<N>>,
    /// Records pushed so far: those of host functions that have run, of graphs destroyed, and
    /// deferred drops. Written by driver threads only.
    queued: OwnLine<AtomicU64>,
    /// Records released from the queue. Written by consumers only.
    released: OwnLine<AtomicU64>,
    /// Threads waiting in `flush`.
    flush_waiters: OwnLine<AtomicUsize>,
    /// The reaper's handle, once it started: set once, never changed.
    reaper: ReaperHandle,
}

impl<N: Linked> CleanupQueue<N> {
    /// An empty queue without a reaper.
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        CleanupQueue {
            stack: OwnLine(IntrusiveStack::new()),
            queued: OwnLine(AtomicU64::new(0)),
            released: OwnLine(AtomicU64::new(0)),
            flush_waiters: OwnLine(AtomicUsize::new(0)),
            reaper: ReaperHandle(AtomicPtr::new(ptr::null_mut())),
        }
    }

    /// An empty queue without a reaper (loom's atomics are not `const`).
    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        CleanupQueue {
            stack: OwnLine(IntrusiveStack::new()),
            queued: OwnLine(AtomicU64::new(0)),
            released: OwnLine(AtomicU64::new(0)),
            flush_waiters: OwnLine(AtomicUsize::new(0)),
            reaper: ReaperHandle(AtomicPtr::new(ptr::null_mut())),
        }
    }

    /// Pushes a record to be released, and wakes the reaper if the queue was empty; returns whether
    /// it was.
    ///
    /// May be called on a driver thread: no allocation, no lock, no CUDA call, no drop.
    ///
    /// # Safety
    /// `node` must be a live record that nobody else owns, in no queue.
    #[inline]
    pub(crate) unsafe fn push(&self, node: NonNull<N>) -> bool {
        // Counted before it is pushed, so a `flush` that sees the count also finds the record (or
        // finds it released).
        self.queued.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the caller hands over a live record that is in no queue.
        let was_empty = unsafe { self.stack.push(node) };
        if was_empty {
            // Orders the push before the look at the reaper's handle, against the reaper's own
            // fence before its emptiness check (`reaper_may_park`): either this push sees the
            // reaper, or the reaper sees this push.
            fence(Ordering::SeqCst);
            if let Some(reaper) = self.reaper.get() {
                reaper.unpark();
            }
        }
        was_empty
    }

    /// Puts back a record taken but not released because the process is exiting: it stays in
    /// the queue, reachable as everything alive at `exit` is, and is never released (the exit
    /// gate lets no release start). Neither counted again nor a wake-up.
    ///
    /// # Safety
    /// `node` must be a live record that nobody else owns, in no queue.
    pub(crate) unsafe fn keep(&self, node: NonNull<N>) {
        // SAFETY: the caller's promise.
        unsafe { self.stack.push(node) };
    }

    /// Takes every record queued so far, oldest first.
    #[inline]
    pub(crate) fn take_all(&self) -> Batch<N> {
        self.stack.take_all()
    }

    /// The reaper's last look before it parks: whether the queue is empty. The fence pairs with
    /// the one in [`CleanupQueue::push`].
    #[inline]
    pub(crate) fn reaper_may_park(&self) -> bool {
        fence(Ordering::SeqCst);
        self.stack.is_empty()
    }

    /// Publishes the reaper's handle, then wakes it once: a push that ran before the handle was
    /// published woke no one. Returns `false` (and does nothing) if a reaper was published before.
    pub(crate) fn set_reaper(&self, reaper: Thread) -> bool {
        if !self.reaper.set(reaper) {
            return false;
        }
        if let Some(reaper) = self.reaper.get() {
            reaper.unpark();
        }
        true
    }

    /// Whether the queue holds no record (a hint, as the stack's: a push may land at once).
    pub(crate) fn is_empty(&self) -> bool {
        self.stack.is_empty()
    }

    /// Whether a reaper was published.
    #[inline]
    pub(crate) fn has_reaper(&self) -> bool {
        self.reaper.get().is_some()
    }

    /// Records pushed so far.
    pub(crate) fn queued(&self) -> u64 {
        self.queued.load(Ordering::SeqCst)
    }

    /// Records released so far.
    pub(crate) fn released(&self) -> u64 {
        self.released.load(Ordering::SeqCst)
    }

    /// Counts `count` records released; returns whether a `flush` waits (and should be notified).
    pub(crate) fn count_released(&self, count: u64) -> bool {
        self.released.fetch_add(count, Ordering::SeqCst);
        self.flush_waiters.load(Ordering::SeqCst) > 0
    }

    /// A `flush` begins (`true`) or ends (`false`) waiting.
    pub(crate) fn flush_waiting(&self, waiting: bool) {
        if waiting {
            self.flush_waiters.fetch_add(1, Ordering::SeqCst);
        } else {
            self.flush_waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A thread handle set once (what `OnceLock<Thread>` would be, in atomics loom can model): `get`
/// is one Acquire load.
struct ReaperHandle(AtomicPtr<Thread>);

impl ReaperHandle {
    #[inline]
    fn get(&self) -> Option<&Thread> {
        // Acquire: pairs with the Release of `set`, so the handle is seen written in full.
        // SAFETY: a non-null pointer is a leaked `Box<Thread>` that lives as long as `self`.
        unsafe { self.0.load(Ordering::Acquire).as_ref() }
    }

    fn set(&self, thread: Thread) -> bool {
        let new = Box::into_raw(Box::new(thread));
        match self
            .0
            .compare_exchange(ptr::null_mut(), new, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(_) => {
                // SAFETY: `new` was not published; it is still ours alone.
                drop(unsafe { Box::from_raw(new) });
                false
            }
        }
    }
}

impl Drop for ReaperHandle {
    fn drop(&mut self) {
        let handle = self.0.load(Ordering::Acquire);
        if !handle.is_null() {
            // SAFETY: made by `set` with `Box::into_raw`; `&mut self` means no one else reads it.
            drop(unsafe { Box::from_raw(handle) });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::CleanupQueue;
    use crate::record::layout::RecordHeader;

    /// A release asks for a `flush`'s notification exactly while one waits. (Without it a flush
    /// still ends, on its 2 ms slices, so no end-to-end test sees a lost notification.)
    #[test]
    fn a_release_notifies_only_while_a_flush_waits() {
        let queue = CleanupQueue::<RecordHeader>::new();
        assert!(!queue.count_released(1), "no flush waits");
        queue.flush_waiting(true);
        queue.flush_waiting(true);
        assert!(queue.count_released(2), "two flushes wait");
        queue.flush_waiting(false);
        assert!(queue.count_released(1), "one flush still waits");
        queue.flush_waiting(false);
        assert!(!queue.count_released(1), "no flush waits any more");
        assert_eq!(queue.released(), 5);
    }

    /// The first reaper is published; a second is refused and leaves the first. (The wake-up the
    /// publication gives a push that ran before it is loom's to check:
    /// `loom_models::reaper_wake_up`.)
    #[test]
    fn the_reaper_is_published_once() {
        let queue = CleanupQueue::<RecordHeader>::new();
        assert!(!queue.has_reaper());
        let first = std::thread::current();
        assert!(queue.set_reaper(first.clone()), "the first reaper");
        let other = std::thread::spawn(std::thread::current).join().unwrap();
        assert!(!queue.set_reaper(other), "a second reaper");
        assert_eq!(queue.reaper.get().map(|t| t.id()), Some(first.id()));
    }
}
