//! Memory for small launch records: 128-byte slots carved from 4 KiB chunks.
//!
//! A record is allocated by the launching thread and freed by the reaper. Through the system
//! allocator that pattern makes the launcher's allocations miss its thread cache and share the
//! launcher's heap arena (and its cache lines) with the driver, which allocates three blocks per
//! `cuLaunchHostFunc` on the launching thread and frees them on its own thread. Measured on the
//! H200 (`tools/malloc-count`; `BENCHMARKS.md`, item 25): with records from the system allocator
//! whenever the pool ran dry and back to it beyond a bound, owner launches on one stream ran at
//! 0.82–0.86 of the raw call's throughput; with slots from chunks of their own, 0.89–0.93, in the
//! same processes (six processes). So small records (at most
//! [`SLOT_SIZE`] bytes: the raw launch with a small owner, closures with small captures) never
//! touch the system allocator once the pool has grown to the number of such launches in flight:
//!
//! - **Chunks.** The pool grows by a chunk of [`CHUNK_SLOTS`] slots, aligned to its size, so each
//!   slot has two cache lines of its own and a slot's chunk is its address rounded down.
//! - **A thread-local cache** of free slots that only its thread touches (no atomics).
//! - **A global lock-free stack** ([`IntrusiveStack`]) that releasing threads push freed slots
//!   onto. A launcher whose cache is empty takes the whole stack (one `swap`, so there is no ABA
//!   problem), keeps at most [`LOCAL_MAX`] slots and gives the rest back in one step. An exiting
//!   thread gives its cache back the same way.
//! - **Trimming.** A freed slot always goes back to the pool; memory goes back to the system in
//!   whole chunks, by [`trim`] (the reaper calls it before it parks, and [`flush`] after it waits):
//!   while more than [`KEEP`] free slots wait in the global stack, chunks all of whose slots are
//!   there are freed. So after a burst, the pool keeps [`KEEP`] free slots, the slots in launchers'
//!   caches (at most [`LOCAL_MAX`] each) and the chunks that still hold a record in flight.
//!
//! Driver threads never allocate from the pool (records made there are boxed), and neither does a
//! thread whose cache is already gone (an exiting thread's last launches are boxed).
//!
//! [`flush`]: crate::flush

use std::alloc::Layout;
use std::cell::Cell;
use std::ptr::{self, NonNull};

use crate::intrusive_stack::{IntrusiveStack, Linked};
use crate::own_line::OwnLine;
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// The size of a slot: records up to this size are pooled.
pub(crate) const SLOT_SIZE: usize = 128;
/// The alignment a record may ask for and get from a slot (slots are in fact [`SLOT_SIZE`]-aligned).
pub(crate) const SLOT_ALIGN: usize = 16;
/// Slots per chunk: a chunk is one 4 KiB page.
const CHUNK_SLOTS: usize = 32;
/// A chunk's size and alignment.
const CHUNK_BYTES: usize = SLOT_SIZE * CHUNK_SLOTS;
/// The most free slots a launching thread's cache takes from the global stack at once.
const LOCAL_MAX: usize = 1024;
/// How many free slots [`trim`] leaves in the global stack (512 KiB).
const KEEP: usize = 4096;

const CHUNK: Layout = match Layout::from_size_align(CHUNK_BYTES, CHUNK_BYTES) {
    Ok(layout) => layout,
    Err(_) => panic!("a valid chunk layout"),
};

/// A free slot: its first word links it into a free list.
#[repr(C, align(128))]
pub(crate) struct FreeSlot {
    next: AtomicPtr<FreeSlot>,
    _rest: [u8; SLOT_SIZE - size_of::<usize>()],
}

const _: () = assert!(size_of::<FreeSlot>() == SLOT_SIZE && align_of::<FreeSlot>() == SLOT_SIZE);
const _: () = assert!(SLOT_ALIGN <= SLOT_SIZE && CHUNK_BYTES.is_power_of_two());

