//! Model checks, with [loom](https://docs.rs/loom), of the lock-free parts of the cleanup queue:
//! the intrusive stack, the reaper's wake-up protocol, and the record pool (its chunks, thread-local
//! caches and global free stack).
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
//! - The reaper (`cleanup.rs`: `push`, `start_reaper`, `reaper_loop`) and the pool (`record_pool.rs`:
//!   `allocate`, `refill`, `new_chunk`, `free`, `trim`, `LocalCache::drop`) live in `static`s, a
//!   `thread_local!`, `std::thread::park` and the system allocator, which loom cannot model in place.
//!   Their algorithms are transcribed here, step for step and with the same orderings, around the
//!   real [`IntrusiveStack`] (the pool's `take_chain`, `push_chain` and `push_chain_if_empty`
//!   included). Keep them in step with the code they model.
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

use crate::intrusive_stack::{IntrusiveStack, Linked};
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

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

/// `record_pool.rs`: slots carved from chunks, a cache of free slots per thread and the global free
/// stack. Releasing threads `free` slots onto the global stack; a launcher whose cache is empty
/// `refill`s it (takes the whole stack, keeps the first `LOCAL_MAX` slots, gives the rest back with
/// `push_chain_if_empty`, taking in whatever others pushed meanwhile) or carves a `new_chunk`; an
/// exiting thread pushes its cache back (`LocalCache::drop`); `trim` frees the chunks all of whose
/// slots wait in the global stack and pushes the other slots back.
///
/// The model's chunks come from `loom::alloc`, so loom reports a chunk never freed (a slot lost, or
/// kept out of the pool), a chunk freed twice and one freed by an address that is not its start. A
/// slot handed out twice shows as two live records at one address and as a data race on its
/// contents; so does a chunk freed while one of its slots is still in use or cached (or loom fails
/// on the slot's dropped objects, if it is used after the free).
mod record_pool_chunks {
    use super::*;
    use loom::alloc::{Layout, alloc, dealloc};
    use std::cell::Cell;

    /// The model's constants, small enough for loom: one chunk holds the main thread's two records,
    /// and the launcher's three need a refill or a second chunk.
    const CHUNK_SLOTS: usize = 2;
    /// `LOCAL_MAX`.
    const LOCAL_MAX: usize = 2;
    /// `KEEP`: trim frees every whole chunk it finds.
    const KEEP: usize = 0;

    /// A slot: the link `record_pool::FreeSlot` has in its first word, and the rest of the slot
    /// (the record's memory while it is allocated).
    ///
    /// Not in record_pool.rs: `serial`, the number of the slot's chunk in the order chunks were
    /// allocated (see `by_address`).
    struct Slot {
        next: AtomicPtr<Slot>,
        contents: UnsafeCell<usize>,
        serial: usize,
    }

    // SAFETY: `link` always returns `next`, which only the stack writes while the slot is in it.
    unsafe impl Linked for Slot {
        fn link(&self) -> &AtomicPtr<Self> {
            &self.next
        }
    }

    /// `CHUNK`: a power of two that holds `CHUNK_SLOTS` slots (loom's are not 128 bytes), aligned
    /// to its size, so that a slot's chunk is its address rounded down, as in `record_pool.rs`.
    const CHUNK_BYTES: usize = (CHUNK_SLOTS * size_of::<Slot>()).next_power_of_two();
    const CHUNK: Layout = match Layout::from_size_align(CHUNK_BYTES, CHUNK_BYTES) {
        Ok(layout) => layout,
        Err(_) => panic!("a valid chunk layout"),
    };

    /// `GLOBAL`: the stack and its count; and, not in record_pool.rs, how many chunks were
    /// allocated (a plain counter for `Slot::serial`, not part of the model).
    struct Pool {
        stack: IntrusiveStack<Slot>,
        count: AtomicUsize,
        chunks: std::sync::atomic::AtomicUsize,
    }

    // SAFETY: as `Shared`: slots pass between threads through the stack.
    unsafe impl Send for Pool {}
    // SAFETY: as above.
    unsafe impl Sync for Pool {}

