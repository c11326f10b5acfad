//! Memory allocations and what an address is.
//!
//! Device memory (`cuMemAlloc`), stream-ordered device memory (`cuMemAllocAsync`, see
//! `stream_alloc.rs`) and page-locked host memory (`cuMemHostAlloc`, `cuMemAllocHost`) are all
//! zeroed host memory, and a device pointer is the host address (as under unified addressing,
//! where the device pointer of page-locked memory is its host pointer). Each allocation belongs to
//! the context current at the call (the stream's, for `cuMemAllocAsync`), and goes with it: a
//! context destroyed, or a primary context's last release or reset, frees its allocations, as the
//! real driver does. Host ranges registered with `cuMemHostRegister` are kept here too.
//!
//! Copies and sets (`memory_op.rs`) ask [`classify`] what an address is: device memory,
//! page-locked host memory (allocated or registered: the device reaches it, so a copy reads or
//! writes it when the stream gets there), or pageable host memory (anything else).

use std::alloc::Layout;
use std::ffi::{c_uint, c_void};
use std::sync::{Mutex, MutexGuard};

use cuda_dl_sys::types::{CUdeviceptr, CUresult};

use crate::context::current;
use crate::errors::{INVALID_VALUE, OUT_OF_MEMORY, Res, ensure};
use crate::state::{State, as_ptr, lock, relock};

/// Alignment of every allocation (the real driver's is at least 256 for device memory).
const ALIGN: usize = 256;

/// What made an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `cuMemAlloc`.
    Device,
    /// `cuMemAllocAsync`: device memory whose free may be stream-ordered.
    StreamOrdered,
    /// `cuMemHostAlloc` or `cuMemAllocHost`: page-locked host memory.
    PinnedHost,
}

impl Kind {
    /// Whether it is device memory (`cuMemFree`/`cuMemFreeAsync` free it, `cuMemGetInfo` counts it).
    pub(crate) fn is_device(self) -> bool {
        matches!(self, Kind::Device | Kind::StreamOrdered)
    }
}

/// One allocation, at the address that keys it in [`State::allocations`].
pub(crate) struct Allocation {
    pub(crate) size: usize,
    pub(crate) kind: Kind,
    /// The context it belongs to.
    pub(crate) ctx: usize,
    /// A `cuMemFreeAsync` of it is queued: it lives until the stream gets there, but cannot be
    /// freed again.
    pub(crate) freeing: bool,
    /// Freed by the user while queued copies or sets still use it: unknown to every call from
    /// now on, and released once the last of them has run (as the real driver's free waits for
    /// the device before it unmaps the memory).
    freed: bool,
    /// Queued copies and sets that use it ([`hold`], [`let_go`]).
    uses: usize,
}

/// The allocation that contains `addr` and that the user has not freed: its start and itself.
fn containing(st: &State, addr: usize) -> Option<(usize, &Allocation)> {
    st.allocations
        .range(..=addr)
        .next_back()
        .filter(|(start, a)| !a.freed && addr < *start + a.size)
        .map(|(start, a)| (*start, a))
}

/// Device memory in use on `device` (the allocations of its contexts), for `cuMemGetInfo` and the
/// out-of-memory check.
fn device_bytes_in_use(st: &State, device: i32) -> usize {
    st.allocations
        .values()
        .filter(|a| a.kind.is_device())
        .filter(|a| st.contexts.get(&a.ctx).is_some_and(|c| c.device == device))
        .map(|a| a.size)
        .sum()
}

/// Allocates `size` zeroed bytes of `kind` in `ctx` (a live context): its address. Device memory
/// beyond what the device has (`cuDeviceTotalMem`) is `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn allocate(
    st: &mut State,
    ctx: usize,
    size: usize,
    kind: Kind,
) -> Result<usize, CUresult> {
    ensure(size > 0, INVALID_VALUE)?;
    if kind.is_device() {
        let device = st.contexts.get(&ctx).map_or(0, |c| c.device);
        let used = device_bytes_in_use(st, device);
        ensure(
            used.checked_add(size)
                .is_some_and(|total| total <= crate::device::TOTAL_MEMORY),
            OUT_OF_MEMORY,
        )?;
    }
    let layout = Layout::from_size_align(size, ALIGN).map_err(|_| OUT_OF_MEMORY)?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    ensure(!p.is_null(), OUT_OF_MEMORY)?;
    let addr = p.expose_provenance();
    st.allocations.insert(
        addr,
        Allocation {
            size,
            kind,
            ctx,
            freeing: false,
            freed: false,
            uses: 0,
        },
    );
    Ok(addr)
}