// SAFETY: `link` always returns `next`, which only the intrusive stack writes while the slot is in
// it.
unsafe impl Linked for FreeSlot {
    fn link(&self) -> &AtomicPtr<Self> {
        &self.next
    }
}

/// Slots freed by other threads (the reaper, on every release), and about how many: on lines of
/// their own, away from anything a launching thread touches on every launch.
struct Global {
    stack: IntrusiveStack<FreeSlot>,
    /// Counted before a slot is pushed and after it is taken, so it is never below the stack's
    /// length (see `record_pool_chunks` in `loom_models.rs`).
    count: AtomicUsize,
}

static GLOBAL: OwnLine<Global> = OwnLine(Global {
    stack: IntrusiveStack::new(),
    count: AtomicUsize::new(0),
});

/// This thread's free slots, a plain singly linked list through each slot's first word.
struct LocalCache {
    head: Cell<*mut FreeSlot>,
}

impl LocalCache {
    fn push(&self, slot: NonNull<FreeSlot>) {
        // SAFETY: a free slot now owned by this list; its first word is the link.
        unsafe { ptr::addr_of_mut!((*slot.as_ptr()).next).write(AtomicPtr::new(self.head.get())) };
        self.head.set(slot.as_ptr());
    }

    fn pop(&self) -> Option<NonNull<FreeSlot>> {
        let slot = NonNull::new(self.head.get())?;
        // SAFETY: slots in the local list are free and owned by it.
        self.head
            .set(unsafe { slot.as_ref() }.next.load(Ordering::Relaxed));
        Some(slot)
    }
}

impl Drop for LocalCache {
    fn drop(&mut self) {
        // The thread is exiting: its cached slots go back to the global stack (a slot's memory
        // belongs to its chunk, which only `trim` frees).
        let Some(first) = NonNull::new(self.head.get()) else {
            return;
        };
        let (mut last, mut count) = (first, 1);
        // SAFETY: slots in the local list are free and owned by it.
        while let Some(next) = NonNull::new(unsafe { last.as_ref() }.next.load(Ordering::Relaxed)) {
            (last, count) = (next, count + 1);
        }
        GLOBAL.count.fetch_add(count, Ordering::Relaxed);
        // SAFETY: the list from `first` to `last` is ours, and in no stack.
        unsafe { GLOBAL.stack.push_chain(first, last) };
    }
}

thread_local! {
    static LOCAL: LocalCache = const { LocalCache { head: Cell::new(ptr::null_mut()) } };
}

/// Whether a value of layout `layout` fits a slot.
///
/// Built with `--cfg cuda_host_launch_unpooled` (as `scripts/sanitize` does), nothing fits: every
/// record is boxed, so AddressSanitizer sees each release as a `free`.
pub(crate) const fn fits(layout: Layout) -> bool {
    !cfg!(cuda_host_launch_unpooled) && layout.size() <= SLOT_SIZE && layout.align() <= SLOT_ALIGN
}

/// A slot of [`SLOT_SIZE`] bytes, uninitialised; `None` if this thread's cache is gone (the thread
/// is exiting), in which case the caller allocates otherwise.
#[inline]
pub(crate) fn allocate() -> Option<NonNull<u8>> {
    LOCAL
        .try_with(|cache| cache.pop().unwrap_or_else(|| refill(cache)).cast())
        .ok()
}

