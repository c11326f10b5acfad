//! Memory for small launch records: 128-byte slots handed out in address order from 4 KiB segments.
//!
//! A record is written by the launching thread, read by the driver's thread when its host function
//! runs (often tens of thousands of launches later, so from memory, not cache) and released by the
//! reaper. What that costs depends on the order of the addresses: the floor plus a 128-byte block
//! per launch costs nothing while consecutive launches use consecutive blocks (the hardware
//! prefetchers follow the stream) and as much as our whole gap to the floor when the blocks are
//! scattered (see `benches/HISTORY.md`). So each launching thread takes its slots from a segment of
//! its own, **in address order**, and a segment is reused only once every slot in it is free:
//!
//! - **Segments.** A segment is `SLOT_SIZE * SLOTS` bytes aligned to its size, so a slot's segment
//!   is its address rounded down. Its first slot is its header: the count of slots still owed to
//!   it.
//! - **Allocation** is a bump of the launching thread's index into its current segment (no atomic,
//!   no lock). When the segment is used up, the thread takes a free segment (the pool's lock, held
//!   for a pop, once per [`SEGMENT_SLOTS`]` - 1` launches) or allocates a new one with the lock
//!   let go, then takes it to register the segment: with launches outrunning their releases, 8
//!   threads enqueuing at once waited for each other's allocations under the lock
//!   (`BENCHMARKS.md`, where the time goes).
//! - **Free** is one atomic decrement of the slot's segment's count. The free that brings it to
//!   zero puts the segment on the free list. An exiting thread gives back the slots it never handed
//!   out of its current segment the same way.
//! - **Trimming.** Memory goes back to the system only as whole segments, by [`trim`] (the reaper
//!   calls it before it parks, and [`flush`] after it waits): it frees free segments beyond
//!   [`KEEP_SEGMENTS`].
//! - **A registry.** Every segment is listed from its allocation until [`trim`] frees it.
//!
//! What it costs in memory: a segment is held while any of its slots is in use. Records are
//! released in about the order they were launched, so that is at most a segment per launching
//! thread beyond the records in flight; but a record that stays pending long (a launch behind an
//! event that does not fire) holds its whole segment, up to [`SEGMENT_SLOTS`] times its own size.
//! Graph host nodes' records, which live as long as their graph, are therefore not pooled. (A
//! repeatable launch's record is, since it is made before the capture query; captured, it holds
//! its segment until its graph is gone.)
//!
//! Driver threads never allocate from the pool (records made there are boxed), and neither does a
//! thread whose segment state is already gone (an exiting thread's last launches are boxed).
//!
//! Against the chunked free-list pool this replaced, the bump in address order made owner launches
//! cheaper to enqueue and faster in throughput (`benches/HISTORY.md`, item 28); sorting a
//! free-list pool's slots by address did nothing: only a bump through fresh or wholly free memory
//! makes one forward stream.
//!
//! The pool is a [`RecordPool`]: the library has one, in a `static`, with [`SEGMENT_SLOTS`] slots
//! per segment; the loom models make small ones (a few slots per segment) per execution, and run
//! its own functions.
//!
//! [`flush`]: crate::flush

use std::alloc::Layout;
use std::cell::Cell;
use std::ptr::{self, NonNull};

use crate::support::own_line::OwnLine;
use crate::support::sync::cell::UnsafeCell;
use crate::support::sync::{AtomicUsize, Mutex, MutexGuard, Ordering, lock};

/// The size of a slot: records up to this size are pooled.
pub(crate) const SLOT_SIZE: usize = 128;
/// The alignment a record may ask for and get from a slot (slots are in fact [`SLOT_SIZE`]-aligned).
pub(crate) const SLOT_ALIGN: usize = 16;
/// The library's slots per segment, the header's included: a segment is one 4 KiB page.
pub(crate) const SEGMENT_SLOTS: usize = 32;
/// How many free segments the library's [`trim`] keeps (512 KiB).
pub(crate) const KEEP_SEGMENTS: usize = 128;