/// Frees the allocation at `start` now, or, if queued copies or sets still use it, once the last
/// of them has run (it is unknown to every call meanwhile).
pub(crate) fn drop_allocation(st: &mut State, start: usize) {
    let Some(allocation) = st.allocations.get_mut(&start) else {
        return;
    };
    if allocation.uses > 0 {
        allocation.freed = true;
        return;
    }
    let Some(allocation) = st.allocations.remove(&start) else {
        return;
    };
    if allocation.kind == Kind::PinnedHost && allocation.ctx == RETIRING {
        relock(&RETIRED).push(start);
        return;
    }
    if let Ok(layout) = Layout::from_size_align(allocation.size, ALIGN) {
        // SAFETY: `start` came from `alloc_zeroed` with this layout (see `allocate`) and is freed
        // only once: it has just left the registry.
        unsafe { std::alloc::dealloc(as_ptr(start), layout) };
    }
}

/// A queued copy or set that uses the allocation at `start` keeps it allocated until
/// [`let_go`].
pub(crate) fn hold(st: &mut State, start: usize) {
    if let Some(allocation) = st.allocations.get_mut(&start) {
        allocation.uses += 1;
    }
}

/// The copy or set that [`hold`] the allocation at `start` has run (or will never run); a freed
/// allocation goes once nothing uses it. `false` if it is gone already (destroyed with a context
/// while the operation waited in another one's stream).
pub(crate) fn let_go(st: &mut State, start: usize) -> bool {
    let Some(allocation) = st.allocations.get_mut(&start) else {
        return false;
    };
    allocation.uses = allocation.uses.saturating_sub(1);
    if allocation.uses == 0 && allocation.freed {
        drop_allocation(st, start);
    }
    true
}

/// Frees the allocation at `addr`, which must be one of device memory (`device`) or of page-locked
/// host memory, not freed or being freed already; else `CUDA_ERROR_INVALID_VALUE`.
fn free(st: &mut State, addr: usize, device: bool) -> Res {
    let freeable = st
        .allocations
        .get(&addr)
        .is_some_and(|a| a.kind.is_device() == device && !a.freeing && !a.freed);
    ensure(freeable, INVALID_VALUE)?;
    drop_allocation(st, addr);
    Ok(())
}

/// Marks the device allocation at `addr` as being freed by a queued `cuMemFreeAsync`; else
/// `CUDA_ERROR_INVALID_VALUE` (not device memory, or freed or being freed already).
pub(crate) fn begin_free(st: &mut State, addr: usize) -> Res {
    let allocation = st
        .allocations
        .get_mut(&addr)
        .filter(|a| a.kind.is_device() && !a.freeing && !a.freed)
        .ok_or(INVALID_VALUE)?;
    allocation.freeing = true;
    Ok(())
}

/// Page-locked host memory of destroyed contexts: out of the registry, but never freed, so that a
/// test's stray access through a host pointer it kept reads memory rather than crashing (the real
/// driver unmaps it). Kept reachable for leak checkers.
static RETIRED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// The owner [`forget_allocations`] gives page-locked memory it retires (no context has it).
const RETIRING: usize = 0;

/// Drops the allocations of `ctx` (it is being destroyed or reset, its own work done): device
/// memory is freed, page-locked host memory retired (each once no queued work of another context
/// uses it).
pub(crate) fn forget_allocations(st: &mut State, ctx: usize) {
    let mine: Vec<usize> = st
        .allocations
        .iter()
        .filter(|(_, a)| a.ctx == ctx)
        .map(|(start, _)| *start)
        .collect();
    for start in mine {
        if let Some(allocation) = st.allocations.get_mut(&start)
            && allocation.kind == Kind::PinnedHost
        {
            allocation.ctx = RETIRING;
        }
        drop_allocation(st, start);
    }
}

/// Live allocations of device memory (`device`) or of page-locked host memory, those freed while
/// queued work still uses them included.
pub(crate) fn allocation_count(st: &State, device: bool) -> usize {
    st.allocations
        .values()
        .filter(|a| a.kind.is_device() == device)
        .count()
}

