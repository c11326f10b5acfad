//! Copies, sets and stream-ordered frees as stream operations: when a call enqueues one, what it
//! reads at once, whether it waits, and what the context's driver thread does when the stream gets
//! there.
//!
//! Every copy and set, synchronous or not, is an operation of a stream (the `Async` calls' stream;
//! the calling thread's default stream, legacy or per-thread, for the others), run in stream order
//! by the context's driver thread like its other work. What each call waits for follows the Driver
//! API reference's "API synchronization behavior":
//!
//! - synchronous copies return once the copy is done, except device to device; synchronous sets
//!   return once done when they set page-locked host memory (device memory: at once);
//! - `Async` copies return at once, except into pageable host memory and from host to host memory
//!   (they return once the copy is done); `Async` sets return at once;
//! - a copy from pageable host memory that returns at once first copies the source (the driver's
//!   staging buffer), so the caller may reuse it as soon as the call returns; page-locked memory
//!   and device memory are read when the stream gets there.
//!
//! Device and page-locked memory that a queued operation uses stays allocated until it has run: a
//! free meanwhile (`cuMemFree`, `cuMemFreeHost`, another stream's `cuMemFreeAsync`) makes the
//! memory unknown to every later call at once, and releases it once the operation is done, as the
//! real driver's free waits for the device before it unmaps the memory. Host memory registered
//! with `cuMemHostRegister` must still be registered when the operation runs: if not, the
//! operation does nothing and the context gets a sticky error, as the device's illegal-address
//! fault gives.
//!
//! Inside a stream capture, an `Async` copy or set between memory the device reaches (device,
//! page-locked or registered memory) becomes a memcpy or memset node of the capture's graph, as
//! on the real driver: nothing happens at the call, and each launch of the graph copies or sets
//! again, reading the source then (memory freed or unregistered since is the device's illegal
//! address, a sticky error, at the launch). Not modelled there, and so
//! `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` with the capture invalidated: the synchronous calls, a
//! copy to or from pageable host memory, and the stream-ordered allocator.

use std::sync::{Arc, MutexGuard};

use cuda_dl_sys::types::{CUresult, CUstream};

use crate::capture;
use crate::errors::{
    CAPTURE_UNSUPPORTED, INVALID_VALUE, LAUNCH_FAILED, NOT_PERMITTED, Res, ensure, result,
};
use crate::memory::{Memory, classify, drop_allocation, hold, let_go, registered_in};
use crate::scheduler::{enqueue, on_worker_of};
use crate::state::{NodeKind, Op, Record, State, as_ptr, lock, wait};
use crate::stream::resolve;

/// One side of a queued copy or set: its address, and what it was at the call (an allocation it
/// keeps allocated until the operation has run, a registered range, or pageable memory).
pub(crate) struct Side {
    addr: usize,
    memory: Memory,
}

/// Where a queued copy reads.
pub(crate) enum Source {
    /// Memory read when the stream gets there.
    At(Side),
    /// Pageable host memory, copied at the call.
    Staged(Vec<u8>),
}

/// A stream-ordered memory operation.
pub(crate) enum MemoryOp {
    /// `len` bytes from `src` to `dst` (which may overlap: `cuMemcpyDtoD` within one buffer).
    Copy { dst: Side, src: Source, len: usize },
    /// `count` values of `width` bytes (1, 2 or 4; `dst` aligned to it) set to `value`.
    Set {
        dst: Side,
        value: u32,
        width: usize,
        count: usize,
    },
    /// `cuMemFreeAsync`: the allocation at `addr` (marked as being freed) goes.
    Free { addr: usize },
}

/// Which kind of call makes the operation: a synchronous one (on the calling thread's default
/// stream) or an `Async` one on this stream.
#[derive(Clone, Copy)]
pub(crate) enum Call {
    Sync,
    Async(CUstream),
}

