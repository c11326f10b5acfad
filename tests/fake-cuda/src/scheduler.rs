//! The driver-owned worker thread of each context, which runs every stream-ordered operation of
//! that context, and the waits built on it.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::MutexGuard;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use cuda_dl_sys::types::CUresult;

use crate::errors::{LAUNCH_FAILED, NOT_PERMITTED, SUCCESS, UNKNOWN};
use crate::state::{Action, Op, State, as_ptr, lock, notify, wait, wait_timeout};
use crate::user_object;

type Guard = MutexGuard<'static, State>;

/// Context worker threads started and not yet finished.
pub(crate) static WORKERS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The context whose worker this thread is (0 on every other thread).
    static WORKER_OF: Cell<usize> = const { Cell::new(0) };
}

/// Whether the calling thread is the worker of `ctx` (running one of its host functions).
pub(crate) fn on_worker_of(ctx: usize) -> bool {
    WORKER_OF.with(Cell::get) == ctx
}

/// Appends `op` to `stream` (valid, not capturing), starting the context's worker if needed. On a
/// poisoned context the operation is dropped, and the call succeeds until the error has surfaced
/// (a synchronize or query reported it), then returns it: as the real driver does.
pub(crate) fn enqueue(st: &mut State, stream: usize, op: Op) -> CUresult {
    let Some(ctx) = st.streams.get(&stream).map(|s| s.ctx) else {
        discard(st, op);
        return SUCCESS;
    };
    let Some(c) = st.contexts.get(&ctx) else {
        discard(st, op);
        return SUCCESS;
    };
    if c.is_poisoned() {
        let refused = c.refuses_work();
        discard(st, op);
        return if refused { LAUNCH_FAILED } else { SUCCESS };
    }
    if let Err(code) = ensure_worker(st, ctx) {
        discard(st, op);
        return code;
    }
    if let Some(s) = st.streams.get_mut(&stream) {
        s.queue.push_back(op);
        let id = s.id;
        crate::oracle::enqueued(st, id);
    }
    notify();
    SUCCESS
}

fn ensure_worker(st: &mut State, ctx: usize) -> Result<(), CUresult> {
    let Some(c) = st.contexts.get_mut(&ctx) else {
        return Err(UNKNOWN);
    };
    if c.worker.is_some() {
        return Ok(());
    }
    let handle = std::thread::Builder::new()
        .name(format!("fake-cuda-driver-{}", c.id))
        .spawn(move || worker_main(ctx))
        .map_err(|_| UNKNOWN)?;
    WORKERS.fetch_add(1, Ordering::SeqCst);
    c.worker = Some(handle);
    Ok(())
}

/// Drops an operation that will never run, releasing what it holds.
pub(crate) fn discard(st: &mut State, op: Op) {
    match op {
        Op::Launch { user_objects, .. } => user_object::release_all(st, &user_objects),
        Op::Hold { token } => {
            st.holds.remove(&token);
        }
        Op::Memory(op) => crate::memory_op::discard(st, op),
        _ => {}
    }
}

/// Discards everything queued on the streams of `ctx` (after a sticky error).
pub(crate) fn drain(st: &mut State, ctx: usize) {
    let Some(c) = st.contexts.get(&ctx) else {
        return;
    };
    let mut dropped = Vec::new();
    for stream in c.streams.clone() {
        if let Some(s) = st.streams.get_mut(&stream) {
            dropped.extend(s.queue.drain(..));
        }
    }
    for op in dropped {
        discard(st, op);
    }
    forget_finished_streams(st, ctx);
    notify();
}

/// Removes destroyed streams of `ctx` whose work is all done.
fn forget_finished_streams(st: &mut State, ctx: usize) {
    let Some(c) = st.contexts.get(&ctx) else {
        return;
    };
    let finished: Vec<usize> = c
        .streams
        .iter()
        .copied()
        .filter(|s| st.streams.get(s).is_none_or(|s| s.destroyed && s.idle()))
        .collect();
    for stream in &finished {
        st.streams.remove(stream);
    }
    if let Some(c) = st.contexts.get_mut(&ctx) {
        c.streams.retain(|s| !finished.contains(s));
    }
}

