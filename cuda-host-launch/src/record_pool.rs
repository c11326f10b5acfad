//! Recycled memory for small launch records.
//!
//! A record is allocated by the launching thread and freed by the reaper. With the system allocator
//! that pattern makes the launcher's allocations miss its thread cache and contend with the reaper's
//! frees on the same arena. Small records (at most [`SLOT_SIZE`] bytes, the raw launch with a small
//! owner and closures with small captures) come from slots of 128 bytes, aligned to 128, so that a
//! record never shares a cache line (or an adjacent-line prefetch pair) with another record.
//!
//! Free slots travel in **chunks**: a free slot that lists up to [`CHUNK_SLOTS`] other free slots by
//! address. A thread allocates from its current chunk by reading one pointer out of it, a line it
//! already holds, so it never reads a free slot's own memory before writing the record into it:
//! the slot's line, last touched by the reaper, is fetched by the record's stores, which do not
//! stall the launcher the way a load would. (An intrusive free list made every allocation read the
//! slot it handed out, a miss on a line the reaper had just written, one after the other.)
//!
//! - **Freeing** (the reaper, on every release) appends the slot to the thread's outgoing chunk (the
//!   first slot freed becomes the chunk). A full chunk, and at the end of each batch of releases
//!   ([`publish`]) a partial one, is pushed onto a global lock-free stack ([`IntrusiveStack`]): one
//!   compare-and-swap per chunk, not per slot.
//! - **Allocating** takes the next listed slot of the thread's current chunk, then the chunk itself.
//!   When the thread has none, it takes its own outgoing chunk if it has one, else the whole global
//!   stack (one `swap`, so there is no ABA problem), else a slot from the system allocator.
//! - At most [`MAX_POOLED`] slots wait in the global stack; a chunk that would exceed that goes back
//!   to the system allocator, so the pool's memory is bounded and a burst does not stay allocated.
//!   A thread's own chunks are bounded by what the global stack held when it took it, and are
//!   returned to the system when the thread exits.
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
/// The alignment of a slot: a cache-line pair, so no two records share a line.
pub(crate) const SLOT_ALIGN: usize = 128;
/// The most slots the global stack keeps.
const MAX_POOLED: usize = 4096;
/// How many other free slots a chunk lists.
pub(crate) const CHUNK_SLOTS: usize = (SLOT_SIZE - 2 * size_of::<usize>()) / size_of::<usize>();

const LAYOUT: Layout = match Layout::from_size_align(SLOT_SIZE, SLOT_ALIGN) {
    Ok(layout) => layout,
    Err(_) => panic!("a valid slot layout"),
};

/// A free slot that lists `len` other free slots: `1 + len` free slots in all.
#[repr(C, align(128))]
struct Chunk {
    /// The global stack's link, or the link of a thread's list of chunks.
    next: AtomicPtr<Chunk>,
    /// How many entries of `slots` are free slots.
    len: usize,
    slots: [*mut u8; CHUNK_SLOTS],
}

const _: () = assert!(size_of::<Chunk>() == SLOT_SIZE && align_of::<Chunk>() == SLOT_ALIGN);

// SAFETY: `link` always returns `next`, which only the intrusive stack writes while the chunk is in
// it.
unsafe impl Linked for Chunk {
    fn link(&self) -> &AtomicPtr<Self> {
        &self.next
    }
}

/// Chunks freed by other threads (the reaper's, after every batch), and how many slots they hold:
/// on lines of their own, away from anything a launching thread touches on every launch.
struct Global {
    stack: IntrusiveStack<Chunk>,
    count: AtomicUsize,
}

static GLOBAL: OwnLine<Global> = OwnLine(Global {
    stack: IntrusiveStack::new(),
    count: AtomicUsize::new(0),
});

/// A thread's chunks; only its thread touches them.
struct Local {
    /// The chunk allocated from, linked to the chunks that follow it.
    current: Cell<*mut Chunk>,
    /// The chunk this thread's frees fill, not yet published.
    outgoing: Cell<*mut Chunk>,
}

impl Drop for Local {
    fn drop(&mut self) {
        // The thread is exiting. What it freed goes to the pool; what it cached, to the system.
        if let Some(chunk) = NonNull::new(self.outgoing.replace(ptr::null_mut())) {
            // SAFETY: the outgoing chunk is free, owned by this thread, and in no list.
            unsafe { push_global(chunk) };
        }
        let mut node = self.current.replace(ptr::null_mut());
        while let Some(chunk) = NonNull::new(node) {
            // SAFETY: chunks in the current list are free and owned by this thread; the link is
            // read before the chunk is freed.
            unsafe {
                node = chunk.as_ref().next.load(Ordering::Relaxed);
                free_chunk_to_system(chunk);
            }
        }
    }
}