    /// Reads a free slot's link, the slot's first word. `record_pool.rs` loads it (Relaxed); here
    /// that is also a read of the slot's contents, so loom checks the slot's last plain write
    /// (`write_link`, or the record's) is ordered before.
    ///
    /// # Safety
    /// `slot` is free and ours (cached, or in a chain we took).
    unsafe fn read_link(slot: NonNull<Slot>) -> *mut Slot {
        // SAFETY: as the caller promises.
        let slot = unsafe { slot.as_ref() };
        // SAFETY: a read of our slot's memory; loom checks it against other threads' writes.
        slot.contents.with(|c| unsafe { *c });
        slot.next.load(Ordering::Relaxed)
    }

    /// Writes a free slot's link as `free` and `LocalCache::push` do: with a plain write of the
    /// slot's first word (a fresh `AtomicPtr`). Here that is a Relaxed store and a write of the
    /// slot's contents, so loom checks nobody else touches the slot meanwhile.
    ///
    /// # Safety
    /// `slot` is ours and holds no live record.
    unsafe fn write_link(slot: NonNull<Slot>, next: *mut Slot) {
        // SAFETY: as the caller promises.
        let slot = unsafe { slot.as_ref() };
        // SAFETY: a write of our slot's memory; loom checks it against other threads' accesses.
        slot.contents.with_mut(|c| unsafe { *c = 0 });
        slot.next.store(next, Ordering::Relaxed);
    }

    /// A thread's `LocalCache`: a plain list through the slots' links. It holds the pool, where
    /// `record_pool.rs` uses the `GLOBAL` static.
    struct Local {
        pool: Arc<Pool>,
        head: Cell<*mut Slot>,
    }

    impl Local {
        fn new(pool: &Arc<Pool>) -> Local {
            Local {
                pool: Arc::clone(pool),
                head: Cell::new(ptr::null_mut()),
            }
        }

        /// `LocalCache::push`.
        fn push(&self, slot: NonNull<Slot>) {
            // SAFETY: a free slot now owned by this list.
            unsafe { write_link(slot, self.head.get()) };
            self.head.set(slot.as_ptr());
        }

        /// `LocalCache::pop`.
        fn pop(&self) -> Option<NonNull<Slot>> {
            let slot = NonNull::new(self.head.get())?;
            // SAFETY: slots in the local list are free and owned by it.
            self.head.set(unsafe { read_link(slot) });
            Some(slot)
        }
    }

    impl Drop for Local {
        /// `LocalCache::drop`: the thread exits; its cached slots go back to the global stack.
        fn drop(&mut self) {
            let Some(first) = NonNull::new(self.head.get()) else {
                return;
            };
            let (mut last, mut count) = (first, 1);
            // SAFETY: slots in the local list are free and owned by it.
            while let Some(next) = NonNull::new(unsafe { read_link(last) }) {
                (last, count) = (next, count + 1);
            }
            self.pool.count.fetch_add(count, Ordering::Relaxed);
            // SAFETY: the list from `first` to `last` is ours, and in no stack.
            unsafe { self.pool.stack.push_chain(first, last) };
        }
    }

    /// `record_pool::allocate`.
    fn allocate(cache: &Local) -> NonNull<Slot> {
        cache.pop().unwrap_or_else(|| refill(cache))
    }

    /// `record_pool::refill`.
    fn refill(cache: &Local) -> NonNull<Slot> {
        let pool = &*cache.pool;
        let Some(first) = NonNull::new(pool.stack.take_chain()) else {
            return new_chunk(cache);
        };
        let (mut last, mut taken) = (first, 1);
        while taken < LOCAL_MAX {
            // SAFETY: a taken chain's slots are free and ours.
            let Some(next) = NonNull::new(unsafe { read_link(last) }) else {
                break;
            };
            (last, taken) = (next, taken + 1);
        }
        // SAFETY: as above.
        let rest = unsafe { read_link(last) };
        // SAFETY: as above.
        unsafe { last.as_ref() }
            .next
            .store(ptr::null_mut(), Ordering::Relaxed);
        // SAFETY: as above; the cache is empty, and takes the slots after `first` up to `last`.
        cache.head.set(unsafe { read_link(first) });
        while let Some(chain) = NonNull::new(rest) {
            // SAFETY: the chain from `chain` to its null end is ours, and in no stack.
            if unsafe { pool.stack.push_chain_if_empty(chain) } {
                break;
            }
            let mut newcomer = pool.stack.take_chain();
            while let Some(slot) = NonNull::new(newcomer) {
                // SAFETY: as above, for the newcomers' chain.
                newcomer = unsafe { read_link(slot) };
                cache.push(slot);
                taken += 1;
            }
        }
        let before = pool.count.fetch_sub(taken, Ordering::Relaxed);
        // Not in record_pool.rs: the count never goes below what was taken.
        assert!(
            before >= taken,
            "GLOBAL.count underflow: {before} - {taken}"
        );
        first
    }