/// Whether every stream of `ctx` has finished all its work.
pub(crate) fn context_idle(st: &State, ctx: usize) -> bool {
    st.contexts.get(&ctx).is_none_or(|c| {
        c.streams
            .iter()
            .all(|s| st.streams.get(s).is_none_or(|s| s.idle()))
    })
}

fn runnable(st: &State, ctx: usize, op: &Op) -> bool {
    match op {
        Op::Hold { token } => st.holds.get(token).is_none_or(|released| *released),
        Op::Wait { record } => record.done(),
        &Op::WaitValue {
            addr,
            value,
            condition,
            wide,
        } => {
            let len = if wide { 8 } else { 4 };
            // An unmapped address is "runnable": running it poisons the context, as the device's
            // illegal-address fault would.
            !mapped(st, ctx, addr, len) || wait_value_met(addr, value, condition, wide)
        }
        _ => true,
    }
}

/// Whether the word at `addr` (mapped, aligned: checked at enqueue and above) meets the
/// condition of `cuStreamWaitValue32/64`.
fn wait_value_met(addr: usize, value: u64, condition: u32, wide: bool) -> bool {
    let current = if wide {
        // SAFETY: mapped host memory of the context, 8-aligned (checked at enqueue); the host and
        // the fake's value writes access it atomically.
        unsafe { AtomicU64::from_ptr(as_ptr::<u64>(addr)) }.load(Ordering::Acquire)
    } else {
        // SAFETY: as above, 4-aligned.
        u64::from(unsafe { AtomicU32::from_ptr(as_ptr::<u32>(addr)) }.load(Ordering::Acquire))
    };
    let value = if wide { value } else { value & 0xffff_ffff };
    let mask = if wide { u64::MAX } else { 0xffff_ffff };
    match condition {
        // GEQ: a wrapping comparison, as the device makes it.
        0 if wide => (current.wrapping_sub(value) as i64) >= 0,
        0 => (current.wrapping_sub(value) as u32 as i32) >= 0,
        1 => current == value,
        2 => current & value != 0,
        3 => !(current | value) & mask != 0,
        _ => true,
    }
}

/// Whether a stream of `ctx` waits (at its head) on a memory word the host may change without
/// telling the fake: its driver thread then polls instead of sleeping until notified.
fn waits_on_memory(st: &State, ctx: usize) -> bool {
    st.contexts.get(&ctx).is_some_and(|c| {
        c.streams.iter().any(|s| {
            st.streams
                .get(s)
                .and_then(|s| s.queue.front())
                .is_some_and(|op| matches!(op, Op::WaitValue { .. }))
        })
    })
}

/// Pops the first runnable head operation of the streams of `ctx`, round robin.
fn take_runnable(st: &mut State, ctx: usize) -> Option<(usize, Op)> {
    let c = st.contexts.get(&ctx)?;
    let n = c.streams.len();
    let start = c.cursor;
    let found = (0..n).map(|i| (start + i) % n).find_map(|index| {
        let stream = c.streams[index];
        let s = st.streams.get(&stream)?;
        let head = s.queue.front()?;
        (s.running.is_none() && runnable(st, ctx, head)).then_some((index, stream))
    });
    let (index, stream) = found?;
    if let Some(c) = st.contexts.get_mut(&ctx) {
        c.cursor = index + 1;
    }
    let s = st.streams.get_mut(&stream)?;
    let op = s.queue.pop_front()?;
    s.running = Some(op.host_functions());
    Some((stream, op))
}

fn worker_main(ctx: usize) {
    WORKER_OF.with(|w| w.set(ctx));
    crate::calls::mark_driver_thread();
    let mut st = lock();
    while let Some(c) = st.contexts.get(&ctx) {
        if c.is_poisoned() {
            drain(&mut st, ctx);
        }
        let Some(c) = st.contexts.get(&ctx) else {
            break;
        };
        let poisoned = c.poisoned.clone();
        let stop = c.stop;
        match take_runnable(&mut st, ctx) {
            Some((stream, op)) => {
                let id = st.streams.get(&stream).map_or(0, |s| s.id);
                st = run(st, op, ctx, &poisoned, id);
                if let Some(s) = st.streams.get_mut(&stream) {
                    s.running = None;
                }
                forget_finished_streams(&mut st, ctx);
                notify();
            }
            None if stop => break,
            None if waits_on_memory(&st, ctx) => {
                st = wait_timeout(st, Duration::from_micros(200));
            }
            None => st = wait(st),
        }
    }
    drop(st);
    WORKERS.fetch_sub(1, Ordering::SeqCst);
    notify();
}