thread_local! {
    static LOCAL: Local = const {
        Local { current: Cell::new(ptr::null_mut()), outgoing: Cell::new(ptr::null_mut()) }
    };
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
        return slot;
    }
    allocate_slow()
}

/// The next free slot of the current chunk, or the chunk itself once it lists none.
#[inline]
fn pop_local(local: &Local) -> Option<NonNull<u8>> {
    let chunk = NonNull::new(local.current.get())?.as_ptr();
    // SAFETY: chunks in the current list are free, owned by this thread, and were initialised by
    // the thread that made them (`free`) before they reached this one.
    unsafe {
        let len = (*chunk).len;
        if len > 0 {
            (*chunk).len = len - 1;
            // The listed slots are non-null (written by `free` from `NonNull`s).
            return NonNull::new((*chunk).slots[len - 1]);
        }
        local.current.set((*chunk).next.load(Ordering::Relaxed));
    }
    NonNull::new(chunk.cast())
}

#[cold]
fn allocate_slow() -> NonNull<u8> {
    let refilled = LOCAL.try_with(|local| {
        // First what this thread freed itself (manual mode, failed launches): no atomics.
        let own = local.outgoing.replace(ptr::null_mut());
        if !own.is_null() {
            // SAFETY: the outgoing chunk is free and ours; it becomes the only current chunk.
            unsafe { (*own).next.store(ptr::null_mut(), Ordering::Relaxed) };
            local.current.set(own);
        } else {
            local.current.set(take_global());
        }
        pop_local(local)
    });
    if let Ok(Some(slot)) = refilled {
        return slot;
    }
    // SAFETY: LAYOUT has a non-zero size.
    let p = unsafe { std::alloc::alloc(LAYOUT) };
    match NonNull::new(p) {
        Some(p) => p,
        None => std::alloc::handle_alloc_error(LAYOUT),
    }
}

/// Takes every chunk in the global stack; returns them as a list through their links.
fn take_global() -> *mut Chunk {
    let mut list: *mut Chunk = ptr::null_mut();
    let mut taken = 0;
    for chunk in GLOBAL.stack.take_all() {
        // SAFETY: the taken chunks are free and now ours.
        unsafe {
            taken += 1 + (*chunk.as_ptr()).len;
            chunk.as_ref().next.store(list, Ordering::Relaxed);
        }
        list = chunk.as_ptr();
    }
    if taken > 0 {
        GLOBAL.count.fetch_sub(taken, Ordering::Relaxed);
    }
    list
}

/// Returns a slot for reuse: into this thread's outgoing chunk, which goes to the global stack once
/// full or at the next [`publish`].
///
/// # Safety
/// `slot` must come from [`allocate`], hold no live value, and not be used afterwards.
#[inline]
pub(crate) unsafe fn free(slot: NonNull<u8>) {
    let kept = LOCAL.try_with(|local| {
        match NonNull::new(local.outgoing.get()) {
            None => {
                let chunk = slot.cast::<Chunk>();
                // SAFETY: the slot is free memory of Chunk's size and alignment; it becomes an
                // empty chunk (an AtomicPtr, a count and pointers are valid for these values).
                unsafe {
                    ptr::addr_of_mut!((*chunk.as_ptr()).next)
                        .write(AtomicPtr::new(ptr::null_mut()));
                    ptr::addr_of_mut!((*chunk.as_ptr()).len).write(0);
                }
                local.outgoing.set(chunk.as_ptr());
            }
            Some(chunk) => {
                let chunk = chunk.as_ptr();
                // SAFETY: the outgoing chunk is free, ours, and initialised; `len < CHUNK_SLOTS`
                // (a full chunk is published at once).
                unsafe {
                    let len = (*chunk).len;
                    (*chunk).slots[len] = slot.as_ptr();
                    (*chunk).len = len + 1;
                    if len + 1 == CHUNK_SLOTS {
                        local.outgoing.set(ptr::null_mut());
                        push_global(NonNull::new_unchecked(chunk));
                    }
                }
            }
        }
    });
    if kept.is_err() {
        // The thread is exiting and has no chunks any more.
        // SAFETY: allocated with LAYOUT, no longer used.
        unsafe { std::alloc::dealloc(slot.as_ptr(), LAYOUT) };
    }
}

/// Hands this thread's partial outgoing chunk to the global stack, so launching threads can reuse
/// its slots. The cleanup queue calls it after each batch of releases.
pub(crate) fn publish() {
    let _ = LOCAL.try_with(|local| {
        if let Some(chunk) = NonNull::new(local.outgoing.replace(ptr::null_mut())) {
            // SAFETY: the outgoing chunk is free, ours, initialised, and in no list.
            unsafe { push_global(chunk) };
        }
    });
}

