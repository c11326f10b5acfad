//! The launch record: the one heap allocation of a launch, holding the host function, its user data
//! and its owners.
//!
//! A record starts with a [`RecordHeader`] (the cleanup queue's link and one dispatch function), so
//! the queue and the trampoline handle every kind of record alike through a `NonNull<RecordHeader>`:
//!
//! ```text
//!   Record<P> (repr(C))            P is one of:
//!   +------------------+           RawPayload<O>      f, user_data, owners: O
//!   | next  (queue)    |           ClosurePayload<F>  the closure F (captures = owners), caught panic
//!   | dispatch fn      |           (bytes)            f, len, then the copied bytes inline
//!   +------------------+
//!   | payload P        |
//!   +------------------+
//! ```
//!
//! Life of a record: built on the launching thread (the builders here return it raw; the reaper's
//! `OwnedRecord` holds it until the driver has it); the driver's thread runs the payload once (the
//! host-function transport's trampoline) and pushes the record onto the cleanup queue (no lock, no
//! allocation, no CUDA call); the reaper (or a drain) releases it: owners dropped, memory freed. If
//! the enqueue fails, `OwnedRecord`'s `Drop` releases it on the launching thread instead.
//!
//! Every builder below returns a record that the caller owns: it must be released exactly once,
//! with [`RecordHeader::dispatch`]`(.., Op::Release)`.

use std::alloc::Layout;
use std::any::Any;
use std::ffi::c_void;
use std::ptr::{self, NonNull};

use super::pool;
use super::ticket_id::TicketId;
use crate::support::host_thread::in_host_function;
use crate::support::intrusive_stack::Linked;
use crate::support::sync::AtomicPtr;
use crate::support::sync::cell::UnsafeCell;

/// A caught panic's payload.
pub(crate) type PanicPayload = Box<dyn Any + Send + 'static>;

/// What [`RecordHeader::dispatch`] is asked to do.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Run the host function (on the driver's thread). Must not unwind.
    Run,
    /// Hand over the panic the run caught, if any.
    TakePanic,
    /// Drop the owners and free the record. May unwind if an owner's `Drop` panics; the memory is
    /// freed either way.
    Release,
    /// Free the record without dropping its payload, which the caller has moved out
    /// ([`take_payload`]: a launch the driver never took hands its owners back).
    Free,
    /// The record's context is gone and it will be released unrun: settle, on the calling thread
    /// (a reclaim's), what waits on it without being user code (a future fails and its waker is
    /// woken), so that nothing waits for the release on the reaper, which user code may hold.
    Lost,
}

/// The part every record starts with.
#[repr(C)]
pub(crate) struct RecordHeader {
    /// The cleanup queue's link; written only by the queue.
    next: AtomicPtr<RecordHeader>,
    /// The record's type-specific operations.
    dispatch: Dispatch,
    /// The ticket of its launch, once launched (run-once launches only). Written by the launcher
    /// before the launch; read and cleared by whoever releases the record (which the queue, or the
    /// launcher's own thread, orders after).
    ticket: UnsafeCell<Option<TicketId>>,
}

// A pooled record's release drops only its payload (see `release_record`).
const _: () = assert!(!std::mem::needs_drop::<RecordHeader>());

// SAFETY: `link` always returns `next`, which only the intrusive stack writes.
unsafe impl Linked for RecordHeader {
    fn link(&self) -> &AtomicPtr<Self> {
        &self.next
    }
}

impl RecordHeader {
    /// The header of a new record.
    fn new(dispatch: Dispatch) -> Self {
        RecordHeader {
            next: AtomicPtr::new(ptr::null_mut()),
            dispatch,
            ticket: UnsafeCell::new(None),
        }
    }

