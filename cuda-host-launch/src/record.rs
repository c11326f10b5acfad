//! The launch record: the one heap allocation of a launch, holding the host function, its user data
//! and its owners; and the trampoline the driver calls with it.
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
//! Life of a record: built on the launching thread; its address is the `userData` of
//! `cuLaunchHostFunc`; the driver's thread calls [`trampoline`], which runs the payload once and pushes
//! the record onto the cleanup queue (no lock, no allocation, no CUDA call); the reaper (or a drain)
//! releases it: owners dropped, memory freed. If the enqueue fails, [`OwnedRecord`]'s `Drop` releases
//! it on the launching thread instead.

use std::alloc::Layout;
use std::any::Any;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::{self, NonNull};

use crate::cleanup;
use crate::host_thread::HostFunctionScope;
use crate::intrusive_stack::Linked;
use crate::launch_state::Claim;
use crate::pending;
use crate::record_pool;
use crate::sync::AtomicPtr;
use crate::tickets::{self, TicketId};

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
}

/// The part every record starts with.
#[repr(C)]
pub(crate) struct RecordHeader {
    /// The cleanup queue's link; written only by the queue.
    next: AtomicPtr<RecordHeader>,
    /// The record's type-specific operations.
    dispatch: Dispatch,
    /// Its place among the pending launches of its context (run-once launches only).
    tracking: pending::Tracking,
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
            tracking: pending::Tracking::new(),
        }
    }

    /// The record's tracking fields.
    pub(crate) fn tracking(header: NonNull<RecordHeader>) -> *const pending::Tracking {
        // SAFETY: a field projection of a live header; no reference is made here.
        unsafe { ptr::addr_of!((*header.as_ptr()).tracking) }
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

/// A record not yet handed to the driver: releasing it is this value's job, so every early return
/// and error path drops the owners on the current thread (or, on a driver thread, defers them).
pub(crate) struct OwnedRecord(NonNull<RecordHeader>);

impl OwnedRecord {
    /// The address to pass as `userData`.
    pub(crate) fn as_user_data(&self) -> *mut c_void {
        self.0.as_ptr().cast()
    }

    /// Hands ownership to the driver (the trampoline will release it).
    pub(crate) fn into_raw(self) -> NonNull<RecordHeader> {
        let header = self.0;
        std::mem::forget(self);
        header
    }

    /// Takes ownership of a record previously turned `into_raw` whose launch did not happen.
    ///
    /// # Safety
    /// `header` must come from [`OwnedRecord::into_raw`] and not be owned by anyone else.
    pub(crate) unsafe fn from_raw(header: NonNull<RecordHeader>) -> Self {
        OwnedRecord(header)
    }
}

impl Drop for OwnedRecord {
    fn drop(&mut self) {
        cleanup::release_here_or_defer(self.0);
    }
}

// SAFETY: a record's payload is `Send` (every payload type requires it), and the record is used by
// one thread at a time: the launcher, then the driver's thread, then a releasing thread.
unsafe impl Send for OwnedRecord {}

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
fn place<P>(payload: P, pooled: Option<Dispatch>, boxed: Dispatch) -> OwnedRecord {
    if let Some(pooled) = pooled
        && record_pool::fits(Layout::new::<Record<P>>())
        && !crate::in_host_function()
        && let Some(slot) = record_pool::allocate()
    {
        let record = slot.memory.cast::<Record<P>>();
        let header = RecordHeader::new(pooled);
        // SAFETY: the slot is fresh, uninitialised memory large and aligned enough for Record<P>.
        unsafe { record.write(Record { header, payload }) };
        return OwnedRecord(record.cast());
    }
    let header = RecordHeader::new(boxed);
    let record = Box::new(Record { header, payload });
    OwnedRecord(NonNull::from(Box::leak(record)).cast())
}

/// Puts a run-once payload into a record (see [`place`]): pooled when small, since it lives about
/// as long as the launches around it.
pub(crate) fn new_record<P: Payload>(payload: P) -> OwnedRecord {
    place(payload, Some(dispatch::<P, true>), dispatch::<P, false>)
}

/// Drops a record in place and frees its memory, to the pool (`POOLED`) or as a `Box`; the memory
/// is freed also if an owner's `Drop` panics.
///
/// A pooled record's header stays as it is (it has nothing to drop): only the payload is dropped
/// in place, so no reference to the whole record is made while a reclaim's walk over the pool may
/// read the header's tracking state.
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
                    unsafe { record_pool::free(slot) };
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
        Op::Release => {
            // SAFETY: the caller owns the live record and releases it once; POOLED matches.
            unsafe { release_record::<P, POOLED>(record) };
            None
        }
    }
}