/// Pushes a chunk onto the global stack, or frees it to the system if the stack holds enough.
///
/// # Safety
/// `chunk` must be a free, initialised chunk that the caller owns and that is in no list.
unsafe fn push_global(chunk: NonNull<Chunk>) {
    // SAFETY: as the caller promises.
    let slots = 1 + unsafe { (*chunk.as_ptr()).len };
    // Counted before it is pushed, so a taker never subtracts more than was added; one
    // read-modify-write, so concurrent pushers cannot together pass the bound.
    let counted = GLOBAL
        .count
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |count| {
            (count + slots <= MAX_POOLED).then_some(count + slots)
        });
    if counted.is_err() {
        // SAFETY: as the caller promises.
        unsafe { free_chunk_to_system(chunk) };
        return;
    }
    // SAFETY: the chunk is ours and in no list; the stack's Release push publishes its contents.
    unsafe { GLOBAL.stack.push(chunk) };
}

/// Frees a chunk and the slots it lists to the system allocator.
///
/// # Safety
/// `chunk` must be a free, initialised chunk that the caller owns and that is in no list.
unsafe fn free_chunk_to_system(chunk: NonNull<Chunk>) {
    // SAFETY: as the caller promises: the listed slots are free slots allocated with LAYOUT, and so
    // is the chunk, which is read before it is freed.
    unsafe {
        let chunk_ref = chunk.as_ref();
        for &slot in &chunk_ref.slots[..chunk_ref.len] {
            std::alloc::dealloc(slot, LAYOUT);
        }
        std::alloc::dealloc(chunk.as_ptr().cast(), LAYOUT);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The tests share the global stack: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn slot_addresses(n: usize) -> Vec<usize> {
        (0..n).map(|_| allocate().as_ptr() as usize).collect()
    }

    /// Slots as `allocate_slow` makes them, without touching the pool.
    fn system_slots(n: usize) -> Vec<usize> {
        let slots: Vec<usize> = (0..n)
            // SAFETY: LAYOUT has a non-zero size.
            .map(|_| unsafe { std::alloc::alloc(LAYOUT) } as usize)
            .collect();
        assert!(slots.iter().all(|&s| s != 0));
        slots
    }

    /// Empties the global stack into the system allocator.
    fn empty_global() {
        let mut node = take_global();
        while let Some(chunk) = NonNull::new(node) {
            // SAFETY: taken chunks are ours; the link is read before the chunk is freed.
            unsafe {
                node = chunk.as_ref().next.load(Ordering::Relaxed);
                free_chunk_to_system(chunk);
            }
        }
    }

    fn free_here(addresses: &[usize]) {
        for &s in addresses {
            // SAFETY: slots from `allocate`, freed once, never used again.
            unsafe { free(NonNull::new(s as *mut u8).unwrap()) };
        }
    }

    /// Frees the slots at `addresses` on a thread of its own, as the reaper does.
    fn free_elsewhere(addresses: &[usize]) {
        std::thread::scope(|scope| {
            scope.spawn(|| {
                free_here(addresses);
                publish();
            });
        });
    }

    #[test]
    fn slots_are_reused_across_threads_and_the_pool_stays_bounded() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        std::thread::spawn(|| {
            // Room in the pool, and slots from the system, so this fresh thread has no chunks of
            // its own yet.
            empty_global();
            let slots = system_slots(100);
            free_elsewhere(&slots);
            let again = slot_addresses(100);
            assert!(again.iter().all(|s| s % SLOT_ALIGN == 0));
            let reused = again.iter().filter(|s| slots.contains(s)).count();
            assert!(reused >= 90, "only {reused} of 100 slots were reused");
            let mut unique = again.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), again.len(), "a slot was handed out twice");
            free_elsewhere(&again);
            assert!(GLOBAL.count.load(Ordering::Relaxed) <= MAX_POOLED);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_reuses_what_it_freed_itself_first() {
        std::thread::spawn(|| {
            // Slots from the system, so this fresh thread has no current chunk.
            let mut slots = system_slots(CHUNK_SLOTS / 2);
            free_here(&slots);
            let mut again = slot_addresses(CHUNK_SLOTS / 2);
            slots.sort_unstable();
            again.sort_unstable();
            assert_eq!(
                again, slots,
                "the thread's own freed slots were not taken first"
            );
            free_here(&again);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_burst_beyond_the_bound_goes_back_to_the_system() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        std::thread::spawn(|| {
            let burst = slot_addresses(MAX_POOLED + 4 * CHUNK_SLOTS);
            free_elsewhere(&burst);
            let count = GLOBAL.count.load(Ordering::Relaxed);
            assert!(count <= MAX_POOLED, "the pool holds {count} slots");
        })
        .join()
        .unwrap();
    }
}
