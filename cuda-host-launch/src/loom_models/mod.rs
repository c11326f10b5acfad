//! Model checks, with [loom](https://docs.rs/loom), of the library's lock-free core, on its own
//! code: the primitives of that code come from `support::sync`, which is loom's under `--cfg loom`,
//! so these models call the very functions the library runs.
//!
//! - `stack`: the intrusive stack (`support/intrusive_stack.rs`);
//! - `reaper_wake_up`: the cleanup queue's wake-up protocol (`reaper/queue.rs`: `push`,
//!   `reaper_may_park`, `set_reaper`);
//! - `pool`: the record pool (`record/pool.rs`, a small [`RecordPool`](crate::record::pool::RecordPool)
//!   per execution);
//! - `launch_state`: who owns a run-once launch (`record/launch_state.rs`);
//! - `tickets`: the ticket table (`record/ticket_table.rs`): take, run, walk, reclaim, reuse;
//! - `thread_slots`: the event side's hand-over (`support/thread_slots.rs`): its wake-up and its
//!   stop.
//!
//! What the library keeps in `static`s and `thread_local!`s (the process's queue and pool, a
//! thread's pool state) is a value here, made per execution; what loom cannot model (the clock,
//! sleeps, the driver) stays out.
//!
//! Run them (`scripts/loom` does this):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p cuda-host-launch --release --lib loom_ -- --nocapture
//! ```
//!
//! `LOOM_MAX_PREEMPTIONS=n` overrides each model's preemption bound; `LOOM_LOG=1` traces a failing
//! execution. Each model prints how many executions loom explored.
//!
//! Every node or slot carries a `loom::cell::UnsafeCell` that its producer writes before handing
//! it on and its consumer reads after taking it, so loom reports any hand-over that is not ordered
//! (the Release/Acquire pairings the queue and the pool rely on for the host function's effects
//! and the record's contents).

use std::collections::HashMap;
use std::ptr::{self, NonNull};
// Plain `Arc`s to share the models' state: loom's own would also check for leaked `Arc`s, but it
// cannot be dropped while a model that found a deadlock unwinds (a failing model's report).
use std::sync::Arc;
use std::time::Instant;

use loom::cell::UnsafeCell;
use loom::thread;

use crate::support::intrusive_stack::{Batch, IntrusiveStack, Linked};
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

/// A new node (`producer`, `seq`), written as a producer writes its record.
fn new_node(producer: usize, seq: usize) -> NonNull<Node> {
    let node = Box::new(Node {
        next: AtomicPtr::new(ptr::null_mut()),
        id: UnsafeCell::new((usize::MAX, usize::MAX)),
    });
    // The producer's own effects, which the consumer must see (a data race for loom otherwise).
    // SAFETY: the node is not shared yet.
    node.id.with_mut(|id| unsafe { *id = (producer, seq) });
    NonNull::from(Box::leak(node))
}

/// Makes node (`producer`, `seq`) and pushes it; returns what `push` returned.
fn push_new(stack: &Shared, producer: usize, seq: usize) -> bool {
    // SAFETY: a fresh node, pushed once; the stack owns it until a consumer takes it.
    unsafe { stack.push(new_node(producer, seq)) }
}

/// Takes every node and reads each one's id (without freeing: `verify` frees them once it has
/// checked that no node was taken twice).
fn take_batch(stack: &Shared) -> Vec<Taken> {
    take_nodes(stack.take_all())
}

/// Reads the id of every node of a batch (see [`take_batch`]).
fn take_nodes(batch: Batch<Node>) -> Vec<Taken> {
    batch
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

mod launch_state;
mod pool;
mod reaper_wake_up;
mod stack;
mod thread_slots;
mod tickets;