/// A segment's first slot: the count of the slots it is owed, and its place in the registry.
#[repr(C, align(128))]
struct SegmentHeader {
    /// Slots of the segment not yet freed: those in use, and those its thread has not handed out
    /// yet. Set when a thread takes the segment; the decrement that brings it to zero frees the
    /// segment.
    owed: AtomicUsize,
    /// Where the segment is in [`Segments::all`]; read and written under the pool's lock only.
    index: UnsafeCell<usize>,
}

const _: () = assert!(size_of::<SegmentHeader>() <= SLOT_SIZE);
const _: () = assert!(SLOT_ALIGN <= SLOT_SIZE);

/// A segment, as the pool's lists hold it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct SegmentPtr(NonNull<SegmentHeader>);

// SAFETY: a segment is plain memory; the lists pass it between threads under their mutex, and
// what its slots hold is the business of whoever holds them.
unsafe impl Send for SegmentPtr {}

/// The pool's segments, behind one lock: taken once per segment (by a launching thread taking one,
/// by the thread whose free emptied one, and by [`trim`]).
struct Segments {
    /// Segments all of whose slots are free, most recently freed last.
    free: Vec<SegmentPtr>,
    /// Every segment allocated and not given back to the system.
    all: Vec<SegmentPtr>,
}

impl Segments {
    /// Takes `segment` out of [`Segments::all`] (it is about to be freed).
    fn unregister(&mut self, segment: NonNull<SegmentHeader>) {
        // SAFETY: a registered segment; its index is only touched under the lock we hold.
        let index = unsafe { (*segment.as_ptr()).index.with(|index| *index) };
        debug_assert!(self.all[index] == SegmentPtr(segment));
        self.all.swap_remove(index);
        if let Some(&SegmentPtr(moved)) = self.all.get(index) {
            // SAFETY: as above, for the segment that took its place.
            unsafe { (*moved.as_ptr()).index.with_mut(|slot| *slot = index) };
        }
    }
}

/// A pool of `SLOTS - 1` slots per segment (the first is the header), which keeps `KEEP` free
/// segments when trimmed.
pub(crate) struct RecordPool<const SLOTS: usize, const KEEP: usize> {
    segments: OwnLine<Mutex<Segments>>,
}

/// A launching thread's state in a pool: its current segment and the index of the next slot it
/// hands out. The library keeps one per thread (a `thread_local!`); a thread that exits gives its
/// unissued slots back ([`RecordPool::thread_exits`]).
pub(crate) struct Local<const SLOTS: usize> {
    segment: Cell<*mut SegmentHeader>,
    next: Cell<usize>,
}

impl<const SLOTS: usize> Local<SLOTS> {
    /// A thread's state before its first allocation.
    pub(crate) const fn new() -> Self {
        Local {
            segment: Cell::new(ptr::null_mut()),
            next: Cell::new(SLOTS),
        }
    }
}

/// A slot handed out by [`RecordPool::allocate`]: its memory, [`SLOT_SIZE`] bytes, uninitialised.
pub(crate) struct PoolSlot {
    pub(crate) memory: NonNull<u8>,
}

impl<const SLOTS: usize, const KEEP: usize> RecordPool<SLOTS, KEEP> {
    /// A segment's size and alignment.
    const SEGMENT_BYTES: usize = SLOT_SIZE * SLOTS;
    const SEGMENT: Layout = match Layout::from_size_align(Self::SEGMENT_BYTES, Self::SEGMENT_BYTES)
    {
        Ok(layout) => layout,
        Err(_) => panic!("a segment's size must be a power of two"),
    };