/// The cache is empty: takes up to [`LOCAL_MAX`] slots others freed, or carves a new chunk. Returns
/// one slot and caches the rest.
#[cold]
fn refill(cache: &LocalCache) -> NonNull<FreeSlot> {
    let Some(first) = NonNull::new(GLOBAL.stack.take_chain()) else {
        return new_chunk(cache);
    };
    // Keep the chain's first LOCAL_MAX slots as they are linked (newest first: the most recently
    // freed, likeliest in cache, come out first) and cut it there.
    let (mut last, mut taken) = (first, 1);
    while taken < LOCAL_MAX {
        // SAFETY: a taken chain's slots are free and ours.
        let Some(next) = NonNull::new(unsafe { last.as_ref() }.next.load(Ordering::Relaxed)) else {
            break;
        };
        (last, taken) = (next, taken + 1);
    }
    // SAFETY: as above.
    let last = unsafe { last.as_ref() };
    let rest = last.next.load(Ordering::Relaxed);
    last.next.store(ptr::null_mut(), Ordering::Relaxed);
    // SAFETY: as above; the cache is empty, and takes the slots after `first` up to `last`.
    cache
        .head
        .set(unsafe { first.as_ref() }.next.load(Ordering::Relaxed));
    // Give the rest back without walking it: possible while the stack is empty; if others pushed
    // meanwhile, take those few into the cache and try again.
    while let Some(chain) = NonNull::new(rest) {
        // SAFETY: the chain from `chain` to its null end is ours, and in no stack.
        if unsafe { GLOBAL.stack.push_chain_if_empty(chain) } {
            break;
        }
        let mut newcomer = GLOBAL.stack.take_chain();
        while let Some(slot) = NonNull::new(newcomer) {
            // SAFETY: as above, for the newcomers' chain.
            newcomer = unsafe { slot.as_ref() }.next.load(Ordering::Relaxed);
            cache.push(slot);
            taken += 1;
        }
    }
    GLOBAL.count.fetch_sub(taken, Ordering::Relaxed);
    first
}

/// A new chunk: returns its first slot and caches the others.
fn new_chunk(cache: &LocalCache) -> NonNull<FreeSlot> {
    // SAFETY: CHUNK has a non-zero size.
    let chunk = unsafe { std::alloc::alloc(CHUNK) }.cast::<FreeSlot>();
    let Some(chunk) = NonNull::new(chunk) else {
        std::alloc::handle_alloc_error(CHUNK)
    };
    // Cached last to first, so the slots come out in address order.
    for i in (1..CHUNK_SLOTS).rev() {
        // SAFETY: slot i of the chunk, inside its allocation.
        cache.push(unsafe { chunk.add(i) });
    }
    chunk
}

/// Returns a slot to the pool.
///
/// # Safety
/// `slot` must come from [`allocate`], hold no live value, and not be used afterwards.
#[inline]
pub(crate) unsafe fn free(slot: NonNull<u8>) {
    GLOBAL.count.fetch_add(1, Ordering::Relaxed);
    let slot = slot.cast::<FreeSlot>();
    // SAFETY: the slot is free memory of FreeSlot's size and alignment; its first word becomes the
    // link (an AtomicPtr is valid for any bit pattern once written).
    unsafe {
        ptr::addr_of_mut!((*slot.as_ptr()).next).write(AtomicPtr::new(ptr::null_mut()));
        GLOBAL.stack.push(slot);
    }
}

