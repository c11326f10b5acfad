//! Launches whose host function has not run yet, per context, so their owners can be reclaimed once
//! the driver can no longer run them.
//!
//! After a sticky context error (a kernel trapped: 719) the driver still accepts `cuLaunchHostFunc`
//! but never calls the function, so a record released only by its trampoline would leak. Every
//! run-once record therefore carries its context and a state, from its launch until it is
//! released:
//!
//! ```text
//!   UNTRACKED --track--> LAUNCHING --launch accepted--> PENDING --trampoline--> RAN --> released
//!                          |                              \--reclaim--> RECLAIMED --> released
//!                          \--launch refused: back to UNTRACKED--> released by the launcher
//! ```
//!
//! (the whole state machine, with the cases where the host function runs before the launcher is
//! done and where another thread's capture may have taken the launch, is in
//! [`launch_state`](crate::launch_state)),
//! and a reclaim must be able to find it. How it is found depends on where the record lives:
//! - **In a pool slot** (small records: the common case), nowhere but in its slot. A reclaim walks
//!   every published slot of the pool's segments under the pool's lock
//!   ([`record_pool::for_each_published`](crate::record_pool::for_each_published)), which no
//!   segment is reused or freed without, and takes the PENDING records of its context. The launch
//!   itself takes no lock: it writes the context and stores the state. (On the H200, a stand-in
//!   lock per launch cost about 3.5 % of the pipelined enqueue cost in the benchmark's build-up
//!   parts, and removing the lock this way sped owner launches on four streams by 1-10 % of
//!   enqueue and 2-6 % of throughput in one-process A/B runs: `BENCHMARKS.md`.)
//! - **Boxed** (large records), linked into one of [`SHARDS`] intrusive doubly linked lists, each
//!   behind its own mutex: the launching thread links its record into the shard its thread was
//!   given (an uncontended lock in the common case), the thread that releases it unlinks it, and a
//!   reclaim walks the lists.
//!
//! Either way the trampoline, on the driver's thread, only flips the state with one
//! compare-and-swap (no lock: a launcher may hold a shard lock while it is blocked in the driver),
//! and that compare-and-swap decides, exactly once, whether the trampoline or a reclaim owns the
//! record. A reclaim never takes a record whose launch call has not returned (LAUNCHING), so a
//! launch the driver refuses is released by its launcher alone, and one it accepts is never
//! released under the driver. A released pooled record goes back to UNTRACKED before its slot is
//! freed, since a reclaim's walk still reads the slot until its segment is reused.

use std::cell::UnsafeCell;
use std::ptr::{self, NonNull};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_sys::types::CUcontext;

use crate::launch_state::LaunchState;
use crate::own_line::OwnLine;
use crate::record::RecordHeader;

/// How many lists (and locks) launches are spread over.
pub(crate) const SHARDS: usize = 16;

/// The `shard` of a record in a pool slot: it is never linked into a list; a reclaim finds it by
/// walking the pool's segments.
const BY_SEGMENT: u8 = u8::MAX;
const _: () = assert!(SHARDS < BY_SEGMENT as usize);

/// The tracking part of a record's header.
pub(crate) struct Tracking {
    state: LaunchState,
    /// [`BY_SEGMENT`] for a pooled record (set when it is made, never changed); else the shard the
    /// record is linked into (valid while [`LaunchState::is_listed`]).
    shard: UnsafeCell<u8>,
    /// The context it was launched into: written before the record is linked (read under its shard
    /// lock) or, pooled, before its state leaves UNTRACKED (read once a walk has seen a pending
    /// state).
    context: UnsafeCell<usize>,
    /// The shard list's links; read and written only under the shard's lock.
    prev: UnsafeCell<*mut RecordHeader>,
    next: UnsafeCell<*mut RecordHeader>,
}

impl Tracking {
    /// The tracking of a new record: `in_pool_slot` for one that lives in a pool slot, whose
    /// launch will not be linked into a list (the slot must then be published: see
    /// [`PoolSlot::publish`](crate::record_pool::PoolSlot::publish)).
    pub(crate) fn new(in_pool_slot: bool) -> Tracking {
        Tracking {
            state: LaunchState::new(),
            shard: UnsafeCell::new(if in_pool_slot { BY_SEGMENT } else { 0 }),
            context: UnsafeCell::new(0),
            prev: UnsafeCell::new(ptr::null_mut()),
            next: UnsafeCell::new(ptr::null_mut()),
        }
    }
}