    /// An empty pool.
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        RecordPool {
            segments: OwnLine(Mutex::new(Segments {
                free: Vec::new(),
                all: Vec::new(),
            })),
        }
    }

    /// An empty pool (loom's mutex is not `const`).
    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        RecordPool {
            segments: OwnLine(Mutex::new(Segments {
                free: Vec::new(),
                all: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Segments> {
        // Nothing panics while the lock is held; if something did, the lists are still consistent.
        lock(&self.segments)
    }

    /// A slot for the thread whose state is `local`: a bump of its index into its current
    /// segment (no atomic, no lock), or its first slot of a segment taken from the free list or
    /// allocated.
    #[inline]
    pub(crate) fn allocate(&self, local: &Local<SLOTS>) -> PoolSlot {
        let next = local.next.get();
        if next == SLOTS {
            return self.next_segment(local);
        }
        local.next.set(next + 1);
        // SAFETY: slot `next` (1..SLOTS) of the thread's current segment, which is set whenever
        // `next` is below SLOTS.
        let memory = unsafe { Self::slot(local.segment.get(), next) };
        PoolSlot { memory }
    }

    /// The thread's segment is used up (or it has none): takes a free segment or allocates one, and
    /// hands out its first slot after the header. The allocation is made with the lock let go (the
    /// lock is held for a pop, or for a push onto the registry): the launching threads take this
    /// lock once per segment, and while launches outrun their releases every take allocates.
    #[cold]
    fn next_segment(&self, local: &Local<SLOTS>) -> PoolSlot {
        // The old segment needs nothing: every slot of it was handed out, and its last free frees
        // it.
        let taken = self.lock().free.pop();
        let segment = match taken {
            // Its last free happened before it was listed, and the lock orders that before the
            // pop, and so before the write below: ours alone now.
            Some(SegmentPtr(segment)) => segment.as_ptr(),
            None => self.allocate_segment(),
        };
        // SAFETY: a fresh segment, or a free one taken off the list (above): ours alone now.
        unsafe { ptr::addr_of_mut!((*segment).owed).write(AtomicUsize::new(SLOTS - 1)) };
        local.segment.set(segment);
        local.next.set(2);
        // SAFETY: slot 1 of the segment just set.
        let memory = unsafe { Self::slot(segment, 1) };
        PoolSlot { memory }
    }

    /// A new segment, allocated with the lock let go, then registered under it.
    #[cold]
    fn allocate_segment(&self) -> *mut SegmentHeader {
        // SAFETY: SEGMENT has a non-zero size.
        let segment = unsafe { std::alloc::alloc(Self::SEGMENT) }.cast::<SegmentHeader>();
        let Some(fresh) = NonNull::new(segment) else {
            std::alloc::handle_alloc_error(Self::SEGMENT);
        };
        let mut segments = self.lock();
        // SAFETY: fresh memory of the segment's layout, not yet registered: ours alone. Its index
        // is written under the lock, as every index is.
        unsafe { ptr::addr_of_mut!((*segment).index).write(UnsafeCell::new(segments.all.len())) };
        segments.all.push(SegmentPtr(fresh));
        segment
    }

    /// Slot `index` of `segment`.
    ///
    /// # Safety
    /// `segment` is a segment of this pool and `index` is below `SLOTS`.
    #[inline]
    unsafe fn slot(segment: *mut SegmentHeader, index: usize) -> NonNull<u8> {
        // SAFETY: inside the segment's allocation, as the caller promises; not null since the
        // segment is not.
        unsafe { NonNull::new_unchecked(segment.cast::<u8>().add(index * SLOT_SIZE)) }
    }

    /// `count` of `segment`'s owed slots are owed no more; the one that brings its count to zero
    /// puts it on the free list.
    ///
    /// # Safety
    /// `count` is not zero; `segment` owes at least `count` slots, and they are not used
    /// afterwards.
    #[inline]
    unsafe fn release(&self, segment: NonNull<SegmentHeader>, count: usize) {
        // AcqRel: every earlier release of a slot of this segment (and the use of that slot)
        // happens before the last one, which then hands the whole segment on.
        // SAFETY: the segment is live while it owes slots.
        let before = unsafe { segment.as_ref() }
            .owed
            .fetch_sub(count, Ordering::AcqRel);
        if before == count {
            self.lock().free.push(SegmentPtr(segment));
        }
    }

    /// Returns a slot to the pool: one atomic decrement of its segment's count.
    ///
    /// # Safety
    /// `slot` must come from this pool's [`RecordPool::allocate`], hold no live value, and not be
    /// used afterwards.
    #[inline]
    pub(crate) unsafe fn free(&self, slot: NonNull<u8>) {
        // The segment a slot lies in: its address rounded down, which is the segment's header.
        let segment = slot
            .as_ptr()
            .map_addr(|a| a & !(Self::SEGMENT_BYTES - 1))
            .cast::<SegmentHeader>();
        // SAFETY: a slot from `allocate` lies in a segment (rounded down: its header), which owes
        // it.
        unsafe { self.release(NonNull::new_unchecked(segment), 1) };
    }

    /// The thread whose state is `local` exits: the slots it has not handed out of its current
    /// segment are owed no more.
    pub(crate) fn thread_exits(&self, local: &Local<SLOTS>) {
        let unissued = SLOTS - local.next.get();
        if let Some(segment) = NonNull::new(local.segment.get())
            && unissued > 0
        {
            local.next.set(SLOTS);
            // SAFETY: the thread's current segment owes these slots, handed out to nobody.
            unsafe { self.release(segment, unissued) };
        }
    }

    /// Gives memory back to the system: frees the free segments beyond `KEEP`. Returns how many it
    /// freed.
    pub(crate) fn trim(&self) -> usize {
        let surplus: Vec<SegmentPtr> = {
            let mut segments = self.lock();
            if segments.free.len() <= KEEP {
                return 0;
            }
            // The oldest first: the most recently freed are the likeliest to be in cache.
            let excess = segments.free.len() - KEEP;
            let surplus: Vec<SegmentPtr> = segments.free.drain(..excess).collect();
            segments.free.shrink_to(2 * KEEP);
            for &SegmentPtr(segment) in &surplus {
                segments.unregister(segment);
            }
            surplus
        };
        for SegmentPtr(segment) in &surplus {
            // SAFETY: allocated with SEGMENT by `next_segment`; every slot of it is free, and it
            // was on the free list and registered, and we took it off both: nobody else can reach
            // it.
            unsafe { std::alloc::dealloc(segment.as_ptr().cast(), Self::SEGMENT) };
        }
        surplus.len()
    }

    /// How many segments are allocated, and how many of them are free (for the models).
    #[cfg(all(test, loom))]
    pub(crate) fn segment_counts(&self) -> (usize, usize) {
        let segments = self.lock();
        (segments.all.len(), segments.free.len())
    }
}

/// The library's pool.
#[cfg(not(loom))]
static POOL: RecordPool<SEGMENT_SLOTS, KEEP_SEGMENTS> = RecordPool::new();

/// A thread's state in the library's pool, given back when the thread exits.
#[cfg(not(loom))]
struct ThreadLocal(Local<SEGMENT_SLOTS>);

#[cfg(not(loom))]
impl Drop for ThreadLocal {
    fn drop(&mut self) {
        POOL.thread_exits(&self.0);
    }
}

#[cfg(not(loom))]
thread_local! {
    static LOCAL: ThreadLocal = const { ThreadLocal(Local::new()) };
}

/// Whether a value of layout `layout` fits a slot.
///
/// With the `unpooled-records` feature (as `scripts/sanitize` builds one of its runs), nothing
/// fits: every record is boxed, so AddressSanitizer sees each release as a `free`.
pub(crate) const fn fits(layout: Layout) -> bool {
    !cfg!(feature = "unpooled-records")
        && layout.size() <= SLOT_SIZE
        && layout.align() <= SLOT_ALIGN
}

/// A slot of the library's pool for this thread; `None` if this thread's pool state is gone (the
/// thread is exiting), or in a forked child, in which case the caller allocates otherwise.
///
/// A forked child's record is built before its launch is refused (`ForkedChild`), and a thread's
/// first record, and one in every 31 after it, takes the pool's lock for a segment: a thread of the parent may
/// have held that lock at the fork, and in the child it is never let go. The allocator the
/// caller falls back on is made safe across a fork by the C library.
#[cfg(not(loom))]
#[inline]
pub(crate) fn allocate() -> Option<PoolSlot> {
    if crate::support::forked_child::is_forked_child() {
        return None;
    }
    LOCAL.try_with(|local| POOL.allocate(&local.0)).ok()
}

/// Returns a slot to the library's pool.
///
/// # Safety
/// `slot` must come from [`allocate`], hold no live value, and not be used afterwards.
#[cfg(not(loom))]
#[inline]
pub(crate) unsafe fn free(slot: NonNull<u8>) {
    // SAFETY: the caller's promise.
    unsafe { POOL.free(slot) }
}

/// Gives the library's pool's surplus memory back to the system (see [`RecordPool::trim`]).
///
/// It runs on the reaper before it parks, or in `flush`; never on a driver thread.
#[cfg(not(loom))]
pub(crate) fn trim() -> usize {
    POOL.trim()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const SEGMENT_BYTES: usize = SLOT_SIZE * SEGMENT_SLOTS;

    /// The pool's state is process-wide: the tests that look at it run one at a time, each on a
    /// thread of its own that has exited (its segment given back) when the test looks.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn on_a_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|scope| scope.spawn(f).join().unwrap())
    }

    fn take(n: usize) -> Vec<usize> {
        (0..n)
            .map(|_| allocate().expect("segment state").memory.as_ptr() as usize)
            .collect()
    }

    fn give_back(slots: &[usize]) {
        for &s in slots {
            // SAFETY: slots from `take`, freed once, never used again.
            unsafe { free(NonNull::new(s as *mut u8).unwrap()) };
        }
    }

    fn segment_of(slot: usize) -> usize {
        slot & !(SEGMENT_BYTES - 1)
    }

    fn free_segments() -> Vec<usize> {
        POOL.lock()
            .free
            .iter()
            .map(|s| s.0.as_ptr() as usize)
            .collect()
    }

    #[test]
    fn slots_come_in_address_order_and_never_twice() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let slots = on_a_thread(|| take(3 * SEGMENT_SLOTS));
        for &s in &slots {
            assert_eq!(s % SLOT_SIZE, 0, "a slot shares a cache line");
            assert_ne!(s % SEGMENT_BYTES, 0, "a segment's header handed out");
        }
        // 31 slots per segment: 96 slots fill three segments and start a fourth, in address order
        // within each.
        let mut jumps = 0;
        for pair in slots.windows(2) {
            if segment_of(pair[0]) == segment_of(pair[1]) {
                assert_eq!(pair[1], pair[0] + SLOT_SIZE, "not in address order");
            } else {
                assert_eq!(
                    pair[0] % SEGMENT_BYTES,
                    SEGMENT_BYTES - SLOT_SIZE,
                    "left early"
                );
                assert_eq!(pair[1] % SEGMENT_BYTES, SLOT_SIZE, "joined late");
                jumps += 1;
            }
        }
        assert_eq!(jumps, 3);
        let mut sorted = slots.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), slots.len(), "a slot handed out twice");
        give_back(&slots);
    }

    #[test]
    fn a_segment_is_free_only_once_every_slot_is() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        on_a_thread(|| {
            // A whole segment's slots; all but one freed on another thread.
            let slots = take(SEGMENT_SLOTS - 1);
            let segment = segment_of(slots[0]);
            assert!(slots.iter().all(|&s| segment_of(s) == segment));
            let (last, others) = slots.split_last().unwrap();
            on_a_thread(|| give_back(others));
            assert!(
                !free_segments().contains(&segment),
                "a segment with a slot in use is on the free list"
            );
            give_back(&[*last]);
            assert_eq!(
                free_segments().last(),
                Some(&segment),
                "the segment is not free after its last slot"
            );
            // The next segment this thread takes is that one (the most recently freed).
            let again = take(1);
            assert_eq!(segment_of(again[0]), segment);
            give_back(&again);
        });
    }

    #[test]
    fn segments_are_reused() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let segments = on_a_thread(|| {
            let mut seen = std::collections::HashSet::new();
            for _ in 0..10 {
                let slots = take(1000);
                seen.extend(slots.iter().map(|&s| segment_of(s)));
                on_a_thread(|| give_back(&slots));
            }
            seen.len()
        });
        // 1,000 slots span 33 segments; ten rounds without reuse would take 323.
        assert!(
            segments <= 40,
            "{segments} segments for 1,000 slots in flight"
        );
    }

    #[test]
    fn an_exiting_thread_gives_its_segment_back_and_trim_frees_the_surplus() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        // A thread uses part of a segment, frees its slots and exits: the slots it never handed out
        // are given back, so its segment is free.
        let segment = on_a_thread(|| {
            let slots = take(5);
            give_back(&slots);
            assert!(!free_segments().contains(&segment_of(slots[0])));
            segment_of(slots[0])
        });
        assert!(
            free_segments().contains(&segment),
            "an exited thread's segment was not given back"
        );
        // Another thread makes many segments free at once; trim keeps KEEP_SEGMENTS of them.
        on_a_thread(|| give_back(&take(2 * KEEP_SEGMENTS * (SEGMENT_SLOTS - 1))));
        let before = free_segments().len();
        assert!(before >= 2 * KEEP_SEGMENTS, "{before} free segments");
        assert_eq!(trim(), before - KEEP_SEGMENTS);
        assert_eq!(free_segments().len(), KEEP_SEGMENTS);
        assert_eq!(trim(), 0, "a second trim found more to free");
        assert_registry_consistent();
        // What is left is still usable.
        on_a_thread(|| give_back(&take(3 * SEGMENT_SLOTS)));
    }

    /// A thread that handed out every slot of its segment owes it nothing when it exits: the
    /// segment, freed by its last slot, is on the free list once. (Mutation testing: with the
    /// exit giving back its zero unissued slots, the release of 0 found the count at 0 and put the
    /// segment on the free list a second time, for two threads to take at once.)
    #[test]
    fn a_thread_that_used_up_its_segment_gives_nothing_back_when_it_exits() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let segment = on_a_thread(|| {
            let slots = take(SEGMENT_SLOTS - 1);
            let segment = segment_of(slots[0]);
            assert!(slots.iter().all(|&s| segment_of(s) == segment));
            give_back(&slots);
            segment
        });
        let free = free_segments();
        assert_eq!(
            free.iter().filter(|&&s| s == segment).count(),
            1,
            "the used-up segment is on the free list once"
        );
        let mut distinct = free.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), free.len(), "a segment free twice");
        assert_registry_consistent();
    }

    /// A record fits a slot up to the slot's size and alignment (nothing fits with the
    /// `unpooled-records` feature). (Mutation testing: with the alignment test reversed, records
    /// aligned more than a slot went to one, and every test passed.)
    #[test]
    fn records_fit_a_slot_up_to_its_size_and_alignment() {
        let pooling = !cfg!(feature = "unpooled-records");
        let largest = Layout::from_size_align(SLOT_SIZE, SLOT_ALIGN).unwrap();
        assert_eq!(fits(largest), pooling);
        assert_eq!(fits(Layout::new::<u8>()), pooling);
        assert!(!fits(Layout::from_size_align(SLOT_SIZE + 1, 8).unwrap()));
        assert!(!fits(Layout::from_size_align(16, 2 * SLOT_ALIGN).unwrap()));
    }

    /// Every registered segment knows its place in the registry, once, and every free segment is
    /// registered.
    fn assert_registry_consistent() {
        let segments = POOL.lock();
        for (i, &SegmentPtr(segment)) in segments.all.iter().enumerate() {
            // SAFETY: a registered segment; we hold the lock.
            assert_eq!(unsafe { (*segment.as_ptr()).index.with(|index| *index) }, i);
        }
        for free in &segments.free {
            assert!(segments.all.contains(free), "a free segment not registered");
        }
    }
}