/// What a function's name promises about an address: device memory (`dstDevice`), host memory
/// (`srcHost`), or either (`cuMemcpy`'s unified addresses).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    Device,
    Host,
    Any,
}

/// An address a call was given, and what its name promises about it.
#[derive(Clone, Copy)]
pub(crate) struct Place {
    pub(crate) addr: usize,
    pub(crate) expect: Expect,
}

/// A device address (`CUdeviceptr`).
pub(crate) fn device(addr: u64) -> Place {
    Place {
        addr: addr as usize,
        expect: Expect::Device,
    }
}

/// A host pointer; its address is exposed for the driver thread's later access.
pub(crate) fn host<T>(p: *const T) -> Place {
    Place {
        addr: p.expose_provenance(),
        expect: Expect::Host,
    }
}

/// An address of either kind (unified addressing).
pub(crate) fn unified(addr: u64) -> Place {
    Place {
        addr: addr as usize,
        expect: Expect::Any,
    }
}

type Guard = MutexGuard<'static, State>;

/// What `place` is, for `len` bytes in `ctx`: `CUDA_ERROR_INVALID_VALUE` if the name promises
/// device memory and it is not memory the device reaches, if it is null, or if it starts in an
/// allocation and runs past its end.
fn check(st: &State, ctx: usize, place: Place, len: usize) -> Result<Memory, CUresult> {
    ensure(place.addr != 0, INVALID_VALUE)?;
    let memory = classify(st, ctx, place.addr, len)?;
    if place.expect == Expect::Device {
        ensure(memory.device_accessible(), INVALID_VALUE)?;
    }
    Ok(memory)
}

/// The stream a call works on, after the checks every call makes: a live stream (or the default
/// stream of a current context); with whether it is capturing, which only an `Async` call may
/// be (a synchronous one then invalidates the capture).
fn stream_of(
    st: &mut State,
    call: Call,
    per_thread: bool,
) -> Result<(usize, usize, bool), CUresult> {
    let handle = match call {
        Call::Sync => std::ptr::null_mut(),
        Call::Async(stream) => stream,
    };
    let s = resolve(st, handle, per_thread)?;
    let capturing = capture::is_capturing(st, s);
    if capturing && matches!(call, Call::Sync) {
        return Err(unsupported_in_capture(st, s));
    }
    let ctx = st.streams.get(&s).map_or(0, |stream| stream.ctx);
    Ok((s, ctx, capturing))
}

/// What the fake does not model in a capture: the capture of `stream` is invalidated, and the
/// call returns `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
fn unsupported_in_capture(st: &mut State, stream: usize) -> CUresult {
    capture::invalidate(st, stream);
    CAPTURE_UNSUPPORTED
}

/// Adds the node of a captured copy or set to the graph `stream` captures into.
fn captured(st: &mut State, stream: usize, kind: NodeKind) -> Res {
    capture::add_node(st, stream, kind).unwrap_or(Err(CAPTURE_UNSUPPORTED))
}

/// A copy of `len` bytes from `src` to `dst` (see the module's documentation for when it waits and
/// what it reads at once).
pub(crate) fn copy(call: Call, per_thread: bool, dst: Place, src: Place, len: usize) -> Res {
    let mut st = lock();
    let (s, ctx, capturing) = stream_of(&mut st, call, per_thread)?;
    if len == 0 {
        return Ok(());
    }
    let to = check(&st, ctx, dst, len)?;
    let from = check(&st, ctx, src, len)?;
    if capturing {
        if !(to.device_accessible() && from.device_accessible()) {
            return Err(unsupported_in_capture(&mut st, s));
        }
        let kind = NodeKind::Memcpy {
            dst: dst.addr,
            src: src.addr,
            len,
        };
        return captured(&mut st, s, kind);
    }
    let host = |m: Memory| !m.is_device();
    let waits = match call {
        Call::Sync => host(to) || host(from),
        Call::Async(_) => to == Memory::Pageable || (host(to) && host(from)),
    };
    let source = if from == Memory::Pageable && !waits {
        // SAFETY: the caller passes `len` readable bytes at `src` (checked non-null), which it may
        // reuse once the call returns: they are copied now, as the driver stages them.
        let bytes = unsafe { std::slice::from_raw_parts(as_ptr::<u8>(src.addr), len) };
        Source::Staged(bytes.to_vec())
    } else {
        Source::At(side(&mut st, src.addr, from))
    };
    let op = MemoryOp::Copy {
        dst: side(&mut st, dst.addr, to),
        src: source,
        len,
    };
    submit(st, s, ctx, op, waits)
}

