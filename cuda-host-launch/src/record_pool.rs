//! Recycled memory for small launch records.
//!
//! A record is allocated by the launching thread and freed by the reaper. With the system allocator
//! that pattern makes the launcher's allocations miss its thread cache and contend with the reaper's
//! frees on the same arena. Small records (at most [`SLOT_SIZE`] bytes, the raw launch with a small
//! owner and closures with small captures) come from 128-byte slots instead:
//!
//! - a thread-local cache of free slots that only its thread touches (no atomics);
//! - a global lock-free stack ([`IntrusiveStack`]) that releasing threads push freed slots onto and
//!   that a launcher whose cache is empty takes whole (one `swap`), so there is no ABA problem;
//! - at most [`MAX_POOLED`] slots wait in the global stack (plus at most one for each other thread
//!   freeing at the same moment: the count is checked, then added to, so threads freeing at once
//!   can each pass the check, as loom's model of the pool allows); beyond that, freed slots go back
//!   to the system allocator, so the pool's memory is bounded and a burst does not stay allocated.
//!
//! Driver threads never allocate from the pool (records made there are boxed) and never free into it.

use std::alloc::Layout;
use std::cell::Cell;
use std::ptr::{self, NonNull};

use crate::intrusive_stack::{IntrusiveStack, Linked};
use crate::own_line::OwnLine;
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// The size of a slot: records up to this size are pooled.
pub(crate) const SLOT_SIZE: usize = 128;
/// The alignment of a slot.
pub(crate) const SLOT_ALIGN: usize = 16;
/// The most slots the global stack keeps.
const MAX_POOLED: usize = 4096;

const LAYOUT: Layout = match Layout::from_size_align(SLOT_SIZE, SLOT_ALIGN) {
    Ok(layout) => layout,
    Err(_) => panic!("a valid slot layout"),
};

/// A free slot: its first word links it into a free list.
#[repr(C, align(16))]
pub(crate) struct FreeSlot {
    next: AtomicPtr<FreeSlot>,
    _rest: [u8; SLOT_SIZE - size_of::<usize>()],
}

const _: () = assert!(size_of::<FreeSlot>() == SLOT_SIZE && align_of::<FreeSlot>() == SLOT_ALIGN);

// SAFETY: `link` always returns `next`, which only the intrusive stack writes while the slot is in
// it.
unsafe impl Linked for FreeSlot {
    fn link(&self) -> &AtomicPtr<Self> {
        &self.next
    }
}

/// Slots freed by other threads (the reaper, on every release), and how many: on lines of their
/// own, away from anything a launching thread touches on every launch.
struct Global {
    stack: IntrusiveStack<FreeSlot>,
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

impl Drop for LocalCache {
    fn drop(&mut self) {
        // The thread is exiting: hand its cached slots back to the system.
        let mut node = self.head.get();
        while let Some(slot) = NonNull::new(node) {
            // SAFETY: slots in the local list are free, owned by this list, and were allocated with
            // LAYOUT; the link is read before the slot is freed.
            unsafe {
                node = slot.as_ref().next.load(Ordering::Relaxed);
                std::alloc::dealloc(slot.as_ptr().cast(), LAYOUT);
            }
        }
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

/// A slot of [`SLOT_SIZE`] bytes aligned to [`SLOT_ALIGN`], uninitialised.
#[inline]
pub(crate) fn allocate() -> NonNull<u8> {
    if let Some(slot) = LOCAL.try_with(pop_local).ok().flatten() {
        return slot.cast();
    }
    allocate_slow()
}

fn pop_local(cache: &LocalCache) -> Option<NonNull<FreeSlot>> {
    let slot = NonNull::new(cache.head.get())?;
    // SAFETY: slots in the local list are free and owned by it.
    cache
        .head
        .set(unsafe { slot.as_ref() }.next.load(Ordering::Relaxed));
    Some(slot)
}

#[cold]
fn allocate_slow() -> NonNull<u8> {
    // Take every slot others freed; keep one, cache the rest here.
    let mut batch = GLOBAL.stack.take_all();
    if let Some(first) = batch.next() {
        let mut count = 1;
        let cached = LOCAL.try_with(|cache| {
            for slot in batch.by_ref() {
                // SAFETY: the batch's slots are free and now ours.
                unsafe { slot.as_ref() }
                    .next
                    .store(cache.head.get(), Ordering::Relaxed);
                cache.head.set(slot.as_ptr());
                count += 1;
            }
        });
        if cached.is_err() {
            // The thread is exiting and has no cache any more: free the rest to the system.
            for slot in batch {
                count += 1;
                // SAFETY: free slots allocated with LAYOUT.
                unsafe { std::alloc::dealloc(slot.as_ptr().cast(), LAYOUT) };
            }
        }
        GLOBAL.count.fetch_sub(count, Ordering::Relaxed);
        return first.cast();
    }
    // SAFETY: LAYOUT has a non-zero size.
    let p = unsafe { std::alloc::alloc(LAYOUT) };
    match NonNull::new(p) {
        Some(p) => p,
        None => std::alloc::handle_alloc_error(LAYOUT),
    }
}

/// Returns a slot for reuse.
///
/// # Safety
/// `slot` must come from [`allocate`], hold no live value, and not be used afterwards.
#[inline]
pub(crate) unsafe fn free(slot: NonNull<u8>) {
    if GLOBAL.count.load(Ordering::Relaxed) >= MAX_POOLED {
        // SAFETY: allocated with LAYOUT (by `allocate_slow`), no longer used.
        unsafe { std::alloc::dealloc(slot.as_ptr(), LAYOUT) };
        return;
    }
    GLOBAL.count.fetch_add(1, Ordering::Relaxed);
    let slot = slot.cast::<FreeSlot>();
    // SAFETY: the slot is free memory of FreeSlot's size and alignment; its first word becomes the
    // link (an AtomicPtr is valid for any bit pattern once written).
    unsafe {
        ptr::addr_of_mut!((*slot.as_ptr()).next).write(AtomicPtr::new(ptr::null_mut()));
        GLOBAL.stack.push(slot);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_across_threads_and_the_pool_stays_bounded() {
        let slots: Vec<usize> = (0..100).map(|_| allocate().as_ptr() as usize).collect();
        for &s in &slots {
            assert_eq!(s % SLOT_ALIGN, 0);
        }
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for &s in &slots {
                    // SAFETY: fresh slots, freed once, never used again here.
                    unsafe { free(NonNull::new(s as *mut u8).unwrap()) };
                }
            });
        });
        let again: Vec<usize> = (0..100).map(|_| allocate().as_ptr() as usize).collect();
        let reused = again.iter().filter(|s| slots.contains(s)).count();
        assert!(reused >= 90, "only {reused} of 100 slots were reused");
        for s in again {
            // SAFETY: as above.
            unsafe { free(NonNull::new(s as *mut u8).unwrap()) };
        }
        assert!(GLOBAL.count.load(Ordering::Relaxed) <= MAX_POOLED);
    }
}