/// Gives memory back to the system: while more than [`KEEP`] free slots wait in the global stack,
/// frees the chunks all of whose slots are there. Returns how many chunks it freed.
///
/// Cheap when there is nothing to do (one load). Otherwise it allocates and sorts (it runs on the
/// reaper before it parks, or in `flush`; never on a driver thread). Launchers that find the stack
/// empty meanwhile grow the pool by a chunk; nothing is lost.
pub(crate) fn trim() -> usize {
    if GLOBAL.count.load(Ordering::Relaxed) <= KEEP {
        return 0;
    }
    let mut slots = Vec::new();
    let mut node = GLOBAL.stack.take_chain();
    while let Some(slot) = NonNull::new(node) {
        // SAFETY: a taken chain's slots are free and ours.
        node = unsafe { slot.as_ref() }.next.load(Ordering::Relaxed);
        slots.push(slot);
    }
    slots.sort_unstable();
    let mut left = slots.len();
    let mut freed = 0;
    let mut kept: Option<(NonNull<FreeSlot>, NonNull<FreeSlot>)> = None;
    for group in slots.chunk_by(|a, b| chunk_of(*a) == chunk_of(*b)) {
        if group.len() == CHUNK_SLOTS && left - CHUNK_SLOTS >= KEEP {
            // Every slot of the chunk is here, so none is in use or cached anywhere else.
            // SAFETY: the chunk was allocated with CHUNK by `new_chunk` (its first slot is its
            // start) and none of its slots is used any more.
            unsafe { std::alloc::dealloc(group[0].as_ptr().cast(), CHUNK) };
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
        unsafe { GLOBAL.stack.push_chain(first, last) };
    }
    GLOBAL
        .count
        .fetch_sub(freed * CHUNK_SLOTS, Ordering::Relaxed);
    freed
}

/// The chunk a slot belongs to: its address rounded down to the chunk's alignment.
fn chunk_of(slot: NonNull<FreeSlot>) -> usize {
    slot.as_ptr() as usize & !(CHUNK_BYTES - 1)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The pool's state is process-wide: the tests that look at it run one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn take(n: usize) -> Vec<usize> {
        (0..n)
            .map(|_| allocate().expect("a cache").as_ptr() as usize)
            .collect()
    }

    fn give_back(slots: &[usize]) {
        for &s in slots {
            // SAFETY: slots from `take`, freed once, never used again.
            unsafe { free(NonNull::new(s as *mut u8).unwrap()) };
        }
    }

    #[test]
    fn slots_are_aligned_distinct_and_reused_across_threads() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let slots = take(100);
        for &s in &slots {
            assert_eq!(s % SLOT_SIZE, 0, "a slot shares a cache line");
        }
        let mut sorted = slots.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 100, "a slot handed out twice");
        std::thread::scope(|scope| {
            scope.spawn(|| give_back(&slots));
        });
        // Drain this thread's cache, then the next allocations come from the global stack, where
        // the other thread's frees are the newest, unless a thread of an earlier test exited
        // meanwhile and pushed its cache (at most LOCAL_MAX + CHUNK_SLOTS slots) on top: take
        // enough to get past that.
        let mut cached = Vec::new();
        LOCAL.with(|cache| {
            while let Some(slot) = cache.pop() {
                cached.push(slot.as_ptr() as usize);
            }
        });
        let again = take(3 * LOCAL_MAX);
        let reused = again.iter().filter(|s| slots.contains(s)).count();
        assert_eq!(reused, 100, "only {reused} of 100 freed slots came back");
        give_back(&again);
        give_back(&cached);
    }

    #[test]
    fn an_exiting_thread_gives_its_cache_back_and_trim_frees_whole_chunks() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        trim();
        let before = GLOBAL.count.load(Ordering::Relaxed);
        // Another thread allocates (and caches) 10,000 slots' worth of chunks, frees them, exits.
        let n = 10_000;
        std::thread::spawn(move || give_back(&take(n)))
            .join()
            .unwrap();
        let after_exit = GLOBAL.count.load(Ordering::Relaxed);
        assert!(
            after_exit >= n,
            "the exiting thread's slots did not come back: {before} before, {after_exit} after"
        );
        let freed = trim();
        let left = GLOBAL.count.load(Ordering::Relaxed);
        // Slots that were in the pool before may share chunks with slots elsewhere; the thread's
        // own chunks are whole again.
        assert!(
            freed * CHUNK_SLOTS + KEEP + CHUNK_SLOTS + before >= n,
            "freed only {freed} chunks"
        );
        assert!(left >= KEEP, "trimmed below KEEP: {left}");
        assert!(
            left < KEEP + CHUNK_SLOTS + before,
            "{left} slots left after a trim"
        );
        // What is left is still usable.
        let slots = take(LOCAL_MAX + 10);
        give_back(&slots);
    }
}
