//! Model checks, with [loom](https://docs.rs/loom), of the lock-free parts of the cleanup queue:
//! the intrusive stack, the reaper's wake-up protocol, the record pool (segments handed out in
//! address order, counted back slot by slot, listed when free), and the tracking of pooled records
//! by their segment (published slots, a reclaim's walk).
//!
//! Run them (`scripts/loom` does this):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p cuda-host-launch --release --lib loom_models -- --nocapture
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS=n` overrides each model's preemption bound; `LOOM_LOG=1` traces a failing
//! execution. Each model prints how many executions loom explored.
//!
//! Under `--cfg loom` the crate compiles only `sync`, `intrusive_stack` and this module: the rest
//! uses `static` atomics (loom's are not `const`), `std::thread`, `OnceLock` and the driver.
//!
//! - The stack models run the real [`IntrusiveStack`] on loom's atomics.
//! - The reaper (`cleanup.rs`: `push`, `start_reaper`, `reaper_loop`), the pool (`record_pool.rs`:
//!   `allocate`, `next_segment`, `release`, `free`, `trim`, `Local::drop`) and the pooled records'
//!   tracking (`publish`, `for_each_published`, `pending.rs`'s `track`, `mark_ran`, `reclaim`,
//!   `linked_shard`) live in `static`s, a `thread_local!`, `std::thread::park` and the system
//!   allocator, which loom cannot model in place. Their algorithms are transcribed here, step for
//!   step and with the same orderings, around the real [`IntrusiveStack`] (the reaper) and loom's
//!   `Mutex` (the pool's lock). Keep them in step with the code they model.
//!
//! What the payloads are for: every node carries a `loom::cell::UnsafeCell` that its producer writes
//! before pushing and its consumer reads after taking, so loom reports any take that is not ordered
//! after the push (the Release/Acquire pairing the queue relies on for the host function's effects
//! and the record's contents).

use std::collections::HashMap;
use std::ptr::{self, NonNull};
// Plain `Arc`s to share the models' state: loom's own would also check for leaked `Arc`s, but it
// cannot be dropped while a model that found a deadlock unwinds (the `should_panic` models).
use std::sync::Arc;
use std::time::Instant;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, fence};
use loom::thread;

use crate::support::intrusive_stack::{IntrusiveStack, Linked};
use crate::support::sync::{AtomicPtr, AtomicUsize, Ordering};

/// Runs `model` under loom with `preemption_bound` (unless `LOOM_MAX_PREEMPTIONS` says otherwise)
/// and prints how many executions were explored.
fn check(name: &str, preemption_bound: usize, model: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
    let executions = Arc::new(StdAtomicUsize::new(0));
    let counter = Arc::clone(&executions);
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(preemption_bound);
    }
    let bound = builder.preemption_bound;
    let start = Instant::now();
    builder.check(move || {
        counter.fetch_add(1, StdOrdering::Relaxed);
        model();
    });
    println!(
        "loom: {name}: {} executions explored (preemption bound {bound:?}) in {:.2?}",
        executions.load(StdOrdering::Relaxed),
        start.elapsed()
    );
}

/// A test node: (producer, sequence number), written by the producer before the push.
struct Node {
    next: AtomicPtr<Node>,
    id: UnsafeCell<(usize, usize)>,
}

// SAFETY: `link` always returns `next`, which only the stack writes while the node is pushed.
unsafe impl Linked for Node {
    fn link(&self) -> &AtomicPtr<Self> {
        &self.next
    }
}

/// A node as a consumer saw it: its address and its id.
#[derive(Clone, Copy, Debug)]
struct Taken {
    addr: usize,
    id: (usize, usize),
}

/// `IntrusiveStack<Node>` shared between loom threads.
struct Shared(IntrusiveStack<Node>);

// SAFETY: the stack is made for concurrent use: a node's ownership passes from its producer to the
// stack to one consumer, with Release/Acquire ordering between them (which these models check).
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl std::ops::Deref for Shared {
    type Target = IntrusiveStack<Node>;
    fn deref(&self) -> &IntrusiveStack<Node> {
        &self.0
    }
}

fn new_stack() -> Arc<Shared> {
    Arc::new(Shared(IntrusiveStack::new()))
}

/// Makes node (`producer`, `seq`) and pushes it; returns what `push` returned.
fn push_new(stack: &Shared, producer: usize, seq: usize) -> bool {
    let node = Box::new(Node {
        next: AtomicPtr::new(ptr::null_mut()),
        id: UnsafeCell::new((usize::MAX, usize::MAX)),
    });
    // The producer's own effects, which the consumer must see (a data race for loom otherwise).
    // SAFETY: the node is not shared yet.
    node.id.with_mut(|id| unsafe { *id = (producer, seq) });
    // SAFETY: a fresh node, pushed once; the stack owns it until a consumer takes it.
    unsafe { stack.push(NonNull::from(Box::leak(node))) }
}

/// Takes every node and reads each one's id (without freeing: `verify` frees them once it has
/// checked that no node was taken twice).
fn take_batch(stack: &Shared) -> Vec<Taken> {
    stack
        .take_all()
        .map(|node| Taken {
            addr: node.as_ptr() as usize,
            // SAFETY: a taken node is valid and ours; loom checks the read is ordered after the
            // producer's write.
            id: unsafe { node.as_ref() }.id.with(|id| unsafe { *id }),
        })
        .collect()
}

/// Checks one execution and frees its nodes.
///
/// `pushes[p][s]` is what producer `p`'s push number `s` returned. `consumers[c]` is the list of
/// batches consumer `c` took, in the order it took them; `last`, if any, is a batch taken after every
/// other thread finished.
///
/// - every pushed node is taken exactly once, and nothing else is taken;
/// - within each consumer's batches, each producer's nodes come in push order, and `last` holds
///   only nodes pushed after every node taken before it;
/// - a push returned `true` (was empty) exactly when its node is the first of its batch.
fn verify(pushes: &[Vec<bool>], consumers: &[Vec<Vec<Taken>>], last: &[Taken]) {
    let mut seen: HashMap<(usize, usize), usize> = HashMap::new();
    let mut latest: Vec<Option<usize>> = vec![None; pushes.len()];
    let last_batches = [last.to_vec()];
    let all = consumers
        .iter()
        .map(Vec::as_slice)
        .chain([&last_batches[..]]);
    for (c, batches) in all.enumerate() {
        let is_last = c == consumers.len();
        let mut in_order: Vec<Option<usize>> = if is_last {
            latest.clone()
        } else {
            vec![None; pushes.len()]
        };
        for batch in batches {
            for (k, taken) in batch.iter().enumerate() {
                let (p, s) = taken.id;
                assert!(
                    p < pushes.len() && s < pushes[p].len(),
                    "took node {p}/{s}, which nobody pushed"
                );
                if let Some(addr) = seen.insert(taken.id, taken.addr) {
                    panic!(
                        "node {p}/{s} taken twice (at {addr:#x} and {:#x})",
                        taken.addr
                    );
                }
                assert!(
                    in_order[p].is_none_or(|prev| prev < s),
                    "producer {p}'s node {s} taken after its node {:?}",
                    in_order[p]
                );
                in_order[p] = Some(s);
                latest[p] = latest[p].max(Some(s));
                assert_eq!(
                    pushes[p][s],
                    k == 0,
                    "push {p}/{s} returned was_empty = {}, but it is node {k} of its batch {batch:?}",
                    pushes[p][s]
                );
            }
        }
    }
    let total: usize = pushes.iter().map(Vec::len).sum();
    assert_eq!(seen.len(), total, "nodes lost: took {seen:?}");
    for addr in seen.into_values() {
        // SAFETY: every node came from `Box::leak` in `push_new` and was taken exactly once.
        drop(unsafe { Box::from_raw(addr as *mut Node) });
    }
}

/// Spawns a producer that pushes `count` nodes, returning what each push returned.
fn producer(stack: &Arc<Shared>, p: usize, count: usize) -> thread::JoinHandle<Vec<bool>> {
    let stack = Arc::clone(stack);
    thread::spawn(move || (0..count).map(|s| push_new(&stack, p, s)).collect())
}

/// Spawns a consumer that calls `take_all` `times` times.
fn consumer(stack: &Arc<Shared>, times: usize) -> thread::JoinHandle<Vec<Vec<Taken>>> {
    let stack = Arc::clone(stack);
    thread::spawn(move || (0..times).map(|_| take_batch(&stack)).collect())
}

mod stack {
    use super::*;

    #[test]
    fn loom_two_producers_push_while_a_consumer_takes() {
        check(
            "stack: 2 producers x 2 pushes, 1 consumer x 2 takes",
            3,
            || {
                let stack = new_stack();
                let producers = [producer(&stack, 0, 2), producer(&stack, 1, 2)];
                let taker = consumer(&stack, 2);
                let pushes: Vec<_> = producers.map(|h| h.join().unwrap()).into();
                let taken = taker.join().unwrap();
                verify(&pushes, &[taken], &take_batch(&stack));
            },
        );
    }

    #[test]
    fn loom_three_producers_push_while_a_consumer_takes() {
        check(
            "stack: 3 producers x 1 push, 1 consumer x 1 take",
            3,
            || {
                let stack = new_stack();
                let producers = [
                    producer(&stack, 0, 1),
                    producer(&stack, 1, 1),
                    producer(&stack, 2, 1),
                ];
                let taker = consumer(&stack, 1);
                let pushes: Vec<_> = producers.map(|h| h.join().unwrap()).into();
                let taken = taker.join().unwrap();
                verify(&pushes, &[taken], &take_batch(&stack));
            },
        );
    }

    #[test]
    fn loom_two_consumers_take_concurrently() {
        check(
            "stack: 2 producers x 2 pushes, 2 consumers x 1 take",
            2,
            || {
                let stack = new_stack();
                let producers = [producer(&stack, 0, 2), producer(&stack, 1, 2)];
                let takers = [consumer(&stack, 1), consumer(&stack, 1)];
                let pushes: Vec<_> = producers.map(|h| h.join().unwrap()).into();
                let taken: Vec<_> = takers.map(|h| h.join().unwrap()).into();
                verify(&pushes, &taken, &take_batch(&stack));
            },
        );
    }
}

/// The reaper's wake-up protocol (`cleanup.rs`).
///
/// Producer (`cleanup::push`, on a driver thread): push the record; if the push found the stack
/// empty and the reaper is registered (`REAPER.get()`), unpark it. Reaper (`reaper_loop`): if the
/// stack is empty, linger (poll a few times), then park; else take everything and release it.
///
/// A lost wake-up leaves the reaper parked with records queued, for good: every later push finds
/// the stack non-empty and wakes no one. The models end the reaper once it has released every
/// record; if it can stay parked, every thread ends up blocked and loom reports a deadlock.
mod reaper_wake_up {
    use super::*;

    /// `cleanup.rs`'s `reaper_loop`, for a model: polls `linger` times (`sleep(poll)` there, a yield
    /// here) before parking; returns once it has taken `total` nodes.
    /// `fenced`: a `fence(SeqCst)` before the check that decides to park (see `Start`).
    fn reaper_loop(stack: &Shared, linger: usize, total: usize, fenced: bool) -> Vec<Vec<Taken>> {
        let mut batches = Vec::new();
        let mut released = 0;
        let mut idle = 0;
        loop {
            if idle == linger && fenced {
                fence(Ordering::SeqCst);
            }
            if stack.is_empty() {
                if idle < linger {
                    idle += 1;
                    thread::yield_now();
                    continue;
                }
                idle = 0;
                thread::park();
                continue;
            }
            idle = 0;
            let batch = take_batch(stack);
            released += batch.len();
            batches.push(batch);
            if released == total {
                return batches;
            }
        }
    }

    /// A running reaper and producers pushing `per_producer[p]` records each.
    fn steady_state(per_producer: &'static [usize], linger: usize) {
        let stack = new_stack();
        let total = per_producer.iter().sum();
        let reaper = {
            let stack = Arc::clone(&stack);
            thread::spawn(move || reaper_loop(&stack, linger, total, false))
        };
        // `REAPER` is set: producers see the reaper's handle.
        let handle = reaper.thread().clone();
        let producers: Vec<_> = per_producer
            .iter()
            .enumerate()
            .map(|(p, &count)| {
                let (stack, handle) = (Arc::clone(&stack), handle.clone());
                thread::spawn(move || {
                    (0..count)
                        .map(|s| {
                            let was_empty = push_new(&stack, p, s);
                            if was_empty {
                                handle.unpark();
                            }
                            was_empty
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let pushes: Vec<_> = producers.into_iter().map(|h| h.join().unwrap()).collect();
        let batches = reaper.join().unwrap();
        verify(&pushes, &[batches], &take_batch(&stack));
    }

    #[test]
    fn loom_no_lost_wake_up_two_producers() {
        check("reaper: parks at once, 2 producers x 2 records", 3, || {
            steady_state(&[2, 2], 0)
        });
    }

    #[test]
    fn loom_no_lost_wake_up_three_producers() {
        check("reaper: parks at once, 3 producers x 1 record", 2, || {
            steady_state(&[1, 1, 1], 0)
        });
    }

    #[test]
    fn loom_no_lost_wake_up_while_lingering() {
        check("reaper: lingers once, 2 producers x 2 records", 2, || {
            steady_state(&[2, 2], 1)
        });
    }

    /// How the reaper is published (`start_reaper`) and how a push and the reaper check each
    /// other before deciding not to wake / to park.
    #[derive(Clone, Copy, PartialEq)]
    enum Start {
        /// As `cleanup.rs` does: spawn, then `REAPER.set`.
        SpawnThenSet,
        /// Spawn, `REAPER.set`, then unpark the reaper once.
        SetThenUnpark,
        /// As `SetThenUnpark`, plus a `fence(SeqCst)` in the push between the stack push and
        /// `REAPER.get()` (only when the push found the stack empty), and one in the reaper before
        /// the check that decides to park.
        SetThenUnparkFenced,
    }

    /// The reaper starting while a record is pushed: launches made in manual mode, then
    /// `set_cleanup_mode(Reaper)`, and the next launch starts the reaper while an earlier launch's
    /// host function finishes on the driver's thread (pushes from launches made after the reaper
    /// started are ordered after `REAPER.set` by the launch itself, so they always see it).
    fn startup(start: Start) {
        let stack = new_stack();
        // `REAPER` (a OnceLock<Thread>): `get` is an Acquire load, `set` a Release store.
        let registered = Arc::new(AtomicBool::new(false));
        let fenced = start == Start::SetThenUnparkFenced;
        let reaper = {
            let stack = Arc::clone(&stack);
            thread::spawn(move || reaper_loop(&stack, 0, 1, fenced))
        };
        let handle = reaper.thread().clone();
        let driver = {
            let (stack, registered, handle) =
                (Arc::clone(&stack), Arc::clone(&registered), handle.clone());
            thread::spawn(move || {
                let was_empty = push_new(&stack, 0, 0);
                if was_empty {
                    if fenced {
                        fence(Ordering::SeqCst);
                    }
                    if registered.load(Ordering::Acquire) {
                        handle.unpark();
                    }
                }
                vec![was_empty]
            })
        };
        registered.store(true, Ordering::Release);
        if start != Start::SpawnThenSet {
            handle.unpark();
        }
        let pushes = vec![driver.join().unwrap()];
        let batches = reaper.join().unwrap();
        verify(&pushes, &[batches], &take_batch(&stack));
    }

    /// Finding: `start_reaper` spawns the reaper, then sets `REAPER`. The reaper may find the queue
    /// empty and park before `REAPER` is set while a driver thread's push finds `REAPER` unset and
    /// wakes no one: the reaper then sleeps with a record queued, and every later push finds the
    /// queue non-empty and wakes no one either (until something calls `drain`). loom reports the
    /// deadlock this leads to in the model.
    #[test]
    #[should_panic(expected = "deadlock")]
    fn loom_reaper_start_spawn_then_set_can_lose_the_first_wake_up() {
        check("reaper start: spawn, set (as cleanup.rs does)", 2, || {
            startup(Start::SpawnThenSet)
        });
    }

    /// Unparking the reaper once after `REAPER.set` is not enough in the language's memory model
    /// (store buffering: the push may read `REAPER` unset although the reaper parked after it was
    /// set). On x86-64 and AArch64 the push's CAS and the `Once` completion order it in practice.
    #[test]
    #[should_panic(expected = "deadlock")]
    fn loom_reaper_start_unpark_after_set_still_needs_fences() {
        check("reaper start: spawn, set, unpark (no fences)", 2, || {
            startup(Start::SetThenUnpark)
        });
    }

    /// The fix this model proves: unpark after `REAPER.set`, and a SeqCst fence on each side.
    #[test]
    fn loom_reaper_start_with_unpark_after_set_and_fences_loses_nothing() {
        check("reaper start: spawn, set, unpark, fences", 3, || {
            startup(Start::SetThenUnparkFenced)
        });
    }
}

/// `record_pool.rs`: slots handed out in address order from segments, and the tracking of the
/// records in them (`pending.rs`). A launcher bumps through its current segment (`allocate`) and
/// takes a free segment or a new one (registered) when it is used up (`next_segment`, which
/// rewrites the header under the pool's lock); it writes each record and publishes its slot
/// (`record.rs`'s `place`, `publish`), then marks it PENDING with its context (`track`). Every free
/// decrements the slot's segment's count, and the one that brings it to zero lists the segment as
/// free (`release`); an exiting thread gives back the slots it never handed out (`Local::drop`);
/// `trim` frees listed segments and unregisters them. A reclaim walks every registered segment's
/// published slots under the pool's lock (`for_each_published`, `pending::reclaim`) and takes the
/// PENDING records of its context with a compare-and-swap, which the trampoline's `mark_ran` races;
/// a launch the driver refused goes back to UNTRACKED before its slot is freed (`linked_shard`).
///
/// The model's segments come from `loom::alloc`, so loom reports a segment never freed (lost:
/// never listed) or freed twice. A slot handed out twice, or a segment reused while one of its
/// slots (or its header) is still being used, shows as a data race on the slot's or the header's
/// cell: each record is a write of its slot's `memory` cell by the launcher and a read by the
/// thread that releases it, and each decrement of the count a read of the header's cell, which
/// `next_segment` writes. The `memory` cell stands for all that `place` writes without atomics
/// (the record, its header's state byte included), and the walk reads it where the real walk reads
/// the state: so loom also reports a walk that reads a slot not yet written in full, or one being
/// overwritten by a reused segment's next record. `context` stands for `Tracking::context`.
mod record_pool_segments {
    use super::*;
    use loom::alloc::{Layout, alloc, dealloc};
    use loom::sync::Mutex;
    use std::cell::Cell;

    /// The slots a segment has room for, the header's included (`SEGMENT_SLOTS` is each pool's own:
    /// two or three, small enough for loom).
    const ROOM: usize = 3;
    /// `KEEP_SEGMENTS`: trim frees every listed segment.
    const KEEP_SEGMENTS: usize = 0;

    const UNTRACKED: usize = 0;
    const PENDING: usize = 1;
    const RAN: usize = 2;
    const RECLAIMED: usize = 3;

    /// A slot's record (see the module's comment).
    struct SlotCell {
        memory: UnsafeCell<usize>,
        context: UnsafeCell<usize>,
        state: AtomicUsize,
    }

    /// A segment: its header (`SegmentHeader`: the count, the published count; and a cell standing
    /// for the header's memory) and its slots. In `record_pool.rs` slot 0 is the header; here the
    /// slots are indexed from 1 as there.
    struct Segment {
        owed: AtomicUsize,
        published: AtomicUsize,
        header: UnsafeCell<usize>,
        slots: [SlotCell; ROOM],
    }

    const SEGMENT: Layout = Layout::new::<Segment>();

    /// `Segments`: the free list and the registry.
    struct Lists {
        free: Vec<usize>,
        all: Vec<usize>,
    }

    /// `SEGMENTS`, the pool's `SEGMENT_SLOTS`, and, not in record_pool.rs, how many segments were
    /// allocated.
    struct Pool {
        lists: Mutex<Lists>,
        slots: usize,
        allocated: std::sync::atomic::AtomicUsize,
    }

    /// A slot: its segment and its index.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    struct Slot(usize, usize);

    impl Slot {
        fn segment(self) -> &'static Segment {
            // SAFETY: the segment is live while it owes this slot, or is registered and the pool's
            // lock is held (what loom checks).
            unsafe { &*(self.0 as *const Segment) }
        }

        fn cell(self) -> &'static SlotCell {
            &self.segment().slots[self.1]
        }
    }

    /// A thread's `Local`: its segment and the next slot's index. It holds the pool, where
    /// `record_pool.rs` uses the `SEGMENTS` static.
    struct Local {
        pool: Arc<Pool>,
        segment: Cell<usize>,
        next: Cell<usize>,
    }

    impl Local {
        fn new(pool: &Arc<Pool>) -> Local {
            Local {
                pool: Arc::clone(pool),
                segment: Cell::new(0),
                next: Cell::new(pool.slots),
            }
        }
    }

    impl Drop for Local {
        /// `Local::drop`: the thread exits.
        fn drop(&mut self) {
            let unissued = self.pool.slots - self.next.get();
            if self.segment.get() != 0 && unissued > 0 {
                // SAFETY: the thread's segment owes the slots it never handed out.
                unsafe { release(&self.pool, self.segment.get(), unissued) };
            }
        }
    }

    /// `record_pool::allocate`.
    fn allocate(local: &Local) -> Slot {
        let next = local.next.get();
        if next == local.pool.slots {
            return next_segment(local);
        }
        local.next.set(next + 1);
        Slot(local.segment.get(), next)
    }

    /// `record_pool::next_segment`.
    fn next_segment(local: &Local) -> Slot {
        let segment = {
            let mut lists = local.pool.lists.lock().unwrap();
            let segment = match lists.free.pop() {
                Some(segment) => segment,
                None => {
                    // SAFETY: SEGMENT has a non-zero size.
                    let segment = unsafe { alloc(SEGMENT) }.cast::<Segment>();
                    assert!(!segment.is_null(), "out of memory");
                    // Not in record_pool.rs: loom's atomics and cells must be constructed, where
                    // the real segment is memory that the header's writes below initialise.
                    // SAFETY: a fresh allocation of a Segment.
                    unsafe {
                        segment.write(Segment {
                            owed: AtomicUsize::new(0),
                            published: AtomicUsize::new(0),
                            header: UnsafeCell::new(0),
                            slots: std::array::from_fn(|_| SlotCell {
                                memory: UnsafeCell::new(0),
                                context: UnsafeCell::new(0),
                                state: AtomicUsize::new(UNTRACKED),
                            }),
                        })
                    };
                    local
                        .pool
                        .allocated
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    lists.all.push(segment as usize);
                    segment as usize
                }
            };
            // The header's plain writes (`owed`, `published`), under the lock: loom checks the
            // cell's write against every earlier decrement.
            // SAFETY: the segment is ours alone now, but for a walk, which holds the lock.
            let header = unsafe { &*(segment as *const Segment) };
            // SAFETY: loom checks this write against every earlier access of the header.
            header.header.with_mut(|h| unsafe { *h += 1 });
            header.owed.store(local.pool.slots - 1, Ordering::Relaxed);
            header.published.store(0, Ordering::Relaxed);
            segment
        };
        local.segment.set(segment);
        local.next.set(2);
        Slot(segment, 1)
    }

    /// `record_pool::release`.
    ///
    /// # Safety
    /// `count` is not zero; `segment` owes at least `count` slots, and they are not used
    /// afterwards.
    unsafe fn release(pool: &Pool, segment: usize, count: usize) {
        // SAFETY: the segment is live while it owes slots.
        let header = unsafe { &*(segment as *const Segment) };
        // The decrement touches the header: a read of its cell, checked against its rewrite.
        // SAFETY: loom checks this read against the header's rewrite by a later taker.
        header.header.with(|h| unsafe { *h });
        if header.owed.fetch_sub(count, Ordering::AcqRel) == count {
            pool.lists.lock().unwrap().free.push(segment);
        }
    }

    /// `record_pool::free`.
    ///
    /// # Safety
    /// `slot` came from `allocate`, holds no live value and is not used afterwards.
    unsafe fn free(pool: &Pool, slot: Slot) {
        // SAFETY: as the caller promises.
        unsafe { release(pool, slot.0, 1) };
    }

    /// Drops a segment's loom objects and frees it.
    ///
    /// # Safety
    /// The segment is free, unregistered, and nobody else has it.
    unsafe fn dealloc_segment(segment: usize) {
        let segment = segment as *mut Segment;
        // SAFETY: as the caller promises. Freeing the memory writes it: loom checks nobody else
        // still touches the segment.
        unsafe {
            (*segment).header.with_mut(|h| *h = 0);
            for slot in &(*segment).slots {
                slot.memory.with_mut(|c| *c = 0);
            }
            ptr::drop_in_place(segment);
            dealloc(segment.cast(), SEGMENT);
        }
    }

    /// `record_pool::trim`.
    #[allow(
        clippy::absurd_extreme_comparisons,
        reason = "record_pool.rs's comparison with KEEP_SEGMENTS, which is 0 here"
    )]
    fn trim(pool: &Pool) -> usize {
        let surplus: Vec<usize> = {
            let mut lists = pool.lists.lock().unwrap();
            if lists.free.len() <= KEEP_SEGMENTS {
                return 0;
            }
            let excess = lists.free.len() - KEEP_SEGMENTS;
            let surplus: Vec<usize> = lists.free.drain(..excess).collect();
            lists.all.retain(|s| !surplus.contains(s));
            surplus
        };
        for &segment in &surplus {
            // SAFETY: listed segments are free; we took these off both lists.
            unsafe { dealloc_segment(segment) };
        }
        surplus.len()
    }

    /// `record.rs`'s `place`: the launcher writes a record into the slot, then publishes it.
    fn use_slot(slot: Slot, record: usize) {
        let cell = slot.cell();
        // SAFETY: loom checks the write is ordered after the slot's previous owner's last access.
        cell.memory.with_mut(|c| unsafe { *c = record });
        cell.state.store(UNTRACKED, Ordering::Relaxed);
        slot.segment()
            .published
            .store(slot.1 + 1, Ordering::Release);
    }

    /// Drops the record in a slot: the releasing thread reads what the launcher wrote.
    fn release_slot(slot: Slot) -> usize {
        // SAFETY: the slot holds a record this thread now owns.
        slot.cell().memory.with(|c| unsafe { *c })
    }

    /// Releases the record in a slot (it must be `record`) and frees the slot.
    fn release_record(pool: &Pool, slot: Slot, record: usize) {
        assert_eq!(
            release_slot(slot),
            record,
            "a slot changed under its record"
        );
        // SAFETY: the record is dropped and the slot is used no more.
        unsafe { free(pool, slot) };
    }

    /// `pending::track`, for a pooled record.
    fn track(slot: Slot, context: usize) {
        let cell = slot.cell();
        // SAFETY: the record is the launcher's; a walk reads this only after the store below.
        cell.context.with_mut(|c| unsafe { *c = context });
        cell.state.store(PENDING, Ordering::Release);
    }

    /// The trampoline's `mark_ran`: whether the record is the driver thread's to queue.
    fn mark_ran(slot: Slot) -> bool {
        match slot
            .cell()
            .state
            .compare_exchange(PENDING, RAN, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state != RECLAIMED,
        }
    }

    /// A refused launch released by its launcher (`forget`'s `linked_shard`, then the release).
    fn release_refused(pool: &Pool, slot: Slot, record: usize) {
        let state = &slot.cell().state;
        if state.load(Ordering::Acquire) == PENDING {
            state.store(UNTRACKED, Ordering::Release);
        }
        release_record(pool, slot, record);
    }

    /// `pending::reclaim`'s walk (`for_each_published`): the PENDING records of `context`, each
    /// taken with a CAS; with what `memory` held for each.
    fn walk(pool: &Pool, context: usize) -> Vec<(Slot, usize)> {
        let lists = pool.lists.lock().unwrap();
        let mut taken = Vec::new();
        for &segment in &lists.all {
            // SAFETY: a registered segment, live while the lock is held.
            let header = unsafe { &*(segment as *const Segment) };
            let published = header.published.load(Ordering::Acquire);
            for index in 1..published {
                let slot = Slot(segment, index);
                let cell = slot.cell();
                // SAFETY: loom checks the slot was written in full before, and is not rewritten
                // during the walk.
                let record = cell.memory.with(|m| unsafe { *m });
                if cell.state.load(Ordering::Acquire) == PENDING
                    // SAFETY: written before the PENDING store this load saw.
                    && cell.context.with(|c| unsafe { *c }) == context
                    && cell
                        .state
                        .compare_exchange(PENDING, RECLAIMED, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    taken.push((slot, record));
                }
            }
        }
        taken
    }

    fn new_pool(slots: usize) -> Arc<Pool> {
        assert!(slots <= ROOM);
        Arc::new(Pool {
            lists: Mutex::new(Lists {
                free: Vec::new(),
                all: Vec::new(),
            }),
            slots,
            allocated: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Spawns a thread that releases `records` (slot, record), frees their slots and, if `trims`,
    /// trims.
    fn reaper(
        pool: &Arc<Pool>,
        records: Vec<(Slot, usize)>,
        trims: bool,
    ) -> thread::JoinHandle<()> {
        let pool = Arc::clone(pool);
        thread::spawn(move || {
            for (slot, record) in records {
                release_record(&pool, slot, record);
            }
            if trims {
                trim(&pool);
            }
        })
    }

    /// Once every thread is done and every slot free: every segment not trimmed must be listed,
    /// once, and registered. Frees them (loom then checks each segment was freed exactly once,
    /// none lost).
    fn check_everything_back(pool: &Pool) {
        let (mut list, mut all) = {
            let mut lists = pool.lists.lock().unwrap();
            (
                std::mem::take(&mut lists.free),
                std::mem::take(&mut lists.all),
            )
        };
        let listed = list.len();
        list.sort_unstable();
        list.dedup();
        assert_eq!(list.len(), listed, "a segment listed twice");
        all.sort_unstable();
        assert_eq!(list, all, "registered segments and free segments differ");
        for segment in list {
            // SAFETY: nothing else runs; the segment is listed, so free.
            unsafe { dealloc_segment(segment) };
        }
    }

    /// The main thread filled a segment with records 1 and 2. The reaper releases them and trims,
    /// while a launcher allocates three records (from that segment once it is free, or from new
    /// ones), releases them and exits with part of its last segment unused. No slot is handed out
    /// twice, no segment is reused while a slot or the header is in use, and every segment ends
    /// listed or trimmed.
    #[test]
    fn loom_segments_are_reused_only_when_all_their_slots_are_free() {
        check(
            "segments: reaper x 2 frees + trim, launcher x 3 allocations + exit",
            3,
            || {
                let pool = new_pool(3);
                let main_local = Local::new(&pool);
                let records: Vec<_> = (1..=2)
                    .map(|record| {
                        let slot = allocate(&main_local);
                        use_slot(slot, record);
                        (slot, record)
                    })
                    .collect();
                let reaper = reaper(&pool, records, true);
                let launcher = {
                    let pool = Arc::clone(&pool);
                    thread::spawn(move || {
                        let local = Local::new(&pool);
                        let slots: Vec<_> = (0..3)
                            .map(|i| {
                                let slot = allocate(&local);
                                use_slot(slot, 10 + i);
                                slot
                            })
                            .collect();
                        for (i, &slot) in slots.iter().enumerate() {
                            assert!(!slots[i + 1..].contains(&slot), "a slot handed out twice");
                        }
                        for (i, &slot) in slots.iter().enumerate() {
                            release_record(&pool, slot, 10 + i);
                        }
                        drop(local);
                    })
                };
                reaper.join().unwrap();
                launcher.join().unwrap();
                drop(main_local);
                check_everything_back(&pool);
            },
        );
    }

    /// The last two owed slots of a segment are given back at once: a launcher's one record,
    /// released by another thread, and the one slot the launcher never handed out, as it exits.
    /// Exactly one of the two lists the segment; then a third thread reuses it.
    #[test]
    fn loom_an_exiting_thread_and_a_free_race_to_list_the_segment() {
        check(
            "segments: launcher exits while its record is freed, then reuse",
            3,
            || {
                let pool = new_pool(3);
                let launcher = {
                    let pool = Arc::clone(&pool);
                    thread::spawn(move || {
                        let local = Local::new(&pool);
                        let slot = allocate(&local);
                        use_slot(slot, 7);
                        let reaper = reaper(&pool, vec![(slot, 7)], false);
                        drop(local);
                        reaper
                    })
                };
                let reaper = launcher.join().unwrap();
                let user = {
                    let pool = Arc::clone(&pool);
                    thread::spawn(move || {
                        let local = Local::new(&pool);
                        let slot = allocate(&local);
                        use_slot(slot, 8);
                        release_record(&pool, slot, 8);
                        drop(local);
                    })
                };
                reaper.join().unwrap();
                user.join().unwrap();
                check_everything_back(&pool);
                assert!(
                    pool.allocated.load(std::sync::atomic::Ordering::Relaxed) <= 2,
                    "more segments than threads holding one"
                );
            },
        );
    }

    /// Segments of one slot per record: a launcher launches two records into context 1, the
    /// driver's thread runs and releases each (so the second may reuse the first's segment while
    /// a walk reads it), and a walk for context 2 runs meanwhile. The walk never reads a slot
    /// being written and takes nothing; each record runs once.
    #[test]
    fn loom_a_walk_never_reads_a_slot_being_written_even_when_its_segment_is_reused() {
        check(
            "pooled tracking: walk for another context during launch, run, release, reuse",
            3,
            || {
                let pool = new_pool(2);
                let handoff: Arc<Mutex<Vec<(Slot, usize)>>> = Arc::new(Mutex::new(Vec::new()));
                let launcher = {
                    let (pool, handoff) = (Arc::clone(&pool), Arc::clone(&handoff));
                    thread::spawn(move || {
                        let local = Local::new(&pool);
                        for record in 1..=2 {
                            let slot = allocate(&local);
                            use_slot(slot, record);
                            track(slot, 1);
                            handoff.lock().unwrap().push((slot, record));
                        }
                    })
                };
                let driver = {
                    let (pool, handoff) = (Arc::clone(&pool), Arc::clone(&handoff));
                    thread::spawn(move || {
                        let mut ran = 0;
                        while ran < 2 {
                            let next = handoff.lock().unwrap().pop();
                            let Some((slot, record)) = next else {
                                thread::yield_now();
                                continue;
                            };
                            assert!(mark_ran(slot), "a record not the driver's to run");
                            release_record(&pool, slot, record);
                            ran += 1;
                        }
                    })
                };
                let walker = {
                    let pool = Arc::clone(&pool);
                    thread::spawn(move || walk(&pool, 2))
                };
                launcher.join().unwrap();
                driver.join().unwrap();
                assert!(
                    walker.join().unwrap().is_empty(),
                    "took another context's record"
                );
                check_everything_back(&pool);
            },
        );
    }

    /// A launcher's two records into context 1: one pending (its context is then lost, so it never
    /// runs), one refused by the driver and released at once. After it exits, a reclaim of
    /// context 1 walks the pool while a second launcher launches into context 2 and its record
    /// runs. The reclaim takes exactly the pending record, and releases it; nothing is released
    /// twice, and every segment ends free.
    #[test]
    fn loom_a_reclaim_takes_each_pending_record_once_and_never_a_refused_one() {
        check(
            "pooled tracking: reclaim after a refused launch, beside a launch elsewhere",
            3,
            || {
                let pool = new_pool(3);
                let first = {
                    let pool = Arc::clone(&pool);
                    thread::spawn(move || {
                        let local = Local::new(&pool);
                        let pending = allocate(&local);
                        use_slot(pending, 1);
                        track(pending, 1);
                        let refused = allocate(&local);
                        use_slot(refused, 2);
                        track(refused, 1);
                        release_refused(&pool, refused, 2);
                        pending
                    })
                };
                let pending = first.join().unwrap();
                let reclaim = {
                    let pool = Arc::clone(&pool);
                    thread::spawn(move || {
                        let taken = walk(&pool, 1);
                        for &(slot, record) in &taken {
                            release_record(&pool, slot, record);
                        }
                        taken
                    })
                };
                let second = {
                    let pool = Arc::clone(&pool);
                    thread::spawn(move || {
                        let local = Local::new(&pool);
                        let slot = allocate(&local);
                        use_slot(slot, 3);
                        track(slot, 2);
                        assert!(mark_ran(slot));
                        release_record(&pool, slot, 3);
                    })
                };
                second.join().unwrap();
                let taken = reclaim.join().unwrap();
                assert_eq!(taken, vec![(pending, 1)], "the reclaim took {taken:?}");
                check_everything_back(&pool);
            },
        );
    }
}

mod launch_state;