/// What an address range is, for a copy or a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Memory {
    /// Inside the device allocation that starts at this address.
    Device(usize),
    /// Inside the page-locked host allocation that starts at this address.
    PinnedHost(usize),
    /// Inside a range registered in the context (`cuMemHostRegister`).
    Registered,
    /// Anything else: host memory the driver knows nothing about.
    Pageable,
}

impl Memory {
    /// Whether the device reaches it (device or page-locked memory).
    pub(crate) fn device_accessible(self) -> bool {
        self != Memory::Pageable
    }

    /// Whether it is device memory.
    pub(crate) fn is_device(self) -> bool {
        matches!(self, Memory::Device(_))
    }

    /// The allocation it lies in, if any.
    pub(crate) fn allocation(self) -> Option<usize> {
        match self {
            Memory::Device(start) | Memory::PinnedHost(start) => Some(start),
            Memory::Registered | Memory::Pageable => None,
        }
    }
}

/// What `[addr, addr + len)` is for a copy or set in `ctx`. A range that starts inside an
/// allocation but does not fit in it is `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn classify(
    st: &State,
    ctx: usize,
    addr: usize,
    len: usize,
) -> Result<Memory, CUresult> {
    if let Some((start, a)) = containing(st, addr) {
        let fits = addr
            .checked_add(len)
            .is_some_and(|end| end <= start + a.size);
        ensure(fits, INVALID_VALUE)?;
        return Ok(if a.kind.is_device() {
            Memory::Device(start)
        } else {
            Memory::PinnedHost(start)
        });
    }
    if len > 0 && registered_in(ctx, addr, len) {
        return Ok(Memory::Registered);
    }
    Ok(Memory::Pageable)
}

/// Whether the device can reach `[addr, addr + len)` in `ctx` now: memory of `cuMemAlloc`,
/// `cuMemAllocAsync` or `cuMemHostAlloc` that the user has not freed (any context: a
/// simplification), or host memory registered in `ctx` itself.
pub(crate) fn accessible(st: &State, ctx: usize, addr: usize, len: usize) -> bool {
    let allocated = containing(st, addr).is_some_and(|(start, a)| {
        addr.checked_add(len)
            .is_some_and(|end| end <= start + a.size)
    });
    allocated || registered_in(ctx, addr, len)
}

export!("cuMemHostAlloc", cuMemHostAlloc => mem_host_alloc(pp: *mut *mut c_void, bytesize: usize, Flags: c_uint));
unsafe fn mem_host_alloc(pp: *mut *mut c_void, size: usize, _flags: c_uint) -> Res {
    ensure(!pp.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let ctx = current(&st)?;
    let addr = allocate(&mut st, ctx, size, Kind::PinnedHost)?;
    // SAFETY: non-null, and the caller passes a valid place for a pointer.
    unsafe { pp.write(as_ptr(addr)) };
    Ok(())
}

export!("cuMemAllocHost", cuMemAllocHost_v2 => mem_alloc_host(pp: *mut *mut c_void, bytesize: usize));
/// `cuMemHostAlloc` with no flags.
unsafe fn mem_alloc_host(pp: *mut *mut c_void, size: usize) -> Res {
    // SAFETY: the same contract.
    unsafe { mem_host_alloc(pp, size, 0) }
}

export!("cuMemFreeHost", cuMemFreeHost => mem_free_host(p: *mut c_void));
unsafe fn mem_free_host(p: *mut c_void) -> Res {
    free(&mut lock(), p.addr(), false)
}

/// Host ranges registered with `cuMemHostRegister`: start -> (length, the context current at the
/// registration). Like the real driver's, a registration belongs to its context: destroying the
/// context, or the last release or a reset of a primary one, drops it ([`forget_registrations`]).
static REGISTERED: Mutex<Registrations> = Mutex::new(std::collections::BTreeMap::new());

type Registrations = std::collections::BTreeMap<usize, (usize, usize)>;

fn registrations() -> MutexGuard<'static, Registrations> {
    relock(&REGISTERED)
}

/// Whether `p` lies in a registered range (of any context).
fn registered(p: usize) -> bool {
    registrations()
        .range(..=p)
        .next_back()
        .is_some_and(|(start, (len, _))| p < start + len)
}

