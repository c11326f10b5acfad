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
use std::cell::Cell;
use std::ptr::{self, NonNull};
use std::sync::Mutex;

use crate::own_line::OwnLine;
use crate::sync::{AtomicUsize, Ordering};

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

/// A segment's first slot.
#[repr(C, align(128))]
struct SegmentHeader {
    /// Slots of the segment not yet freed: those in use, and those its thread has not handed out
    /// yet. Set when a thread takes the segment; the decrement that brings it to zero frees the
    /// segment.
    owed: AtomicUsize,
}

const _: () = assert!(size_of::<SegmentHeader>() == SLOT_SIZE);
const _: () = assert!(SLOT_ALIGN <= SLOT_SIZE && SEGMENT_BYTES.is_power_of_two());

/// A free segment, on the free list.
struct FreeSegment(NonNull<SegmentHeader>);

// SAFETY: a free segment is plain memory that nobody uses; the list passes it between threads
// under its mutex.
unsafe impl Send for FreeSegment {}

/// Segments all of whose slots are free, most recently freed last. Locked once per segment: by a
/// launching thread taking one, by the thread whose free emptied one, and by [`trim`].
static FREE: OwnLine<Mutex<Vec<FreeSegment>>> = OwnLine(Mutex::new(Vec::new()));

fn free_list() -> std::sync::MutexGuard<'static, Vec<FreeSegment>> {
    // Nothing panics while the lock is held; if something did, the list is still consistent.
    FREE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
/// Built with `--cfg cuda_host_launch_unpooled` (as `scripts/sanitize` does), nothing fits: every
/// record is boxed, so AddressSanitizer sees each release as a `free`.
pub(crate) const fn fits(layout: Layout) -> bool {
    !cfg!(cuda_host_launch_unpooled) && layout.size() <= SLOT_SIZE && layout.align() <= SLOT_ALIGN
}

/// A slot of [`SLOT_SIZE`] bytes, uninitialised; `None` if this thread's segment state is gone (the
/// thread is exiting), in which case the caller allocates otherwise.
#[inline]
pub(crate) fn allocate() -> Option<NonNull<u8>> {
    LOCAL
        .try_with(|local| {
            let next = local.next.get();
            if next == SEGMENT_SLOTS {
                return next_segment(local);
            }
            local.next.set(next + 1);
            // SAFETY: slot `next` (1..SEGMENT_SLOTS) of the thread's current segment, which is set
            // whenever `next` is below SEGMENT_SLOTS.
            unsafe { slot(local.segment.get(), next) }
        })
        .ok()
}

/// The thread's segment is used up (or it has none): takes a free segment or allocates one, and
/// hands out its first slot after the header.
#[cold]
fn next_segment(local: &Local) -> NonNull<u8> {
    // The old segment needs nothing: every slot of it was handed out, and its last free frees it.
    let reused = free_list().pop();
    let segment = match reused {
        Some(FreeSegment(segment)) => segment.as_ptr(),
        None => {
            // SAFETY: SEGMENT has a non-zero size.
            let segment = unsafe { std::alloc::alloc(SEGMENT) }.cast::<SegmentHeader>();
            if segment.is_null() {
                std::alloc::handle_alloc_error(SEGMENT);
            }
            segment
        }
    };
    // SAFETY: a fresh segment, or a free one taken off the list (its last free happened before
    // it was listed, and the lock orders that before this write); ours alone now.
    unsafe {
        segment.write(SegmentHeader {
            owed: AtomicUsize::new(SEGMENT_SLOTS - 1),
        })
    };
    local.segment.set(segment);
    local.next.set(2);
    // SAFETY: slot 1 of the segment just set.
    unsafe { slot(segment, 1) }
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
        free_list().push(FreeSegment(segment));
    }
}

/// Returns a slot to the pool.
///
/// # Safety
/// `slot` must come from [`allocate`], hold no live value, and not be used afterwards.
#[inline]
pub(crate) unsafe fn free(slot: NonNull<u8>) {
    let segment = slot.as_ptr().map_addr(|a| a & !(SEGMENT_BYTES - 1));
    // SAFETY: a slot from `allocate` lies in a segment (rounded down: its header), which owes it.
    unsafe { release(NonNull::new_unchecked(segment.cast()), 1) };
}

/// Gives memory back to the system: frees the free segments beyond [`KEEP_SEGMENTS`]. Returns how
/// many it freed.
///
/// It runs on the reaper before it parks, or in `flush`; never on a driver thread.
pub(crate) fn trim() -> usize {
    let surplus: Vec<FreeSegment> = {
        let mut list = free_list();
        if list.len() <= KEEP_SEGMENTS {
            return 0;
        }
        // The oldest first: the most recently freed are the likeliest to be in cache.
        let excess = list.len() - KEEP_SEGMENTS;
        let surplus = list.drain(..excess).collect();
        list.shrink_to(2 * KEEP_SEGMENTS);
        surplus
    };
    for FreeSegment(segment) in &surplus {
        // SAFETY: allocated with SEGMENT by `next_segment`; every slot of it is free and it was on
        // the free list, which we took it off: nobody else has it.
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
            .map(|_| allocate().expect("segment state").as_ptr() as usize)
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
        free_list().iter().map(|s| s.0.as_ptr() as usize).collect()
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
        // What is left is still usable.
        on_a_thread(|| give_back(&take(3 * SEGMENT_SLOTS)));
    }
}