    /// The ticket of the record's launch.
    ///
    /// # Safety
    /// `header` must be a live record; the reference is not kept past its release.
    pub(crate) unsafe fn ticket<'a>(
        header: NonNull<RecordHeader>,
    ) -> &'a UnsafeCell<Option<TicketId>> {
        // SAFETY: a field of a live header (the caller's promise).
        unsafe { &(*header.as_ptr()).ticket }
    }

    /// Runs `op` on the record at `header`.
    ///
    /// # Safety
    /// `header` must point at a live record. `Run` only once and on one thread at a time; after
    /// `Release` the record is gone.
    #[inline]
    pub(crate) unsafe fn dispatch(header: NonNull<RecordHeader>, op: Op) -> Option<PanicPayload> {
        // SAFETY: the caller guarantees the record is live; `dispatch` was set at construction to the
        // function for this record's type.
        unsafe { (header.as_ref().dispatch)(header, op) }
    }
}

/// One kind of record content.
pub(crate) trait Payload: Send + 'static {
    /// Runs the host function; called once, on the driver's thread. Must not unwind.
    ///
    /// # Safety
    /// Whatever the launch that built this payload promised (see each launch's `# Safety`).
    unsafe fn run(&mut self);

    /// The panic the run caught, if any.
    fn take_panic(&mut self) -> Option<PanicPayload> {
        None
    }

    /// Its context is gone: it will be released unrun (see [`Op::Lost`]). Runs on a reclaiming
    /// thread: must not drop or call the user's payload, nor unwind.
    fn lost(&mut self) {}
}

#[repr(C)]
struct Record<P> {
    header: RecordHeader,
    payload: P,
}

/// A record's dispatch function.
type Dispatch = unsafe fn(NonNull<RecordHeader>, Op) -> Option<PanicPayload>;

/// Puts `payload` into a record: a pooled slot if `pooled` is given, it fits, and this is not a
/// driver thread nor one whose pool state is gone; else a `Box`. The record gets the dispatch
/// function that matches where it went.
fn place<P>(payload: P, pooled: Option<Dispatch>, boxed: Dispatch) -> NonNull<RecordHeader> {
    if let Some(pooled) = pooled
        && pool::fits(Layout::new::<Record<P>>())
        && !in_host_function()
        && let Some(slot) = pool::allocate()
    {
        let record = slot.memory.cast::<Record<P>>();
        let header = RecordHeader::new(pooled);
        // SAFETY: the slot is fresh, uninitialised memory large and aligned enough for Record<P>.
        unsafe { record.write(Record { header, payload }) };
        return record.cast();
    }
    let header = RecordHeader::new(boxed);
    let record = Box::new(Record { header, payload });
    NonNull::from(Box::leak(record)).cast()
}

/// Puts a run-once payload into a record (see [`place`]): pooled when small, since it lives about
/// as long as the launches around it.
pub(crate) fn new_record<P: Payload>(payload: P) -> NonNull<RecordHeader> {
    place(payload, Some(dispatch::<P, true>), dispatch::<P, false>)
}

/// Puts a run-once payload into a record that is always a `Box`: for one that lives as long as a
/// graph (a user object's holder), which in the pool would hold a whole segment of slots that
/// launches around it used and freed (see `pool.rs`).
pub(crate) fn new_boxed_record<P: Payload>(payload: P) -> NonNull<RecordHeader> {
    place(payload, None, dispatch::<P, false>)
}

/// Drops a record in place and frees its memory, to the pool (`POOLED`) or as a `Box`; the memory
/// is freed also if an owner's `Drop` panics.
///
/// A pooled record's header stays as it is (it has nothing to drop): only the payload is dropped
/// in place, so no reference to the whole record is made while a reclaim's walk over the pool may
/// read the header's ticket.
///
/// # Safety
/// `record` must be a live record allocated as `POOLED` says, owned by the caller, released once.
unsafe fn release_record<P, const POOLED: bool>(record: *mut Record<P>) {
    if POOLED {
        /// Frees the slot when dropped: after the record's drop, or while unwinding from it.
        struct SlotGuard(*mut u8);
        impl Drop for SlotGuard {
            fn drop(&mut self) {
                if let Some(slot) = NonNull::new(self.0) {
                    // SAFETY: the slot's value has been dropped (or is being unwound from); the
                    // slot came from the pool and is used no more.
                    unsafe { pool::free(slot) };
                }
            }
        }
        let _free = SlotGuard(record.cast());
        // SAFETY: the record is live and owned by the caller; its payload is dropped once (the
        // header has no drop glue).
        unsafe { ptr::drop_in_place(ptr::addr_of_mut!((*record).payload)) };
    } else {
        // SAFETY: made with `Box`; dropping the Box drops the owners, then frees (also if an
        // owner's Drop panics).
        drop(unsafe { Box::from_raw(record) });
    }
}

