//! Memory for small launch records: 128-byte slots handed out in address order from 4 KiB segments.
//!
//! A record is written by the launching thread, read by the driver's thread when its host function
//! runs (often tens of thousands of launches later, so from memory, not cache) and released by the
//! reaper. What that costs depends on the order of the addresses: the floor plus a 128-byte block
//! per launch costs nothing while consecutive launches use consecutive blocks (the hardware
//! prefetchers follow the stream) and as much as our whole gap to the floor when the blocks are
//! scattered (`benches/HISTORY.md`, "Where the rest goes"). So each launching thread takes its
//! slots from a segment of its own, **in address order**, and a segment is reused only once every
//! slot in it is free:
//!
//! - **Segments.** A segment is [`SEGMENT_BYTES`] aligned to its size, so a slot's segment is its
//!   address rounded down. Its first slot is its header: the count of slots still owed to it.
//! - **Allocation** is a bump of the launching thread's index into its current segment (no atomic,
//!   no lock). When the segment is used up, the thread takes a free segment (one uncontended lock,
//!   once per [`SEGMENT_SLOTS`]` - 1` launches) or allocates a new one.
//! - **Free** is one atomic decrement of the slot's segment's count. The free that brings it to
//!   zero puts the segment on the free list. An exiting thread gives back the slots it never handed
//!   out of its current segment the same way.
//! - **Trimming.** Memory goes back to the system only as whole segments, by [`trim`] (the reaper
//!   calls it before it parks, and [`flush`] after it waits): it frees free segments beyond
//!   [`KEEP_SEGMENTS`].
//! - **A walk.** Every segment is registered from its allocation until [`trim`] frees it, and its
//!   header can count how many of its slots hold a record written in full (`PoolSlot::publish`,
//!   one plain store), which a walk under the pool's lock reads (`for_each_published`). Reclaims
//!   no longer walk the pool (they walk the launches' tickets: `tickets.rs`), so launches do not
//!   publish; the walk and the count remain for the pool's tests and models only.
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
//! Measured on the H200 (`tools/ab-bench`, against the chunked free-list pool this replaced, three
//! processes of nine paired repetitions; `benches/HISTORY.md`, item 28): owner launches at
//! 0.93–0.94 of its enqueue cost and 1.02–1.04 of its throughput on one stream, 0.91–0.97 and
//! 1.02–1.06 on four.
//! Sorting the free-list pool's slots by address did nothing (item 29): only a bump through fresh
//! or wholly free memory makes one forward stream.
//!
//! [`flush`]: crate::flush

use std::alloc::Layout;
use std::cell::{Cell, UnsafeCell};
use std::ptr::{self, NonNull};
use std::sync::Mutex;

use crate::support::own_line::OwnLine;
use crate::support::sync::{AtomicUsize, Ordering};

/// The size of a slot: records up to this size are pooled.
pub(crate) const SLOT_SIZE: usize = 128;
/// The alignment a record may ask for and get from a slot (slots are in fact [`SLOT_SIZE`]-aligned).
pub(crate) const SLOT_ALIGN: usize = 16;
/// Slots per segment, the header's included: a segment is one 4 KiB page.
const SEGMENT_SLOTS: usize = 32;
/// A segment's size and alignment.
const SEGMENT_BYTES: usize = SLOT_SIZE * SEGMENT_SLOTS;
/// How many free segments [`trim`] keeps (512 KiB).
const KEEP_SEGMENTS: usize = 128;

const SEGMENT: Layout = match Layout::from_size_align(SEGMENT_BYTES, SEGMENT_BYTES) {
    Ok(layout) => layout,
    Err(_) => panic!("a valid segment layout"),
};

/// A segment's first slot: a line for the threads that free its slots, and a line for the thread
/// that hands them out.
#[repr(C, align(128))]
struct SegmentHeader {
    /// Slots of the segment not yet freed: those in use, and those its thread has not handed out
    /// yet. Set when a thread takes the segment; the decrement that brings it to zero frees the
    /// segment.
    owed: AtomicUsize,
    /// Where the segment is in [`Segments::all`]; read and written under the pool's lock only.
    index: UnsafeCell<usize>,
    /// Slots `1..published` hold a record written in full. Set to 0 under the pool's lock when a
    /// thread takes the segment, then stored (Release) by that thread after it writes each record
    /// ([`PoolSlot::publish`]); read (Acquire) by [`for_each_published`], under the lock.
    published: Line<AtomicUsize>,
}