    /// `record_pool::new_chunk`.
    fn new_chunk(cache: &Local) -> NonNull<Slot> {
        // SAFETY: CHUNK has a non-zero size.
        let chunk = NonNull::new(unsafe { alloc(CHUNK) }.cast::<Slot>()).expect("out of memory");
        // Not in record_pool.rs: loom's atomics and cells must be constructed, where the real
        // slots are just memory until `LocalCache::push` or `free` writes a link.
        let serial = cache
            .pool
            .chunks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for i in 0..CHUNK_SLOTS {
            // SAFETY: slot i of the fresh chunk, inside its allocation (CHUNK_BYTES holds them all).
            unsafe {
                chunk.add(i).as_ptr().write(Slot {
                    next: AtomicPtr::new(ptr::null_mut()),
                    contents: UnsafeCell::new(0),
                    serial,
                });
            }
        }
        for i in (1..CHUNK_SLOTS).rev() {
            // SAFETY: slot i of the chunk, inside its allocation.
            cache.push(unsafe { chunk.add(i) });
        }
        chunk
    }

    /// `std::alloc::dealloc(chunk, CHUNK)`, after dropping the slots' loom objects.
    ///
    /// # Safety
    /// `chunk` is the first slot of a chunk from `new_chunk`, and none of its slots is used, cached
    /// or in a stack any more.
    unsafe fn free_chunk(chunk: NonNull<Slot>) {
        for i in 0..CHUNK_SLOTS {
            // SAFETY: as the caller promises. Freeing the memory writes it: loom checks nobody else
            // still touches the slot.
            unsafe {
                let slot = chunk.add(i);
                slot.as_ref().contents.with_mut(|c| *c = 0);
                ptr::drop_in_place(slot.as_ptr());
            }
        }
        // SAFETY: as the caller promises; allocated with CHUNK by `new_chunk`.
        unsafe { dealloc(chunk.as_ptr().cast(), CHUNK) };
    }

    /// `record_pool::free`.
    ///
    /// # Safety
    /// `slot` came from `allocate`, holds no live value and is not used afterwards.
    unsafe fn free(pool: &Pool, slot: NonNull<Slot>) {
        pool.count.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the slot is ours; its first word becomes the link.
        unsafe {
            write_link(slot, ptr::null_mut());
            pool.stack.push(slot);
        }
    }

    /// `record_pool::chunk_of`.
    fn chunk_of(slot: NonNull<Slot>) -> usize {
        slot.as_ptr() as usize & !(CHUNK_BYTES - 1)
    }

    /// `slots.sort_unstable()` (by address), made deterministic: loom replays each execution's
    /// schedule from the start, and the system allocator may place the chunks differently in
    /// another execution. So chunks are ordered by `serial` here, and the slots of a chunk by
    /// address as in `record_pool.rs`; a chunk's slots are still together, first slot first.
    fn by_address(slots: &mut [NonNull<Slot>]) {
        // SAFETY: the slots are ours; `serial` is written once, before the chunk is shared.
        slots.sort_unstable_by_key(|slot| (unsafe { slot.as_ref() }.serial, slot.as_ptr()));
    }