/// The host function the driver calls for every run-once launch of this crate: `userData` is the
/// launch's ticket id (see [`tickets`](crate::tickets)).
///
/// Claims the launch (one compare-and-swap on its ticket: from then on neither a reclaim nor a
/// later call can take it), runs the record's payload, then pushes the record onto the cleanup
/// queue, unless its launcher still holds it (see [`launch_state`](crate::launch_state)). Takes no lock, allocates
/// nothing, calls no CUDA function and never drops an owner.
///
/// # Safety
/// Called by the driver only, with the `userData` of a launch made by this crate.
pub(crate) unsafe extern "C" fn trampoline(user_data: *mut c_void) {
    let Some(id) = TicketId::from_user_data(user_data) else {
        return;
    };
    let Some(ticket) = tickets::ticket(id.index()) else {
        return;
    };
    // A call of a launch that ran already, was reclaimed, or is over (a replay of a graph that
    // captured a run-once launch, after the first) is not this call's to run: it touches nothing
    // but the ticket, which is never freed.
    let Claim::Run(claim) = ticket.state.claim_run(id.generation()) else {
        return;
    };
    let Some(header) = ticket.record() else {
        return;
    };
    {
        let _scope = HostFunctionScope::enter();
        // SAFETY: the claim above makes the launch's live record ours to run, once, on this
        // thread.
        unsafe { RecordHeader::dispatch(header, Op::Run) };
    }
    if ticket.state.run_over(id.generation(), claim) {
        // SAFETY: ownership passes to the cleanup queue (no one else holds the record any more).
        unsafe { cleanup::push(header) };
    }
}

/// A raw launch: `f(user_data)`, with owners kept alive until it has returned.
pub(crate) struct RawPayload<O> {
    pub(crate) f: unsafe extern "C" fn(*mut c_void),
    pub(crate) user_data: *mut c_void,
    #[allow(
        dead_code,
        reason = "held only so it is dropped after the run, with the record"
    )]
    pub(crate) owners: O,
}

// SAFETY: `launch_host_function`'s contract makes the caller promise that `f(user_data)` may run on
// another thread; the owners are `Send` by the bound.
unsafe impl<O: Send> Send for RawPayload<O> {}

impl<O: Send + 'static> RawPayload<O> {
    /// The payload of a raw launch or node; for a null `f`, [`Error::NullFunction`](crate::Error)
    /// with the owners already released (off a driver thread, see [`cleanup::defer_drop`]).
    pub(crate) fn new(
        f: cuda_sys::types::CUhostFn,
        user_data: *mut c_void,
        owners: O,
    ) -> Result<Self, crate::Error> {
        let Some(f) = f else {
            cleanup::defer_drop(owners);
            return Err(crate::Error::NullFunction);
        };
        Ok(RawPayload {
            f,
            user_data,
            owners,
        })
    }
}

impl<O: Send + 'static> Payload for RawPayload<O> {
    unsafe fn run(&mut self) {
        // SAFETY: the launch's caller promised `f(user_data)` is sound to call once, here, and that
        // `f` does not unwind (an `extern "C"` function that panics aborts instead).
        unsafe { (self.f)(self.user_data) }
    }
}

/// A closure launch: the closure (its captures are the owners) is called once through `&mut`, so
/// the captures outlive the call and are dropped with the record, off the driver's thread.
pub(crate) struct ClosurePayload<F> {
    pub(crate) f: F,
    pub(crate) panic: Option<PanicPayload>,
}