/// Whether `[p, p + len)` lies in one range registered in `ctx`.
pub(crate) fn registered_in(ctx: usize, p: usize, len: usize) -> bool {
    registrations()
        .range(..=p)
        .next_back()
        .is_some_and(|(start, (size, owner))| {
            *owner == ctx && p.checked_add(len).is_some_and(|end| end <= start + size)
        })
}

/// Drops the registrations made in `ctx` (it is being destroyed or reset).
pub(crate) fn forget_registrations(ctx: usize) {
    registrations().retain(|_, (_, owner)| *owner != ctx);
}

/// Host ranges registered now.
pub(crate) fn registration_count() -> usize {
    registrations().len()
}

export!("cuMemHostRegister", cuMemHostRegister_v2 => mem_host_register(p: *mut c_void, bytesize: usize, Flags: c_uint));
unsafe fn mem_host_register(p: *mut c_void, size: usize, _flags: c_uint) -> Res {
    ensure(!p.is_null() && size > 0, INVALID_VALUE)?;
    let ctx = current(&lock())?;
    let mut map = registrations();
    // (The real driver says CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, 712.)
    ensure(!map.contains_key(&p.addr()), INVALID_VALUE)?;
    map.insert(p.expose_provenance(), (size, ctx));
    Ok(())
}

export!("cuMemHostUnregister", cuMemHostUnregister => mem_host_unregister(p: *mut c_void));
unsafe fn mem_host_unregister(p: *mut c_void) -> Res {
    ensure(registrations().remove(&p.addr()).is_some(), INVALID_VALUE)
}

export!("cuMemHostGetDevicePointer", cuMemHostGetDevicePointer_v2 => mem_host_get_device_pointer(pdptr: *mut CUdeviceptr, p: *mut c_void, Flags: c_uint));
/// The device pointer of page-locked memory is its host address (unified addressing).
unsafe fn mem_host_get_device_pointer(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> Res {
    ensure(!pdptr.is_null() && flags == 0, INVALID_VALUE)?;
    let st = lock();
    let allocated = containing(&st, p.addr()).is_some_and(|(_, a)| a.kind == Kind::PinnedHost);
    ensure(allocated || registered(p.addr()), INVALID_VALUE)?;
    // SAFETY: non-null, and the caller passes a valid place for a device pointer.
    unsafe { pdptr.write(p.expose_provenance() as CUdeviceptr) };
    Ok(())
}

export!("cuMemAlloc", cuMemAlloc_v2 => mem_alloc(dptr: *mut CUdeviceptr, bytesize: usize));
unsafe fn mem_alloc(dptr: *mut CUdeviceptr, size: usize) -> Res {
    ensure(!dptr.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let ctx = current(&st)?;
    let addr = allocate(&mut st, ctx, size, Kind::Device)?;
    // SAFETY: non-null, and the caller passes a valid place for a device pointer.
    unsafe { dptr.write(addr as CUdeviceptr) };
    Ok(())
}

export!("cuMemFree", cuMemFree_v2 => mem_free(dptr: CUdeviceptr));
/// Returns at once: the memory is unknown to later calls, and goes once queued copies and sets
/// that use it have run (see `memory_op.rs`). A stream-ordered allocation may be freed so too.
unsafe fn mem_free(dptr: CUdeviceptr) -> Res {
    free(&mut lock(), dptr as usize, true)
}

export!("cuMemGetInfo", cuMemGetInfo_v2 => mem_get_info(free: *mut usize, total: *mut usize));
/// The current context's device: its memory (`cuDeviceTotalMem`) and what its contexts' device
/// allocations leave of it.
unsafe fn mem_get_info(free: *mut usize, total: *mut usize) -> Res {
    ensure(!free.is_null() && !total.is_null(), INVALID_VALUE)?;
    let st = lock();
    let ctx = current(&st)?;
    let device = st.contexts.get(&ctx).map_or(0, |c| c.device);
    let all = crate::device::TOTAL_MEMORY;
    let left = all.saturating_sub(device_bytes_in_use(&st, device));
    // SAFETY: both non-null, and the caller passes valid places for sizes.
    unsafe {
        free.write(left);
        total.write(all);
    }
    Ok(())
}