/// Runs one operation of the stream with id `stream_id`; host code runs with the lock released.
/// The operation counts as completed (see `oracle.rs`) once it has done its work and before it
/// lets go of what it held (a graph launch's user objects), unless a sticky error stopped it.
fn run(mut st: Guard, op: Op, ctx: usize, poisoned: &AtomicBool, stream_id: u64) -> Guard {
    let launch = matches!(op, Op::Launch { .. });
    st = run_op(st, op, ctx, poisoned, stream_id);
    if !launch && !poisoned.load(Ordering::Acquire) {
        crate::oracle::completed(&mut st, stream_id);
    }
    st
}

fn run_op(mut st: Guard, op: Op, ctx: usize, poisoned: &AtomicBool, stream_id: u64) -> Guard {
    match op {
        Op::Hold { token } => {
            st.holds.remove(&token);
        }
        Op::Record { record } => record.complete(),
        Op::Wait { .. } => {}
        Op::WaitValue { addr, wide, .. } if mapped(&st, ctx, addr, if wide { 8 } else { 4 }) => {}
        Op::WaitValue { .. } => unmapped_write(poisoned),
        Op::Write32 { addr, value } if mapped(&st, ctx, addr, 4) => write32(addr, value),
        Op::Write64 { addr, value } if mapped(&st, ctx, addr, 8) => write64(addr, value),
        Op::Write32 { .. } | Op::Write64 { .. } => unmapped_write(poisoned),
        Op::Memory(op) => {
            if !crate::memory_op::run(&mut st, ctx, op) {
                unmapped_write(poisoned);
            }
        }
        Op::HostFn { f, data } => {
            drop(st);
            if !poisoned.load(Ordering::Acquire) {
                // SAFETY: the user enqueued `f` with `data` for exactly this call, on this (the
                // driver's) thread, as cuLaunchHostFunc's contract describes.
                unsafe { f(as_ptr::<c_void>(data)) };
            }
            st = lock();
        }
        Op::Callback { f, stream, data } => {
            drop(st);
            if !poisoned.load(Ordering::Acquire) {
                // SAFETY: as for a host function: the user registered `f` with these arguments
                // through cuStreamAddCallback.
                unsafe { f(as_ptr(stream), SUCCESS, as_ptr::<c_void>(data)) };
            }
            st = lock();
        }
        Op::Launch {
            actions,
            user_objects,
        } => {
            drop(st);
            for action in actions.iter() {
                if poisoned.load(Ordering::Acquire) {
                    break;
                }
                match *action {
                    // SAFETY: the graph's host node was given `f` and `data` for calls like this
                    // one, at every launch.
                    Action::Host { f, data } => unsafe { f(as_ptr::<c_void>(data)) },
                    Action::Write32 { addr, value } if mapped(&lock(), ctx, addr, 4) => {
                        write32(addr, value)
                    }
                    Action::Write64 { addr, value } if mapped(&lock(), ctx, addr, 8) => {
                        write64(addr, value)
                    }
                    Action::Write32 { .. } | Action::Write64 { .. } => unmapped_write(poisoned),
                    Action::Memcpy { dst, src, len } => {
                        let reachable = {
                            let st = lock();
                            mapped(&st, ctx, dst, len) && mapped(&st, ctx, src, len)
                        };
                        if reachable {
                            // SAFETY: both ranges are memory the device reaches in this context
                            // (allocated or registered, checked just above), as they were at the
                            // capture; `copy` allows overlap.
                            unsafe { std::ptr::copy(as_ptr::<u8>(src), as_ptr::<u8>(dst), len) };
                        } else {
                            unmapped_write(poisoned);
                        }
                    }
                    Action::Memset {
                        dst,
                        value,
                        width,
                        count,
                    } => {
                        if mapped(&lock(), ctx, dst, count.saturating_mul(width)) {
                            crate::memory_op::set_now(dst, value, width, count);
                        } else {
                            unmapped_write(poisoned);
                        }
                    }
                }
            }
            st = lock();
            if !poisoned.load(Ordering::Acquire) {
                crate::oracle::completed(&mut st, stream_id);
            }
            user_object::release_all(&mut st, &user_objects);
        }
    }
    st
}