impl<F: FnMut() + Send + 'static> Payload for ClosurePayload<F> {
    unsafe fn run(&mut self) {
        // A panic must not unwind into the driver: catch it and keep it for the reaper to report.
        if let Err(panic) = catch_unwind(AssertUnwindSafe(&mut self.f)) {
            self.panic = Some(panic);
        }
    }

    fn take_panic(&mut self) -> Option<PanicPayload> {
        self.panic.take()
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
) -> Option<OwnedRecord> {
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
    Some(OwnedRecord(record.cast()))
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
        Op::TakePanic => None,
        Op::Release => {
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
pub(crate) fn new_shared_record<P: SharedPayload>(payload: P) -> OwnedRecord {
    place(
        payload,
        Some(dispatch_shared::<P, true>),
        dispatch_shared::<P, false>,
    )
}

/// Puts a graph host node's payload into a record: always a `Box`. It lives as long as its graph,
/// and in the pool it would hold a whole segment of slots that launches around it used and freed
/// (see `record_pool.rs`).
pub(crate) fn new_node_record<P: SharedPayload>(payload: P) -> OwnedRecord {
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
        Op::TakePanic => None,
        Op::Release => {
            // SAFETY: made with this POOLED; released once, after the last run.
            unsafe { release_record::<P, POOLED>(record) };
            None
        }
    }
}

/// A closure that may run many times: panics are caught on every run and sent to the cleanup queue
/// to be reported.
pub(crate) struct RepeatableClosure<F>(pub(crate) F);

impl<F: Fn() + Send + Sync + 'static> SharedPayload for RepeatableClosure<F> {
    unsafe fn run_shared(&self) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(&self.0)) {
            // Allocating here is fine: the panic machinery has just allocated the payload too.
            let carrier = new_record(PanicCarrier(Some(panic)));
            // SAFETY: a fresh record, handed to the queue, which reports and frees it.
            unsafe { cleanup::push(carrier.into_raw()) };
        }
    }
}

impl<O: Send + Sync + 'static> SharedPayload for RawPayload<O> {
    unsafe fn run_shared(&self) {
        // SAFETY: the repeatable launch's caller promised `f(user_data)` is sound to call any
        // number of times, from any driver thread, and does not unwind.
        unsafe { (self.f)(self.user_data) }
    }
}

// SAFETY: the repeatable launch's contract makes the caller promise that `f(user_data)` may run on
// several threads at once; the owners are `Sync` by the bound.
unsafe impl<O: Sync> Sync for RawPayload<O> {}

/// Carries a panic caught in a repeatable closure to the thread that reports it.
struct PanicCarrier(Option<PanicPayload>);

impl Payload for PanicCarrier {
    unsafe fn run(&mut self) {}

    fn take_panic(&mut self) -> Option<PanicPayload> {
        self.0.take()
    }
}

/// The host function for repeatable records: runs the payload and keeps the record (its graph owns
/// it and releases it through [`user_object_destructor`]).
///
/// # Safety
/// Called by the driver only, with the `userData` of a node made by this crate.
pub(crate) unsafe extern "C" fn trampoline_repeatable(user_data: *mut c_void) {
    let Some(header) = NonNull::new(user_data.cast::<RecordHeader>()) else {
        return;
    };
    let _scope = HostFunctionScope::enter();
    // SAFETY: the record is live while its graph is; repeatable records run through `&self`.
    unsafe { RecordHeader::dispatch(header, Op::Run) };
}

/// The destructor of the user object that ties a repeatable record to its graph: the driver calls it
/// (on a thread of its own) once the graph and every executable graph made from it are gone. It
/// only queues the record: no lock, no allocation, no CUDA call.
///
/// # Safety
/// Called by the driver only, with the pointer given to `cuUserObjectCreate`.
pub(crate) unsafe extern "C" fn user_object_destructor(user_data: *mut c_void) {
    if let Some(header) = NonNull::new(user_data.cast::<RecordHeader>()) {
        // SAFETY: the last reference is gone, so nothing runs the record any more; it is ours.
        unsafe { cleanup::push(header) };
    }
}

/// A value to drop off the driver's thread (see [`crate::defer_drop`]).
pub(crate) struct DeferredDrop<T>(pub(crate) T);

impl<T: Send + 'static> Payload for DeferredDrop<T> {
    unsafe fn run(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_as_small_as_their_contents_allow() {
        assert_eq!(size_of::<RecordHeader>(), 24);
        assert_eq!(size_of::<Record<RawPayload<()>>>(), 40);
        let (layout, offset) = bytes_layout(24).unwrap();
        assert_eq!(offset % BYTES_ALIGN, 0);
        assert!(layout.size() >= offset + 24);
    }
}