/// Frees a record's memory, to the pool (`POOLED`) or as a `Box`, without dropping its payload.
///
/// # Safety
/// `record` must be a live record allocated as `POOLED` says, owned by the caller, whose payload
/// the caller has moved out (or will never use again); not used afterwards.
unsafe fn free_record<P, const POOLED: bool>(record: *mut Record<P>) {
    if POOLED {
        // SAFETY: the slot came from the pool (POOLED) and holds no live value any more: the
        // header has no drop glue and the payload was moved out.
        unsafe { pool::free(NonNull::new_unchecked(record.cast())) };
    } else {
        // SAFETY: made with `Box::new` of a `Record<P>` (a non-zero size: it has a header), so
        // allocated with this layout by the global allocator; nothing in it is dropped.
        unsafe { std::alloc::dealloc(record.cast(), Layout::new::<Record<P>>()) };
    }
}

/// Moves the payload out of a record made with payload type `P`, and frees the record: what a
/// launch the driver never took hands back to its caller (its owners, its closure). Nothing is
/// dropped.
///
/// # Safety
/// `header` must be a live record owned by the caller, made by [`new_record`],
/// [`new_shared_record`] or [`new_node_record`] with a payload of type `P`, whose payload never
/// ran (or whose run left it whole) and which is in no queue and no ticket; it is gone afterwards.
pub(crate) unsafe fn take_payload<P>(header: NonNull<RecordHeader>) -> P {
    let record = header.cast::<Record<P>>().as_ptr();
    // SAFETY: the record is live, of payload type `P` (the caller's promise); the payload is read
    // once, and the record freed below without dropping it.
    let payload = unsafe { ptr::read(ptr::addr_of!((*record).payload)) };
    // SAFETY: the caller owns the live record; its payload was moved out just above.
    unsafe { RecordHeader::dispatch(header, Op::Free) };
    payload
}

/// The payload of a live record made with payload type `P`, shared.
///
/// # Safety
/// `header` must be a live record made by [`new_record`] or [`new_boxed_record`] with a payload of
/// type `P`; the reference must not outlive the record's release, nor meet a `Run` of it.
pub(crate) unsafe fn payload<'a, P>(header: NonNull<RecordHeader>) -> &'a P {
    // SAFETY: a live `Record<P>` (the caller's promise); only shared references are made.
    unsafe { &(*header.cast::<Record<P>>().as_ptr()).payload }
}

/// The dispatch function of `Record<P>`.
///
/// # Safety
/// As [`RecordHeader::dispatch`]; `header` must be the header of a `Record<P>` made by `new_record`
/// with this `POOLED`.
unsafe fn dispatch<P: Payload, const POOLED: bool>(
    header: NonNull<RecordHeader>,
    op: Op,
) -> Option<PanicPayload> {
    let record = header.cast::<Record<P>>().as_ptr();
    match op {
        Op::Run => {
            // SAFETY: the record is live and only the driver's thread touches it while it runs.
            unsafe { (*record).payload.run() };
            None
        }
        // SAFETY: the record is live and owned by the caller.
        Op::TakePanic => unsafe { (*record).payload.take_panic() },
        Op::Lost => {
            // SAFETY: the record is live and owned by the caller (a reclaim that took it).
            unsafe { (*record).payload.lost() };
            None
        }
        Op::Release => {
            // SAFETY: the caller owns the live record and releases it once; POOLED matches.
            unsafe { release_record::<P, POOLED>(record) };
            None
        }
        Op::Free => {
            // SAFETY: the caller owns the record, whose payload it moved out; POOLED matches.
            unsafe { free_record::<P, POOLED>(record) };
            None
        }
    }
}

/// Alignment of the copied bytes: that of `malloc`, so any C struct may be read from them.
pub(crate) const BYTES_ALIGN: usize = 16;

/// The fixed part of a bytes record; the bytes follow at `bytes_layout(len).1`.
#[repr(C)]
struct BytesRecord {
    header: RecordHeader,
    f: unsafe extern "C" fn(*mut c_void),
    len: usize,
}