struct Shard {
    head: *mut RecordHeader,
}

// SAFETY: the raw pointers are links of records that the shard's mutex protects; they are only
// followed under that mutex.
unsafe impl Send for Shard {}

/// Each shard's lock on lines of its own: a launching thread takes its shard's lock on every
/// launch, and must not find the line taken by a neighbour's writer (another shard's thread, or the
/// record pool's list of free segments).
static LISTS: [OwnLine<Mutex<Shard>>; SHARDS] = [const {
    OwnLine(Mutex::new(Shard {
        head: ptr::null_mut(),
    }))
}; SHARDS];

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
}

fn lock(shard: usize) -> std::sync::MutexGuard<'static, Shard> {
    LISTS[shard]
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn tracking(header: NonNull<RecordHeader>) -> &'static Tracking {
    // SAFETY: callers pass live records; the reference is used only while the record is live
    // (the `'static` is local to this module's functions, which never keep it).
    unsafe { &*RecordHeader::tracking(header) }
}

/// The ownership state of a live record (see [`launch_state`](crate::launch_state)).
pub(crate) fn launch_state(header: NonNull<RecordHeader>) -> &'static LaunchState {
    &tracking(header).state
}

/// Links a record about to be launched into `context`'s pending launches; the caller holds it
/// (LAUNCHING) until it reports how its launch went ([`LaunchState::launched`], or its release).
///
/// # Safety
/// `header` must be a live run-once record, not yet tracked, owned by the caller.
pub(crate) unsafe fn track(header: NonNull<RecordHeader>, context: CUcontext) {
    let t = tracking(header);
    // SAFETY: written when the record was made, on this thread; never changed for pooled records.
    if unsafe { *t.shard.get() } == BY_SEGMENT {
        // A pooled record: no list and no lock. A reclaim reads the context only once it has seen
        // a pending state, which the Release store below orders after this write; the slot is
        // published already, so the state it reads was written before (when the record was made).
        // SAFETY: the record is ours; a reclaim reads this field only after the store below.
        unsafe { *t.context.get() = context.addr() };
        t.state.begin();
        return;
    }
    let shard = MY_SHARD.try_with(|s| *s).unwrap_or(0);
    let mut list = lock(shard);
    // SAFETY: the record is ours and unlinked; its list fields are written under the shard lock
    // that every later reader takes.
    unsafe {
        *t.shard.get() = shard as u8;
        *t.context.get() = context.addr();
        *t.prev.get() = ptr::null_mut();
        *t.next.get() = list.head;
        if let Some(old) = NonNull::new(list.head) {
            *tracking(old).prev.get() = header.as_ptr();
        }
    }
    list.head = header.as_ptr();
    t.state.begin();
}

/// Unlinks a record under its shard's lock (the caller holds `list`).
///
/// # Safety
/// The record must be linked into the list `list` guards.
unsafe fn unlink(list: &mut Shard, header: NonNull<RecordHeader>) {
    let t = tracking(header);
    // SAFETY: under the shard lock; the neighbours are live linked records of this list.
    unsafe {
        let (prev, next) = (*t.prev.get(), *t.next.get());
        match NonNull::new(prev) {
            Some(p) => *tracking(p).next.get() = next,
            None => list.head = next,
        }
        if let Some(n) = NonNull::new(next) {
            *tracking(n).prev.get() = prev;
        }
        *t.prev.get() = ptr::null_mut();
        *t.next.get() = ptr::null_mut();
    }
}

/// Before a record is released: unlinks it if it is still linked (it ran, or its launch failed),
/// and marks it untracked.
///
/// Never called on a driver thread.
pub(crate) fn forget(header: NonNull<RecordHeader>) {
    if let Some(shard) = linked_shard(header) {
        let mut list = lock(shard);
        // SAFETY: linked into this shard (see `linked_shard`), whose lock we hold.
        unsafe { unlink(&mut list, header) };
        tracking(header).state.untrack();
    }
}