/// Whether the device can write `[addr, addr + len)` in `ctx` (see [`crate::memory::accessible`]).
fn mapped(st: &State, ctx: usize, addr: usize, len: usize) -> bool {
    crate::memory::accessible(st, ctx, addr, len)
}

/// A value write to an address the context has not mapped: on the real device an illegal-address
/// fault, a sticky error. The write does not happen and the context is poisoned.
fn unmapped_write(poisoned: &AtomicBool) {
    poisoned.store(true, Ordering::Release);
}

fn write32(addr: usize, value: u32) {
    // SAFETY: cuStreamWriteValue32 checked that `addr` is non-null and 4-byte aligned; the caller
    // promised it stays valid memory until the write has happened (the driver's contract).
    unsafe { AtomicU32::from_ptr(as_ptr(addr)) }.store(value, Ordering::Release);
}

fn write64(addr: usize, value: u64) {
    // SAFETY: as in `write32`, with 8-byte alignment checked.
    unsafe { AtomicU64::from_ptr(as_ptr(addr)) }.store(value, Ordering::Release);
}

/// Waits until `stream` has finished all its work (or is gone). 719 if its context is poisoned.
pub(crate) fn wait_stream(mut st: Guard, stream: usize) -> CUresult {
    loop {
        let Some(s) = st.streams.get(&stream) else {
            return SUCCESS;
        };
        let Some(c) = st.contexts.get(&s.ctx) else {
            return SUCCESS;
        };
        if c.reports_poison() {
            return LAUNCH_FAILED;
        }
        if s.idle() {
            return SUCCESS;
        }
        if on_worker_of(s.ctx) {
            return NOT_PERMITTED;
        }
        st = wait(st);
    }
}

/// Waits until every stream of `ctx` has finished all its work. 719 if it is poisoned.
pub(crate) fn wait_context(mut st: Guard, ctx: usize) -> CUresult {
    loop {
        let Some(c) = st.contexts.get(&ctx) else {
            return SUCCESS;
        };
        if c.reports_poison() {
            return LAUNCH_FAILED;
        }
        if context_idle(&st, ctx) {
            return SUCCESS;
        }
        if on_worker_of(ctx) {
            return NOT_PERMITTED;
        }
        st = wait(st);
    }
}

/// Runs (or, after a sticky error, discards) all pending work of `ctx`, then stops and joins its
/// worker. The caller has already marked the context as closing. Returns with the lock held.
pub(crate) fn shut_down(mut st: Guard, ctx: usize) -> Guard {
    loop {
        let Some(c) = st.contexts.get(&ctx) else {
            return st;
        };
        if c.is_poisoned() {
            drain(&mut st, ctx);
        }
        if context_idle(&st, ctx) {
            break;
        }
        st = wait(st);
    }
    let handle = st.contexts.get_mut(&ctx).and_then(|c| {
        c.stop = true;
        c.worker.take()
    });
    notify();
    drop(st);
    if let Some(handle) = handle {
        // The worker never panics out of its loop (host functions are `extern "C"` and abort
        // rather than unwind), so the result carries nothing.
        let _ = handle.join();
    }
    let mut st = lock();
    let streams: Vec<usize> = st
        .streams
        .iter()
        .filter(|(_, s)| s.ctx == ctx)
        .map(|(k, _)| *k)
        .collect();
    for stream in streams {
        st.streams.remove(&stream);
    }
    st.events.retain(|_, e| e.ctx != ctx);
    crate::memory::forget_registrations(ctx);
    crate::memory::forget_allocations(&mut st, ctx);
    // Before the caller, still holding the lock, gives the context a new id or removes it.
    if let Some(c) = st.contexts.get(&ctx).filter(|c| c.is_poisoned()) {
        let id = c.id;
        st.died_poisoned.insert(id);
    }
    notify();
    st
}

/// The number of host functions of `ctx` (every context if 0) enqueued and not yet finished.
pub(crate) fn pending_host_functions(st: &State, ctx: usize) -> u64 {
    st.streams
        .values()
        .filter(|s| ctx == 0 || s.ctx == ctx)
        .map(|s| s.running.unwrap_or(0) + s.queue.iter().map(Op::host_functions).sum::<u64>())
        .sum()
}