/// A value on a cache line of its own within a segment's header.
#[repr(C, align(64))]
struct Line<T>(T);

const _: () = assert!(size_of::<SegmentHeader>() == SLOT_SIZE);
const _: () = assert!(SLOT_ALIGN <= SLOT_SIZE && SEGMENT_BYTES.is_power_of_two());

/// A segment, as the pool's lists hold it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct SegmentPtr(NonNull<SegmentHeader>);

// SAFETY: a segment is plain memory; the lists pass it between threads under their mutex, and
// what its slots hold is the business of whoever holds them.
unsafe impl Send for SegmentPtr {}

/// The pool's segments, behind one lock: taken once per segment (by a launching thread taking one,
/// by the thread whose free emptied one, and by [`trim`]) and by a reclaim's walk.
struct Segments {
    /// Segments all of whose slots are free, most recently freed last.
    free: Vec<SegmentPtr>,
    /// Every segment allocated and not given back to the system, so that a reclaim can find the
    /// records of a lost context in them ([`for_each_published`]).
    all: Vec<SegmentPtr>,
}

impl Segments {
    /// Takes `segment` out of [`Segments::all`] (it is about to be freed).
    fn unregister(&mut self, segment: NonNull<SegmentHeader>) {
        // SAFETY: a registered segment; its index is only touched under the lock we hold.
        let index = unsafe { *(*segment.as_ptr()).index.get() };
        debug_assert!(self.all[index] == SegmentPtr(segment));
        self.all.swap_remove(index);
        if let Some(&SegmentPtr(moved)) = self.all.get(index) {
            // SAFETY: as above, for the segment that took its place.
            unsafe { *(*moved.as_ptr()).index.get() = index };
        }
    }
}

static SEGMENTS: OwnLine<Mutex<Segments>> = OwnLine(Mutex::new(Segments {
    free: Vec::new(),
    all: Vec::new(),
}));

fn segments() -> std::sync::MutexGuard<'static, Segments> {
    // Nothing panics while the lock is held; if something did, the lists are still consistent.
    SEGMENTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A launching thread's current segment and the index of the next slot it hands out.
struct Local {
    segment: Cell<*mut SegmentHeader>,
    next: Cell<usize>,
}

impl Drop for Local {
    fn drop(&mut self) {
        // The thread is exiting: the slots it has not handed out are owed no more.
        let unissued = SEGMENT_SLOTS - self.next.get();
        if let Some(segment) = NonNull::new(self.segment.get())
            && unissued > 0
        {
            // SAFETY: the thread's current segment owes these slots, handed out to nobody.
            unsafe { release(segment, unissued) };
        }
    }
}

thread_local! {
    static LOCAL: Local = const {
        Local { segment: Cell::new(ptr::null_mut()), next: Cell::new(SEGMENT_SLOTS) }
    };
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

/// A slot handed out by [`allocate`]: its memory, and where it is in its segment.
pub(crate) struct PoolSlot {
    /// The slot's [`SLOT_SIZE`] bytes, uninitialised.
    pub(crate) memory: NonNull<u8>,
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "read by `publish`, which only tests use")
    )]
    segment: *mut SegmentHeader,
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "read by `publish`, which only tests use")
    )]
    index: usize,
}

impl PoolSlot {
    #[cfg(test)]
    /// Marks the slot as holding a record written in full, so that [`for_each_published`] may read
    /// it: one plain store, on a line of its segment's header that only this thread writes.
    ///
    /// # Safety
    /// A record must have been written into the slot, and no later slot of this thread's handed
    /// out yet (slots are published in the order they are handed out).
    #[inline]
    pub(crate) unsafe fn publish(self) {
        // Release: the record's contents are written before a walk that sees this value reads
        // them.
        // SAFETY: the slot's segment is this thread's current one, live while it owes slots.
        unsafe {
            (*self.segment)
                .published
                .0
                .store(self.index + 1, Ordering::Release)
        };
    }
}