/// The layout of a bytes record of `len` bytes, and the offset of the bytes in it.
fn bytes_layout(len: usize) -> Option<(Layout, usize)> {
    let bytes = Layout::from_size_align(len, BYTES_ALIGN).ok()?;
    let (layout, offset) = Layout::new::<BytesRecord>().extend(bytes).ok()?;
    Some((layout.pad_to_align(), offset))
}

/// A record holding a copy of `bytes`, inline; `f` gets a pointer to the copy, aligned to
/// [`BYTES_ALIGN`]. One allocation. `None` if the size overflows the address space.
pub(crate) fn new_bytes_record(
    f: unsafe extern "C" fn(*mut c_void),
    bytes: &[u8],
) -> Option<NonNull<RecordHeader>> {
    let (layout, offset) = bytes_layout(bytes.len())?;
    // SAFETY: `layout` has a non-zero size (it contains a `BytesRecord`).
    let base = unsafe { std::alloc::alloc(layout) };
    let Some(base) = NonNull::new(base) else {
        std::alloc::handle_alloc_error(layout);
    };
    let record = base.cast::<BytesRecord>();
    // SAFETY: `base` is a fresh allocation of `layout`, which starts with a `BytesRecord` and has
    // `bytes.len()` bytes at `offset`; the source and the copy do not overlap.
    unsafe {
        record.as_ptr().write(BytesRecord {
            header: RecordHeader::new(dispatch_bytes),
            f,
            len: bytes.len(),
        });
        ptr::copy_nonoverlapping(bytes.as_ptr(), base.as_ptr().add(offset), bytes.len());
    }
    Some(record.cast())
}

/// The dispatch function of bytes records.
///
/// # Safety
/// As [`RecordHeader::dispatch`]; `header` must be the header of a record from `new_bytes_record`.
unsafe fn dispatch_bytes(header: NonNull<RecordHeader>, op: Op) -> Option<PanicPayload> {
    let record = header.cast::<BytesRecord>();
    // SAFETY: the record is live; `len` was written at construction and never changes.
    let (f, len) = unsafe { ((*record.as_ptr()).f, (*record.as_ptr()).len) };
    // `new_bytes_record` computed this same layout successfully, so this cannot fail; if it somehow
    // did, leaking is the safe answer.
    let (layout, offset) = bytes_layout(len)?;
    match op {
        Op::Run => {
            // SAFETY: the bytes live at `offset` in this record until it is released; the launch's
            // caller promised `f` may be called with them.
            unsafe { f(header.as_ptr().cast::<u8>().add(offset).cast()) };
            None
        }
        Op::TakePanic | Op::Lost => None,
        // The header and the bytes have no drop glue: freeing is releasing.
        Op::Release | Op::Free => {
            // SAFETY: allocated with `layout` in `new_bytes_record`; the header and the bytes have
            // no drop glue; the caller releases once.
            unsafe { std::alloc::dealloc(header.as_ptr().cast(), layout) };
            None
        }
    }
}

/// A payload that may run any number of times, possibly from several driver threads at once (a
/// graph node runs on every replay of every executable graph made from its graph), so it runs
/// through `&self`.
pub(crate) trait SharedPayload: Send + Sync + 'static {
    /// Runs the host function. Must not unwind.
    ///
    /// # Safety
    /// Whatever the launch that built this payload promised.
    unsafe fn run_shared(&self);
}

/// Puts a repeatable launch's payload into a record (see [`place`]): pooled when small. On a stream
/// that is not capturing, the launch runs once and is released like any other; captured, its
/// record lives as long as the graph and holds its pool segment that long (the record is made
/// before the capture query tells which).
pub(crate) fn new_shared_record<P: SharedPayload>(payload: P) -> NonNull<RecordHeader> {
    place(
        payload,
        Some(dispatch_shared::<P, true>),
        dispatch_shared::<P, false>,
    )
}

