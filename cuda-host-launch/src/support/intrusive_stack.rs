//! A lock-free, intrusive, multi-producer stack whose consumers take every node at once.
//!
//! The cleanup queue is built on it. Producers (the driver's threads) `push` a node they own; a
//! consumer (the reaper, a launching thread in manual mode, `drain`) takes the whole stack with one
//! `swap` and walks it. Because nodes are never popped one at a time, there is no ABA problem, and
//! any number of consumers may take concurrently: each `swap` gets a disjoint list.
//!
//! `push` never allocates, never blocks and never calls into anything: a compare-and-swap loop on
//! `head`. Its return value says whether the stack was empty, which is what the wake-up coalescing
//! needs (the first push of a batch wakes the consumer; the others do not).

use std::ptr::{self, NonNull};

use crate::support::sync::{AtomicPtr, Ordering};

/// A node type with an intrusive link.
///
/// # Safety
/// `link` must return the same field of `self` every time, and nothing but [`IntrusiveStack`] may
/// write that field while the node is pushed.
pub(crate) unsafe trait Linked: Sized {
    /// The node's `next` field.
    fn link(&self) -> &AtomicPtr<Self>;
}

/// See the module documentation.
pub(crate) struct IntrusiveStack<N: Linked> {
    head: AtomicPtr<N>,
}

impl<N: Linked> IntrusiveStack<N> {
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        IntrusiveStack {
            head: AtomicPtr::new(ptr::null_mut()),
        }
    }

    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        IntrusiveStack {
            head: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// Pushes `node`; returns `true` if the stack was empty (the caller should wake a consumer).
    ///
    /// # Safety
    /// `node` must be valid and not in any stack; ownership passes to the stack until a consumer
    /// takes it.
    #[inline]
    pub(crate) unsafe fn push(&self, node: NonNull<N>) -> bool {
        // SAFETY: the caller passes a valid node that no one else is linking.
        let link = unsafe { node.as_ref() }.link();
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            link.store(head, Ordering::Relaxed);
            // Release: a consumer that takes this node (Acquire swap) sees the node's contents and
            // its link, and everything the producer did before pushing (the host function's effects).
            match self.head.compare_exchange_weak(
                head,
                node.as_ptr(),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return head.is_null(),
                Err(current) => head = current,
            }
        }
    }

    /// Takes every node pushed so far, oldest first.
    #[inline]
    pub(crate) fn take_all(&self) -> Batch<N> {
        if self.head.load(Ordering::Relaxed).is_null() {
            return Batch {
                next: ptr::null_mut(),
            };
        }
        // Acquire: pairs with the Release in `push`, for every node of the list (each was pushed by
        // a Release CAS that this swap reads from, directly or through the release sequence).
        let mut node = self.head.swap(ptr::null_mut(), Ordering::Acquire);
        // Reverse the LIFO list so nodes come out in the order they were pushed.
        let mut reversed: *mut N = ptr::null_mut();
        while let Some(n) = NonNull::new(node) {
            // SAFETY: every node in the list we took is valid and now exclusively ours.
            let link = unsafe { n.as_ref() }.link();
            node = link.load(Ordering::Relaxed);
            link.store(reversed, Ordering::Relaxed);
            reversed = n.as_ptr();
        }
        Batch { next: reversed }
    }

    /// Whether anything is waiting (a hint: it may change at once).
    pub(crate) fn is_empty(&self) -> bool {
        self.head.load(Ordering::Relaxed).is_null()
    }
}

/// The nodes one `take_all` took, oldest first; owned by whoever holds the batch, which must hand
/// every node on (a batch dropped early leaks its remaining nodes rather than freeing them unreleased).
pub(crate) struct Batch<N: Linked> {
    next: *mut N,
}

impl<N: Linked> Batch<N> {
    /// Whether the take found nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.next.is_null()
    }
}

impl<N: Linked> Iterator for Batch<N> {
    type Item = NonNull<N>;

    /// The next node. Its link is read before it is returned, so the caller may free it at once.
    #[inline]
    fn next(&mut self) -> Option<NonNull<N>> {
        let node = NonNull::new(self.next)?;
        // SAFETY: nodes of a taken batch are valid until the batch hands them out, and this one has
        // not been handed out yet.
        self.next = unsafe { node.as_ref() }.link().load(Ordering::Relaxed);
        Some(node)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct TestNode {
        next: AtomicPtr<TestNode>,
        value: usize,
    }

    // SAFETY: `link` always returns `next`, which only the stack writes.
    unsafe impl Linked for TestNode {
        fn link(&self) -> &AtomicPtr<Self> {
            &self.next
        }
    }

    fn node(value: usize) -> NonNull<TestNode> {
        NonNull::from(Box::leak(Box::new(TestNode {
            next: AtomicPtr::new(ptr::null_mut()),
            value,
        })))
    }

    fn free_all(batch: Batch<TestNode>) -> Vec<usize> {
        // SAFETY: each node came from `node` (a leaked Box) and is handed out once.
        batch
            .map(|n| unsafe { Box::from_raw(n.as_ptr()) }.value)
            .collect()
    }

    #[test]
    fn a_batch_comes_out_in_push_order_and_only_the_first_push_reports_empty() {
        let stack = IntrusiveStack::new();
        // SAFETY: fresh nodes, pushed once.
        let first = unsafe { stack.push(node(1)) };
        // SAFETY: as above.
        let second = unsafe { stack.push(node(2)) };
        // SAFETY: as above.
        let third = unsafe { stack.push(node(3)) };
        assert!(first && !second && !third);
        assert_eq!(free_all(stack.take_all()), vec![1, 2, 3]);
        assert!(stack.is_empty());
        // SAFETY: as above.
        let fourth = unsafe { stack.push(node(4)) };
        assert!(fourth, "the first push after a take is a new batch");
        assert_eq!(free_all(stack.take_all()), vec![4]);
        assert_eq!(free_all(stack.take_all()), Vec::<usize>::new());
    }

    #[test]
    fn many_producers_and_consumers_lose_and_duplicate_nothing() {
        use std::sync::Mutex;
        let stack = IntrusiveStack::new();
        let seen = Mutex::new(Vec::new());
        const PER_THREAD: usize = 20_000;
        std::thread::scope(|s| {
            for t in 0..4 {
                let stack = &stack;
                s.spawn(move || {
                    for i in 0..PER_THREAD {
                        // SAFETY: fresh nodes, pushed once.
                        unsafe { stack.push(node(t * PER_THREAD + i)) };
                    }
                });
            }
            for _ in 0..2 {
                let (stack, seen) = (&stack, &seen);
                s.spawn(move || {
                    for _ in 0..2_000 {
                        let got = free_all(stack.take_all());
                        seen.lock().unwrap().extend(got);
                    }
                });
            }
        });
        let mut all = seen.into_inner().unwrap();
        all.extend(free_all(stack.take_all()));
        all.sort_unstable();
        assert_eq!(all, (0..4 * PER_THREAD).collect::<Vec<_>>());
    }
}