    /// `record_pool::trim`.
    #[allow(
        clippy::absurd_extreme_comparisons,
        reason = "record_pool.rs's comparisons with KEEP, which is 0 here"
    )]
    fn trim(pool: &Pool) -> usize {
        if pool.count.load(Ordering::Relaxed) <= KEEP {
            return 0;
        }
        let mut slots = Vec::new();
        let mut node = pool.stack.take_chain();
        while let Some(slot) = NonNull::new(node) {
            // SAFETY: a taken chain's slots are free and ours.
            node = unsafe { read_link(slot) };
            slots.push(slot);
        }
        by_address(&mut slots);
        let mut left = slots.len();
        let mut freed = 0;
        let mut kept: Option<(NonNull<Slot>, NonNull<Slot>)> = None;
        for group in slots.chunk_by(|a, b| chunk_of(*a) == chunk_of(*b)) {
            if group.len() == CHUNK_SLOTS && left - CHUNK_SLOTS >= KEEP {
                // SAFETY: every slot of the chunk is here, so none is in use or cached anywhere
                // else (which loom checks); its first slot is its start.
                unsafe { free_chunk(group[0]) };
                left -= CHUNK_SLOTS;
                freed += 1;
                continue;
            }
            for &slot in group {
                // SAFETY: a free slot of ours; linked in address order (last, first) as we go.
                unsafe {
                    match kept {
                        None => {
                            slot.as_ref().next.store(ptr::null_mut(), Ordering::Relaxed);
                            kept = Some((slot, slot));
                        }
                        Some((first, last)) => {
                            last.as_ref().next.store(slot.as_ptr(), Ordering::Relaxed);
                            kept = Some((first, slot));
                        }
                    }
                }
            }
        }
        if let Some((first, last)) = kept {
            // SAFETY: the chain from `first` to `last` is ours, and in no stack.
            unsafe { pool.stack.push_chain(first, last) };
        }
        let before = pool.count.fetch_sub(freed * CHUNK_SLOTS, Ordering::Relaxed);
        // Not in record_pool.rs: the count never goes below what was freed.
        assert!(
            before >= freed * CHUNK_SLOTS,
            "GLOBAL.count underflow: {before} - {freed} chunks"
        );
        freed
    }

    /// Puts a record into a slot: the launcher writes the slot's memory.
    fn use_slot(slot: NonNull<Slot>, record: usize) {
        // SAFETY: the slot was just allocated and is ours; loom checks the write is ordered after
        // the previous owner's last access.
        unsafe { slot.as_ref() }
            .contents
            .with_mut(|c| unsafe { *c = record });
    }

    /// Drops the record in a slot: the releasing thread reads (and drops) what the launcher wrote.
    fn release_slot(slot: NonNull<Slot>) -> usize {
        // SAFETY: the slot holds a record this thread now owns.
        unsafe { slot.as_ref() }.contents.with(|c| unsafe { *c })
    }

    /// An empty pool: `GLOBAL` as a process starts.
    fn new_pool() -> Arc<Pool> {
        Arc::new(Pool {
            stack: IntrusiveStack::new(),
            count: AtomicUsize::new(0),
            chunks: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Spawns a reaper that releases `records` (slot address, record), frees their slots and trims.
    fn reaper(pool: &Arc<Pool>, records: Vec<(usize, usize)>) -> thread::JoinHandle<()> {
        let pool = Arc::clone(pool);
        thread::spawn(move || {
            for (addr, record) in records {
                let slot = NonNull::new(addr as *mut Slot).unwrap();
                assert_eq!(
                    release_slot(slot),
                    record,
                    "a slot changed under its record"
                );
                // SAFETY: the record is dropped and the slot is used no more.
                unsafe { free(&pool, slot) };
            }
            trim(&pool);
        })
    }

    /// Spawns a launcher that allocates `count` records, checks their slots are distinct, releases
    /// them, frees their slots and exits (its cached slots go back to the global stack).
    fn launcher(pool: &Arc<Pool>, count: usize) -> thread::JoinHandle<()> {
        let pool = Arc::clone(pool);
        thread::spawn(move || {
            let local = Local::new(&pool);
            let slots: Vec<_> = (0..count)
                .map(|i| {
                    let slot = allocate(&local);
                    use_slot(slot, 10 + i);
                    slot
                })
                .collect();
            for (i, &slot) in slots.iter().enumerate() {
                for &other in &slots[i + 1..] {
                    assert_ne!(slot, other, "a slot handed out twice");
                }
            }
            for (i, &slot) in slots.iter().enumerate() {
                assert_eq!(release_slot(slot), 10 + i, "a slot shared by two records");
                // SAFETY: the record is dropped and the slot is used no more.
                unsafe { free(&pool, slot) };
            }
            // The thread exits: `LocalCache::drop`.
            drop(local);
        })
    }

    /// Once every thread is done and every slot free: each chunk still allocated must be whole in
    /// the global stack (a slot missing from it was lost), and the count must be the stack's
    /// length. Frees the chunks (loom then checks that every chunk was freed exactly once).
    fn check_everything_back(pool: &Pool) {
        let mut slots = Vec::new();
        let mut node = pool.stack.take_chain();
        while let Some(slot) = NonNull::new(node) {
            // SAFETY: a taken chain's slots are free and ours.
            node = unsafe { read_link(slot) };
            slots.push(slot);
        }
        let left = slots.len();
        by_address(&mut slots);
        for group in slots.chunk_by(|a, b| chunk_of(*a) == chunk_of(*b)) {
            assert_eq!(
                group.len(),
                CHUNK_SLOTS,
                "chunk {:#x} has {} of its slots in the pool",
                chunk_of(group[0]),
                group.len()
            );
            // SAFETY: every slot of the chunk is here, and nothing else runs.
            unsafe { free_chunk(group[0]) };
        }
        assert_eq!(
            pool.count.load(Ordering::Relaxed),
            left,
            "GLOBAL.count is off"
        );
    }

    /// The main thread allocated `a` and `b` (records 1 and 2: one chunk) earlier. The reaper
    /// releases them and trims while a launcher allocates three records (a refill with what the
    /// reaper freed, a new chunk, or both), releases them and exits. Afterwards every chunk is
    /// either freed by `trim` or whole in the global stack, whose length the count matches.
    ///
    /// The global stack never holds more than `LOCAL_MAX` slots when the launcher refills here:
    /// `refill`'s give-back is the next model's.
    #[test]
    fn loom_chunked_pool_loses_and_duplicates_no_slot() {
        check(
            "pool: reaper x 2 frees + trim, launcher x 3 allocations + exit",
            3,
            || {
                let pool = new_pool();
                let main_local = Local::new(&pool);
                let records: Vec<_> = (1..=2)
                    .map(|record| {
                        let slot = allocate(&main_local);
                        use_slot(slot, record);
                        (slot.as_ptr() as usize, record)
                    })
                    .collect();
                let reaper = reaper(&pool, records);
                let launcher = launcher(&pool, 3);
                reaper.join().unwrap();
                launcher.join().unwrap();
                drop(main_local);
                check_everything_back(&pool);
            },
        );
    }

    /// `refill`'s give-back: the main thread allocated four records (two chunks) and released three
    /// of them, so the global stack holds three slots. A launcher allocates one record: its refill
    /// takes three or four slots, keeps `LOCAL_MAX`, and gives the rest back while the reaper
    /// releases the fourth record and trims, so `push_chain_if_empty` may find the stack not empty
    /// (the launcher then takes the newcomer into its cache and tries again), or empty again (the
    /// reaper's trim took it), and `trim` may take the slots given back.
    #[test]
    fn loom_refill_gives_back_what_it_does_not_keep() {
        check(
            "pool: 3 slots free, reaper x 1 free + trim, launcher x 1 allocation + exit",
            3,
            || {
                let pool = new_pool();
                let main_local = Local::new(&pool);
                let mut records: Vec<_> = (1..=4)
                    .map(|record| {
                        let slot = allocate(&main_local);
                        use_slot(slot, record);
                        (slot.as_ptr() as usize, record)
                    })
                    .collect();
                let fourth = records.pop().unwrap();
                for (addr, record) in records {
                    let slot = NonNull::new(addr as *mut Slot).unwrap();
                    assert_eq!(release_slot(slot), record);
                    // SAFETY: the record is dropped and the slot is used no more.
                    unsafe { free(&pool, slot) };
                }
                let reaper = reaper(&pool, vec![fourth]);
                let launcher = launcher(&pool, 1);
                reaper.join().unwrap();
                launcher.join().unwrap();
                drop(main_local);
                check_everything_back(&pool);
            },
        );
    }
}