/// A slot of [`SLOT_SIZE`] bytes; `None` if this thread's segment state is gone (the thread is
/// exiting), in which case the caller allocates otherwise.
#[inline]
pub(crate) fn allocate() -> Option<PoolSlot> {
    LOCAL
        .try_with(|local| {
            let next = local.next.get();
            if next == SEGMENT_SLOTS {
                return next_segment(local);
            }
            local.next.set(next + 1);
            // SAFETY: slot `next` (1..SEGMENT_SLOTS) of the thread's current segment, which is set
            // whenever `next` is below SEGMENT_SLOTS.
            unsafe { handed_out(local.segment.get(), next) }
        })
        .ok()
}

/// Slot `index` of `segment`, as [`allocate`] hands it out.
///
/// # Safety
/// As [`slot`].
#[inline]
unsafe fn handed_out(segment: *mut SegmentHeader, index: usize) -> PoolSlot {
    PoolSlot {
        // SAFETY: as the caller promises.
        memory: unsafe { slot(segment, index) },
        segment,
        index,
    }
}

/// The thread's segment is used up (or it has none): takes a free segment or allocates one, and
/// hands out its first slot after the header.
#[cold]
fn next_segment(local: &Local) -> PoolSlot {
    // The old segment needs nothing: every slot of it was handed out, and its last free frees it.
    let segment = {
        let mut segments = segments();
        let segment = match segments.free.pop() {
            Some(SegmentPtr(segment)) => segment.as_ptr(),
            None => {
                // SAFETY: SEGMENT has a non-zero size.
                let segment = unsafe { std::alloc::alloc(SEGMENT) }.cast::<SegmentHeader>();
                let Some(fresh) = NonNull::new(segment) else {
                    std::alloc::handle_alloc_error(SEGMENT);
                };
                // SAFETY: fresh memory of the segment's layout, not yet registered: ours alone.
                unsafe {
                    ptr::addr_of_mut!((*segment).index).write(UnsafeCell::new(segments.all.len()))
                };
                segments.all.push(SegmentPtr(fresh));
                segment
            }
        };
        // SAFETY: a fresh segment, or a free one taken off the list (its last free happened before
        // it was listed, and the lock orders that before these writes); ours alone now, but for a
        // reclaim's walk, which reads `published` under this same lock: written here, before the
        // lock is released and before this thread writes any slot, the walk sees none of the
        // segment's old records as published once the thread starts overwriting them.
        unsafe {
            ptr::addr_of_mut!((*segment).owed).write(AtomicUsize::new(SEGMENT_SLOTS - 1));
            ptr::addr_of_mut!((*segment).published).write(Line(AtomicUsize::new(0)));
        }
        segment
    };
    local.segment.set(segment);
    local.next.set(2);
    // SAFETY: slot 1 of the segment just set.
    unsafe { handed_out(segment, 1) }
}

/// Slot `index` of `segment`.
///
/// # Safety
/// `segment` is a segment and `index` is below [`SEGMENT_SLOTS`].
unsafe fn slot(segment: *mut SegmentHeader, index: usize) -> NonNull<u8> {
    // SAFETY: inside the segment's allocation, as the caller promises; not null since the segment
    // is not.
    unsafe { NonNull::new_unchecked(segment.cast::<u8>().add(index * SLOT_SIZE)) }
}

/// `count` of `segment`'s owed slots are owed no more; the one that brings its count to zero puts
/// it on the free list.
///
/// # Safety
/// `count` is not zero; `segment` owes at least `count` slots, and they are not used afterwards.
unsafe fn release(segment: NonNull<SegmentHeader>, count: usize) {
    // AcqRel: every earlier release of a slot of this segment (and the use of that slot) happens
    // before the last one, which then hands the whole segment on.
    // SAFETY: the segment is live while it owes slots.
    let before = unsafe { segment.as_ref() }
        .owed
        .fetch_sub(count, Ordering::AcqRel);
    if before == count {
        segments().free.push(SegmentPtr(segment));
    }
}

/// The segment a slot lies in: its address rounded down, which is the segment's header.
fn segment_of(slot: NonNull<u8>) -> *mut SegmentHeader {
    slot.as_ptr()
        .map_addr(|a| a & !(SEGMENT_BYTES - 1))
        .cast::<SegmentHeader>()
}