/// The shard a record its owner is releasing is linked into, if it is linked (a reclaim unlinks
/// the records it takes under the shard's lock, and changes their state first, so for a record
/// its owner is releasing the answer read here stays true).
///
/// A pooled record is never linked: its state goes back to UNTRACKED here, before its slot is
/// freed, since a later reclaim's walk over the pool still reads that slot until the segment is
/// reused, and must not take it for a pending launch. (Whoever releases a record owns it: no other
/// party changes its state any more.)
fn linked_shard(header: NonNull<RecordHeader>) -> Option<usize> {
    let t = tracking(header);
    // SAFETY: written when the record was made (pooled) or before it was linked, and never changed
    // since.
    let shard = unsafe { *t.shard.get() };
    if shard == BY_SEGMENT {
        t.state.untrack();
        return None;
    }
    t.state.is_listed().then_some(shard as usize)
}

/// [`forget`] for a whole batch of records, taking each shard's lock once and holding it only
/// while that shard's records are unlinked. The reaper releases records in batches; unlinking them
/// one lock at a time would pass each launcher's shard lock (and its cache line) back and forth
/// with the reaper on every launch.
///
/// Never called on a driver thread.
pub(crate) fn forget_all(
    headers: &[NonNull<RecordHeader>],
    linked: &mut Vec<(usize, NonNull<RecordHeader>)>,
) {
    // The linked records with their shards, grouped by shard. (The records are the caller's: their
    // state does not change meanwhile.) `linked` is the caller's scratch vector.
    linked.clear();
    linked.extend(
        headers
            .iter()
            .filter_map(|&header| Some((linked_shard(header)?, header))),
    );
    linked.sort_unstable_by_key(|&(shard, _)| shard);
    for group in linked.chunk_by(|a, b| a.0 == b.0) {
        let mut list = lock(group[0].0);
        for &(_, header) in group {
            // SAFETY: linked into this shard (see `linked_shard`), whose lock we hold.
            unsafe { unlink(&mut list, header) };
            tracking(header).state.untrack();
        }
    }
}

/// Unlinks every pending (never run) launch of `context` and hands it to the cleanup queue, which
/// drops its owners. Returns how many.
///
/// Launches still inside their launch call are not taken: their launcher releases them if the
/// driver refuses them, and the driver's thread runs them if it accepts them.
///
/// # Safety
/// The driver must no longer be able to run host functions of `context` launched before this
/// call: it has been destroyed (`cuCtxDestroy`) or, for a primary context, reset
/// (`cuDevicePrimaryCtxReset`).
pub(crate) unsafe fn reclaim(context: CUcontext) -> usize {
    let mut reclaimed = Vec::new();
    // Pooled records: a walk over the pool's published slots, under the pool's lock (never with a
    // shard lock held: the reaper takes a shard lock, then may free a slot).
    crate::record_pool::for_each_published(|slot| {
        let header = slot.cast::<RecordHeader>();
        if reclaimable_in(header, context) && tracking(header).state.claim_reclaim() {
            reclaimed.push(header);
        }
    });
    // Boxed records: the lists.
    for shard in 0..SHARDS {
        let mut list = lock(shard);
        let mut node = list.head;
        while let Some(header) = NonNull::new(node) {
            let t = tracking(header);
            // SAFETY: under the shard lock.
            node = unsafe { *t.next.get() };
            // SAFETY: under the shard lock.
            let same_context = unsafe { *t.context.get() } == context.addr();
            if same_context && t.state.claim_reclaim() {
                // SAFETY: linked into this list.
                unsafe { unlink(&mut list, header) };
                reclaimed.push(header);
            }
        }
    }
    // Low-latency completions of the context wait for flags it will never write.
    crate::low_latency::fail_context(context);
    let count = reclaimed.len();
    for header in reclaimed {
        // SAFETY: the reclaim owns the record now (its trampoline will never run) and it is in no
        // queue.
        unsafe { crate::cleanup::push(header) };
    }
    count
}

/// Whether a record in a published pool slot is a pending launch (of any context).
fn is_pending_in_slot(header: NonNull<RecordHeader>) -> bool {
    // Acquire: a pending state read here comes from `track`'s Release store (or a later one),
    // after its context write.
    tracking(header).state.is_pending()
}

/// The context of a record in a published pool slot whose state was seen pending.
fn context_in_slot(header: NonNull<RecordHeader>) -> usize {
    // SAFETY: read only once the state was seen pending, so `track`'s write of it happens before
    // this read; the slot is not overwritten while the walk holds the pool's lock.
    unsafe { *tracking(header).context.get() }
}