/// Puts a graph host node's payload into a record: always a `Box`. It lives as long as its graph,
/// and in the pool it would hold a whole segment of slots that launches around it used and freed
/// (see `pool.rs`).
pub(crate) fn new_node_record<P: SharedPayload>(payload: P) -> NonNull<RecordHeader> {
    place(payload, None, dispatch_shared::<P, false>)
}

/// The dispatch function of `Record<P>` for a repeatable `P`.
///
/// # Safety
/// As [`RecordHeader::dispatch`], except that `Run` may be called any number of times and
/// concurrently; `header` must be the header of a `Record<P>` made by `new_shared_record` or
/// `new_node_record` with this `POOLED`.
unsafe fn dispatch_shared<P: SharedPayload, const POOLED: bool>(
    header: NonNull<RecordHeader>,
    op: Op,
) -> Option<PanicPayload> {
    let record = header.cast::<Record<P>>().as_ptr();
    match op {
        Op::Run => {
            // SAFETY: the record is live while the graph (or the pending launch) that runs it is;
            // runs only take shared references.
            unsafe { (*record).payload.run_shared() };
            None
        }
        Op::TakePanic | Op::Lost => None,
        Op::Release => {
            // SAFETY: made with this POOLED; released once, after the last run.
            unsafe { release_record::<P, POOLED>(record) };
            None
        }
        Op::Free => {
            // SAFETY: made with this POOLED; the caller moved the payload out (it never ran).
            unsafe { free_record::<P, POOLED>(record) };
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_as_small_as_their_contents_allow() {
        assert_eq!(size_of::<RecordHeader>(), 24);
        // A raw launch's payload without owners: a function and its user data.
        assert_eq!(size_of::<Record<(usize, usize)>>(), 40);
        let (layout, offset) = bytes_layout(24).unwrap();
        assert_eq!(offset % BYTES_ALIGN, 0);
        assert!(layout.size() >= offset + 24);
    }

    /// A small payload: a counter of its runs and a word.
    #[cfg(not(loom))]
    struct Small([usize; 2]);

    #[cfg(not(loom))]
    impl Payload for Small {
        unsafe fn run(&mut self) {
            self.0[0] += 1;
        }
    }

    /// The addresses of three run-once records made by `make` one after another on a new thread
    /// (marked as inside a host function if `in_host_function`), then released.
    #[cfg(not(loom))]
    fn three_records(
        make: fn(Small) -> NonNull<RecordHeader>,
        in_host_function: bool,
    ) -> [usize; 3] {
        std::thread::spawn(move || {
            let _mark = in_host_function.then(crate::HostFunctionScope::enter);
            let records = [(); 3].map(|()| make(Small([0; 2])));
            for record in records {
                // SAFETY: made above, live, released once.
                let panic = unsafe { RecordHeader::dispatch(record, Op::Release) };
                assert!(panic.is_none());
            }
            records.map(|record| record.as_ptr().addr())
        })
        .join()
        .unwrap()
    }

    /// Whether three records sit in consecutive slots from the first slot after a segment's
    /// header, as a new thread's first records from the pool do.
    #[cfg(not(loom))]
    fn pooled(addresses: [usize; 3]) -> bool {
        let segment = pool::SLOT_SIZE * pool::SEGMENT_SLOTS;
        addresses[0] % segment == pool::SLOT_SIZE
            && addresses[1] == addresses[0] + pool::SLOT_SIZE
            && addresses[2] == addresses[1] + pool::SLOT_SIZE
    }

    /// A record that lives as long as a graph (a user object's holder) is boxed, however small:
    /// in the pool it would keep a whole segment for the graph's life.
    #[cfg(not(loom))]
    #[test]
    fn records_made_boxed_are_never_pooled() {
        assert!(!pooled(three_records(new_boxed_record, false)));
    }

    /// A small record is pooled on an ordinary thread, and boxed on a driver thread (inside a host
    /// function), whose records are rare and would keep a segment of their own. (Mutation
    /// testing: with the host-function test negated, the two were swapped and every test passed.)
    #[cfg(not(loom))]
    #[test]
    fn small_records_are_pooled_except_inside_host_functions() {
        let pooling = !cfg!(feature = "unpooled-records");
        assert_eq!(pooled(three_records(new_record, false)), pooling);
        assert!(!pooled(three_records(new_record, true)));
    }
}