/// Returns a slot to the pool.
///
/// # Safety
/// `slot` must come from [`allocate`], hold no live value, and not be used afterwards.
#[inline]
pub(crate) unsafe fn free(slot: NonNull<u8>) {
    // SAFETY: a slot from `allocate` lies in a segment (rounded down: its header), which owes it.
    unsafe { release(NonNull::new_unchecked(segment_of(slot)), 1) };
}

#[cfg(test)]
/// Calls `f` with every slot of the pool that holds, or held, a record written in full, in every
/// segment not given back to the system. A reclaim after a context loss finds the pooled records of
/// the lost context this way: they are not linked anywhere (see `pending.rs`).
///
/// It holds the pool's lock throughout, so no segment is taken, reused or freed meanwhile: a slot
/// passed to `f` is not overwritten until the walk is over, though it may be in use (its record
/// pending, running or being released) or released already. `f` must not allocate from or free to
/// the pool (it would wait for the lock it runs under). A walk over all the pool's memory: for rare
/// events, never for a hot path.
pub(crate) fn for_each_published(mut f: impl FnMut(NonNull<u8>)) {
    let segments = segments();
    for &SegmentPtr(segment) in &segments.all {
        let segment = segment.as_ptr();
        // Acquire: the records of the slots below this value were written before it was stored.
        // SAFETY: a registered segment, live while the lock is held.
        let published = unsafe { (*segment).published.0.load(Ordering::Acquire) };
        for index in 1..published {
            // SAFETY: `index` is below SEGMENT_SLOTS (published never exceeds it).
            f(unsafe { slot(segment, index) });
        }
    }
}

/// Gives memory back to the system: frees the free segments beyond [`KEEP_SEGMENTS`]. Returns how
/// many it freed.
///
/// It runs on the reaper before it parks, or in `flush`; never on a driver thread.
pub(crate) fn trim() -> usize {
    let surplus: Vec<SegmentPtr> = {
        let mut segments = segments();
        if segments.free.len() <= KEEP_SEGMENTS {
            return 0;
        }
        // The oldest first: the most recently freed are the likeliest to be in cache.
        let excess = segments.free.len() - KEEP_SEGMENTS;
        let surplus: Vec<SegmentPtr> = segments.free.drain(..excess).collect();
        segments.free.shrink_to(2 * KEEP_SEGMENTS);
        for &SegmentPtr(segment) in &surplus {
            segments.unregister(segment);
        }
        surplus
    };
    for SegmentPtr(segment) in &surplus {
        // SAFETY: allocated with SEGMENT by `next_segment`; every slot of it is free, and it was on
        // the free list and registered, and we took it off both: nobody else can reach it.
        unsafe { std::alloc::dealloc(segment.as_ptr().cast(), SEGMENT) };
    }
    surplus.len()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

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
        segments()
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

    /// Every registered segment knows its place in the registry, once, and every free segment is
    /// registered.
    fn assert_registry_consistent() {
        let segments = segments();
        for (i, &SegmentPtr(segment)) in segments.all.iter().enumerate() {
            // SAFETY: a registered segment; we hold the lock.
            assert_eq!(unsafe { *(*segment.as_ptr()).index.get() }, i);
        }
        for free in &segments.free {
            assert!(segments.all.contains(free), "a free segment not registered");
        }
    }

    #[test]
    fn a_walk_sees_the_published_slots_and_no_slot_after_them() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        on_a_thread(|| {
            // 40 slots over two segments: the first 35 written and published, one at a time, as
            // `place` does; the last 5 handed out but not published.
            let mut published = Vec::new();
            let mut unpublished = Vec::new();
            for i in 0..40 {
                let slot = allocate().expect("segment state");
                let address = slot.memory.as_ptr() as usize;
                if i < 35 {
                    // SAFETY: this thread's latest slot (the test writes no record into it; the
                    // walk below only collects addresses).
                    unsafe { slot.publish() };
                    published.push(address);
                } else {
                    unpublished.push(address);
                }
            }
            let mut walked = std::collections::HashSet::new();
            for_each_published(|slot| {
                walked.insert(slot.as_ptr() as usize);
            });
            assert!(
                published.iter().all(|s| walked.contains(s)),
                "a published slot missed"
            );
            assert!(
                unpublished.iter().all(|s| !walked.contains(s)),
                "a slot walked before it was published"
            );
            assert_registry_consistent();
            give_back(&published);
            give_back(&unpublished);
        });
    }
}