/// The side of a queued operation at `addr`, which is `memory`: an allocation is kept until the
/// operation has run.
fn side(st: &mut State, addr: usize, memory: Memory) -> Side {
    if let Some(start) = memory.allocation() {
        hold(st, start);
    }
    Side { addr, memory }
}

/// A set of `count` values of `width` bytes at `dst` to `value` (`dst` aligned to `width`).
pub(crate) fn set(
    call: Call,
    per_thread: bool,
    dst: u64,
    value: u32,
    width: usize,
    count: usize,
) -> Res {
    let mut st = lock();
    let (s, ctx, capturing) = stream_of(&mut st, call, per_thread)?;
    let len = count.checked_mul(width).ok_or(INVALID_VALUE)?;
    if len == 0 {
        return Ok(());
    }
    let dst = device(dst);
    ensure(dst.addr.is_multiple_of(width), INVALID_VALUE)?;
    let to = check(&st, ctx, dst, len)?;
    if capturing {
        // (`check` made sure the device reaches it.)
        let kind = NodeKind::Memset {
            dst: dst.addr,
            value,
            width,
            count,
        };
        return captured(&mut st, s, kind);
    }
    let waits = matches!(call, Call::Sync) && !to.is_device();
    let op = MemoryOp::Set {
        dst: side(&mut st, dst.addr, to),
        value,
        width,
        count,
    };
    submit(st, s, ctx, op, waits)
}

/// The queued free of a `cuMemFreeAsync` of the allocation at `addr`.
pub(crate) fn free(addr: usize) -> Op {
    Op::Memory(MemoryOp::Free { addr })
}

/// Enqueues `op` on `stream` of `ctx`, and if the call `waits`, waits until the stream has run it:
/// `CUDA_ERROR_LAUNCH_FAILED` if the context has a sticky error, `CUDA_ERROR_NOT_PERMITTED` on the
/// context's own driver thread (a host function), which cannot wait for its own streams.
fn submit(mut st: Guard, stream: usize, ctx: usize, op: MemoryOp, waits: bool) -> Res {
    if !waits {
        return result(enqueue(&mut st, stream, Op::Memory(op)));
    }
    if on_worker_of(ctx) {
        discard(&mut st, op);
        return Err(NOT_PERMITTED);
    }
    result(enqueue(&mut st, stream, Op::Memory(op)))?;
    let record = Arc::new(Record::default());
    result(enqueue(
        &mut st,
        stream,
        Op::Record {
            record: Arc::clone(&record),
        },
    ))?;
    loop {
        if record.done() {
            return Ok(());
        }
        match st.contexts.get(&ctx) {
            Some(c) if c.reports_poison() => return Err(LAUNCH_FAILED),
            Some(_) => st = wait(st),
            // Gone: its pending work ran (or was dropped) first.
            None => return Ok(()),
        }
    }
}

/// Whether `side`, `len` bytes long, can still be used when the operation runs in `ctx`: an
/// allocation is (the operation kept it), a registered range must still be registered.
fn reachable(ctx: usize, side: &Side, len: usize) -> bool {
    side.memory != Memory::Registered || registered_in(ctx, side.addr, len)
}