/// Whether a record in a published pool slot is a pending launch into `context`.
fn pending_in(header: NonNull<RecordHeader>, context: CUcontext) -> bool {
    is_pending_in_slot(header) && context_in_slot(header) == context.addr()
}

/// Whether a record in a published pool slot is a launch into `context` that a reclaim may take.
fn reclaimable_in(header: NonNull<RecordHeader>, context: CUcontext) -> bool {
    tracking(header).state.is_reclaimable() && context_in_slot(header) == context.addr()
}

/// Records kept for ever: launches that another thread's capture may have taken into a graph (see
/// [`launch_state`](crate::launch_state)). Reachable from here, so that a leak checker does not
/// report them, and counted by [`kept_launches`].
static KEPT: Mutex<Vec<KeptRecord>> = Mutex::new(Vec::new());

/// A record kept for ever.
struct KeptRecord(#[allow(dead_code, reason = "kept reachable, never read")] NonNull<RecordHeader>);

// SAFETY: the pointer is never followed through this list; it only keeps the record reachable.
unsafe impl Send for KeptRecord {}

/// Keeps a launched record for ever: its owners are never dropped.
pub(crate) fn keep_forever(header: NonNull<RecordHeader>) {
    KEPT.lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(KeptRecord(header));
}

/// How many run-once launches of this crate are kept for ever, their owners never dropped, because
/// another thread began a capture of their stream while they were being launched, so the host
/// function may be a node of that capture's graph (run on its first call only; later replays do
/// nothing). A program whose threads do not race captures against launches on the same stream
/// never has any.
pub fn kept_launches() -> usize {
    KEPT.lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .len()
}

/// Launches of this crate whose host function has not run (nor been reclaimed), in `context` or in
/// all contexts. Walks the pool and the lists: a diagnostic, not for hot paths.
pub(crate) fn count(context: Option<CUcontext>) -> usize {
    let mut n = 0;
    crate::record_pool::for_each_published(|slot| {
        let header = slot.cast::<RecordHeader>();
        let here = match context {
            Some(c) => pending_in(header, c),
            None => is_pending_in_slot(header),
        };
        n += usize::from(here);
    });
    for shard in 0..SHARDS {
        let list = lock(shard);
        let mut node = list.head;
        while let Some(header) = NonNull::new(node) {
            let t = tracking(header);
            // SAFETY: under the shard lock.
            let here = context.is_none_or(|c| unsafe { *t.context.get() } == c.addr());
            if here && t.state.is_pending() {
                n += 1;
            }
            // SAFETY: under the shard lock.
            node = unsafe { *t.next.get() };
        }
    }
    n
}

/// How many launches of this crate wait for their host function: in `context`, or in every
/// context (`None`). A launch counts from its enqueue until its host function has run, or until a
/// reclaim after its context was lost.
///
/// It walks every pooled record and the lists of boxed ones: a diagnostic, not for a hot path.
pub fn pending_launches(context: Option<CUcontext>) -> usize {
    count(context)
}

/// Releases, through the cleanup queue, the owners of every launch into `context` whose host
/// function has not run, and returns how many.
///
/// Call it after destroying a context yourself (`cuCtxDestroy`), or resetting a primary context
/// (`cuDevicePrimaryCtxReset`), that may have had a sticky error: the driver then never runs those
/// host functions, and without this their owners would never be dropped. (After a normal destroy
/// the driver has already run them all, and this finds nothing.)
/// [`PrimaryContext::reset`](crate::PrimaryContext::reset) and the last release of a
/// [`PrimaryContext`](crate::PrimaryContext) do it for you.
///
/// A launch still inside its launch call is never taken (its launcher or the driver's thread
/// releases it), so launches racing this call are released exactly once either way.
///
/// # Safety
/// The driver must no longer be able to run host functions of `context` that were launched before
/// this call: it was destroyed or reset, and that call returned. Otherwise a host function could
/// run after its owners were dropped.
pub unsafe fn reclaim_pending(context: CUcontext) -> usize {
    // SAFETY: the caller's promise is `reclaim`'s precondition.
    unsafe { reclaim(context) }
}