/// Lets go of the allocations `op` kept; `false` if one was gone already (destroyed with its
/// context while the operation waited in another context's stream).
fn let_go_of(st: &mut State, op: &MemoryOp) -> bool {
    let sides: [Option<&Side>; 2] = match op {
        MemoryOp::Copy { dst, src, .. } => [
            Some(dst),
            match src {
                Source::At(side) => Some(side),
                Source::Staged(_) => None,
            },
        ],
        MemoryOp::Set { dst, .. } => [Some(dst), None],
        MemoryOp::Free { .. } => [None, None],
    };
    let mut all_there = true;
    for start in sides
        .into_iter()
        .flatten()
        .filter_map(|s| s.memory.allocation())
    {
        all_there &= let_go(st, start);
    }
    all_there
}

/// Runs `op` on the driver thread of `ctx`, the fake's lock held (`st`). `false` if it uses memory
/// the device no longer reaches (a registration dropped since the call): nothing is written, and
/// the caller gives the context a sticky error, as the device's illegal-address fault does.
pub(crate) fn run(st: &mut State, ctx: usize, op: MemoryOp) -> bool {
    if let MemoryOp::Free { addr } = op {
        drop_allocation(st, addr);
        return true;
    }
    // The memory stays allocated until `let_go_of` below: it is checked, then written.
    let ran = match &op {
        MemoryOp::Copy { dst, src, len } => {
            let from = match src {
                Source::At(side) => reachable(ctx, side, *len).then_some(as_ptr::<u8>(side.addr)),
                Source::Staged(bytes) => Some(bytes.as_ptr().cast_mut()),
            };
            match from {
                Some(from) if reachable(ctx, dst, *len) => {
                    // SAFETY: device and page-locked memory is allocated until `let_go_of` (and
                    // checked to hold the range at the call), registered memory is still
                    // registered (checked above), the staged bytes are `len` long; other memory is
                    // the caller's, who promised it stays valid until the copy has run (the
                    // driver's contract for asynchronous copies; a synchronous one waits). `copy`
                    // allows the overlap of a copy within one buffer.
                    unsafe { std::ptr::copy(from, as_ptr::<u8>(dst.addr), *len) };
                    true
                }
                _ => false,
            }
        }
        MemoryOp::Set {
            dst,
            value,
            width,
            count,
        } => {
            let len = count.saturating_mul(*width);
            reachable(ctx, dst, len) && {
                set_now(dst.addr, *value, *width, *count);
                true
            }
        }
        MemoryOp::Free { .. } => true,
    };
    let all_there = let_go_of(st, &op);
    ran && all_there
}

/// Writes `count` values of `width` bytes at `addr`.
pub(crate) fn set_now(addr: usize, value: u32, width: usize, count: usize) {
    match width {
        1 => {
            // SAFETY: `count` bytes at `addr`, in memory that is still allocated or registered
            // (see `run`; the range was checked at the call).
            unsafe { std::ptr::write_bytes(as_ptr::<u8>(addr), value as u8, count) }
        }
        2 => {
            let p = as_ptr::<u16>(addr);
            for i in 0..count {
                // SAFETY: as above, `count` values of 2 bytes, `addr` 2-aligned (checked at the
                // call).
                unsafe { p.add(i).write(value as u16) };
            }
        }
        _ => {
            let p = as_ptr::<u32>(addr);
            for i in 0..count {
                // SAFETY: as above, `count` values of 4 bytes, `addr` 4-aligned.
                unsafe { p.add(i).write(value) };
            }
        }
    }
}

/// Drops an operation that will never run: it lets go of the memory it kept, and a queued free
/// still frees (the context has a sticky error, or the enqueue failed), so nothing of the fake's
/// stays allocated.
pub(crate) fn discard(st: &mut State, op: MemoryOp) {
    if let MemoryOp::Free { addr } = op {
        drop_allocation(st, addr);
        return;
    }
    let_go_of(st, &op);
}
