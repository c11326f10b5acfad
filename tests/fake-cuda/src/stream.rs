//! Streams, the special handles 0 / `CU_STREAM_LEGACY` / `CU_STREAM_PER_THREAD`, and the
//! stream-ordered operations that are not events, captures or graphs.

use std::collections::VecDeque;
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use cuda_dl_sys::types::{
    CUcontext, CUdevice, CUdeviceptr, CUgreenCtx, CUhostFn, CUresult, CUstream, CUstreamCallback,
    cuuint32_t, cuuint64_t,
};

use crate::capture;
use crate::context::{check_context, current};
use crate::errors::{
    CAPTURE_UNSUPPORTED, INVALID_HANDLE, INVALID_VALUE, LAUNCH_FAILED, NOT_READY, Res, ensure,
    result,
};
use crate::scheduler::{enqueue, wait_stream};
use crate::state::{NodeKind, Op, State, Stream, StreamKind, as_ptr, lock, new_handle};

/// `CU_STREAM_NON_BLOCKING`, the one stream flag.
const NON_BLOCKING: c_uint = 1;

/// Registers a new stream of `ctx`.
pub(crate) fn add_stream(
    st: &mut State,
    ctx: usize,
    kind: StreamKind,
    flags: u32,
    priority: i32,
) -> usize {
    let handle = new_handle();
    let id = st.next_id();
    st.streams.insert(
        handle,
        Stream {
            ctx,
            id,
            kind,
            flags,
            priority,
            queue: VecDeque::new(),
            running: None,
            destroyed: false,
            capture: None,
        },
    );
    if let Some(c) = st.contexts.get_mut(&ctx) {
        c.streams.push(handle);
    }
    handle
}

/// The stream a handle names. 0 is the legacy default stream of the current context, or its
/// per-thread default stream for the calling thread when `per_thread` (a `_ptsz` export);
/// `CU_STREAM_LEGACY` (1) and `CU_STREAM_PER_THREAD` (2) mean the same in either mode.
pub(crate) fn resolve(
    st: &mut State,
    handle: CUstream,
    per_thread: bool,
) -> Result<usize, CUresult> {
    match handle.addr() {
        0 => implicit(st, per_thread),
        1 => implicit(st, false),
        2 => implicit(st, true),
        h => {
            let s = st
                .streams
                .get(&h)
                .filter(|s| !s.destroyed && s.kind == StreamKind::Created)
                .ok_or(INVALID_HANDLE)?;
            check_context(st, s.ctx)?;
            Ok(h)
        }
    }
}

fn implicit(st: &mut State, per_thread: bool) -> Result<usize, CUresult> {
    let ctx = current(st)?;
    let c = check_context(st, ctx)?;
    if !per_thread {
        return Ok(c.legacy_stream);
    }
    let thread = crate::state::thread_number();
    if let Some(stream) = c.per_thread_streams.get(&thread) {
        return Ok(*stream);
    }
    let stream = add_stream(st, ctx, StreamKind::PerThread, NON_BLOCKING, 0);
    if let Some(c) = st.contexts.get_mut(&ctx) {
        c.per_thread_streams.insert(thread, stream);
    }
    Ok(stream)
}

fn stream(st: &State, stream: usize) -> &Stream {
    // Only called with a handle `resolve` just returned, under the same lock.
    &st.streams[&stream]
}

export!("cuStreamCreate", cuStreamCreate => stream_create(phStream: *mut CUstream, Flags: c_uint));
unsafe fn stream_create(ph: *mut CUstream, flags: c_uint) -> Res {
    // SAFETY: the caller's contract covers `ph`.
    unsafe { stream_create_with_priority(ph, flags, 0) }
}

export!("cuStreamCreateWithPriority", cuStreamCreateWithPriority => stream_create_with_priority(phStream: *mut CUstream, flags: c_uint, priority: c_int));
unsafe fn stream_create_with_priority(ph: *mut CUstream, flags: c_uint, priority: c_int) -> Res {
    ensure(!ph.is_null() && flags & !NON_BLOCKING == 0, INVALID_VALUE)?;
    let mut st = lock();
    let ctx = current(&st)?;
    let handle = add_stream(&mut st, ctx, StreamKind::Created, flags, priority);
    // SAFETY: non-null, and the caller passes a valid place for a stream handle.
    unsafe { ph.write(as_ptr(handle)) };
    Ok(())
}

/// Returns at once; the stream's queued work still runs, then the stream is forgotten.
unsafe fn stream_destroy(handle: CUstream) -> Res {
    let mut st = lock();
    let h = handle.addr();
    let s = st
        .streams
        .get_mut(&h)
        .filter(|s| !s.destroyed && s.kind == StreamKind::Created)
        .ok_or(INVALID_HANDLE)?;
    s.destroyed = true;
    if s.idle() {
        let ctx = s.ctx;
        st.streams.remove(&h);
        if let Some(c) = st.contexts.get_mut(&ctx) {
            c.streams.retain(|s| *s != h);
        }
    }
    Ok(())
}
export!("cuStreamDestroy", cuStreamDestroy => stream_destroy(hStream: CUstream));
export!("cuStreamDestroy", cuStreamDestroy_v2 => stream_destroy(hStream: CUstream));

stream_export!("cuStreamSynchronize", cuStreamSynchronize / cuStreamSynchronize_ptsz => stream_synchronize(hStream: CUstream));
unsafe fn stream_synchronize(handle: CUstream, per_thread: bool) -> Res {
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    if capture::is_capturing(&st, s) {
        capture::invalidate(&mut st, s);
        return Err(CAPTURE_UNSUPPORTED);
    }
    result(wait_stream(st, s))
}

stream_export!("cuStreamQuery", cuStreamQuery / cuStreamQuery_ptsz => stream_query(hStream: CUstream));
unsafe fn stream_query(handle: CUstream, per_thread: bool) -> Res {
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    let stream = stream(&st, s);
    ensure(
        !check_context(&st, stream.ctx)?.reports_poison(),
        LAUNCH_FAILED,
    )?;
    ensure(stream.capture.is_none(), CAPTURE_UNSUPPORTED)?;
    ensure(stream.idle(), NOT_READY)
}

stream_export!("cuStreamGetCtx", cuStreamGetCtx / cuStreamGetCtx_ptsz => stream_get_ctx(hStream: CUstream, pctx: *mut CUcontext));
unsafe fn stream_get_ctx(handle: CUstream, pctx: *mut CUcontext, per_thread: bool) -> Res {
    // SAFETY: the caller's contract covers `pctx`.
    unsafe { stream_get_ctx_v2(handle, pctx, std::ptr::null_mut(), per_thread) }
}

stream_export!("cuStreamGetCtx", cuStreamGetCtx_v2 / cuStreamGetCtx_v2_ptsz => stream_get_ctx_v2(hStream: CUstream, pCtx: *mut CUcontext, pGreenCtx: *mut CUgreenCtx));
unsafe fn stream_get_ctx_v2(
    handle: CUstream,
    pctx: *mut CUcontext,
    green: *mut CUgreenCtx,
    per_thread: bool,
) -> Res {
    ensure(!pctx.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    let ctx = stream(&st, s).ctx;
    // SAFETY: `pctx` is non-null; `green` is written only when non-null; the caller passes valid
    // places for handles.
    unsafe {
        pctx.write(as_ptr(ctx));
        if !green.is_null() {
            green.write(std::ptr::null_mut());
        }
    }
    Ok(())
}

stream_export!("cuStreamGetId", cuStreamGetId / cuStreamGetId_ptsz => stream_get_id(hStream: CUstream, streamId: *mut c_ulonglong));
unsafe fn stream_get_id(handle: CUstream, id: *mut c_ulonglong, per_thread: bool) -> Res {
    ensure(!id.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    // SAFETY: non-null, and the caller passes a valid place for the id.
    unsafe { id.write(stream(&st, s).id) };
    Ok(())
}

stream_export!("cuStreamGetFlags", cuStreamGetFlags / cuStreamGetFlags_ptsz => stream_get_flags(hStream: CUstream, flags: *mut c_uint));
unsafe fn stream_get_flags(handle: CUstream, flags: *mut c_uint, per_thread: bool) -> Res {
    ensure(!flags.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    // SAFETY: non-null, and the caller passes a valid place for the flags.
    unsafe { flags.write(stream(&st, s).flags) };
    Ok(())
}

stream_export!("cuStreamGetPriority", cuStreamGetPriority / cuStreamGetPriority_ptsz => stream_get_priority(hStream: CUstream, priority: *mut c_int));
unsafe fn stream_get_priority(handle: CUstream, priority: *mut c_int, per_thread: bool) -> Res {
    ensure(!priority.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    // SAFETY: non-null, and the caller passes a valid place for the priority.
    unsafe { priority.write(stream(&st, s).priority) };
    Ok(())
}

stream_export!("cuStreamGetDevice", cuStreamGetDevice / cuStreamGetDevice_ptsz => stream_get_device(hStream: CUstream, device: *mut CUdevice));
unsafe fn stream_get_device(handle: CUstream, device: *mut CUdevice, per_thread: bool) -> Res {
    ensure(!device.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    let dev = check_context(&st, stream(&st, s).ctx)?.device;
    // SAFETY: non-null, and the caller passes a valid place for the device.
    unsafe { device.write(dev) };
    Ok(())
}

stream_export!("cuLaunchHostFunc", cuLaunchHostFunc / cuLaunchHostFunc_ptsz => launch_host_func(hStream: CUstream, fn_: CUhostFn, userData: *mut c_void));
unsafe fn launch_host_func(
    handle: CUstream,
    f: CUhostFn,
    data: *mut c_void,
    per_thread: bool,
) -> Res {
    let f = f.ok_or(INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    let data = data.expose_provenance();
    if let Some(captured) = capture::add_node(&mut st, s, NodeKind::Host { f: Some(f), data }) {
        return captured;
    }
    result(enqueue(&mut st, s, Op::HostFn { f, data }))
}

/// The `syncMode` of the last `cuLaunchHostFunc_v2` call that passed its check, and of the last host
/// node added through `cuGraphAddNode`; [`NO_SYNC_MODE`] before any. Read by
/// `fake_cuda_last_sync_mode`, so tests can see which mode reached the driver.
pub(crate) static LAST_SYNC_MODE: [AtomicU32; 2] =
    [AtomicU32::new(NO_SYNC_MODE), AtomicU32::new(NO_SYNC_MODE)];
/// [`LAST_SYNC_MODE`]'s value before any call.
pub(crate) const NO_SYNC_MODE: u32 = u32::MAX;
/// [`LAST_SYNC_MODE`]'s index for `cuLaunchHostFunc_v2` calls.
pub(crate) const SYNC_MODE_OF_LAUNCH: usize = 0;
/// [`LAST_SYNC_MODE`]'s index for host nodes added through `cuGraphAddNode`.
pub(crate) const SYNC_MODE_OF_HOST_NODE: usize = 1;

stream_export!("cuLaunchHostFunc", cuLaunchHostFunc_v2 / cuLaunchHostFunc_v2_ptsz => launch_host_func_v2(hStream: CUstream, fn_: CUhostFn, userData: *mut c_void, syncMode: c_uint));
unsafe fn launch_host_func_v2(
    handle: CUstream,
    f: CUhostFn,
    data: *mut c_void,
    sync_mode: c_uint,
    per_thread: bool,
) -> Res {
    // CU_HOST_TASK_BLOCKING (0) or CU_HOST_TASK_SPINWAIT (1); both run the same way here, but the
    // mode is recorded for the tests.
    ensure(sync_mode <= 1, INVALID_VALUE)?;
    LAST_SYNC_MODE[SYNC_MODE_OF_LAUNCH].store(sync_mode, Ordering::SeqCst);
    // SAFETY: the caller's contract for cuLaunchHostFunc_v2 includes cuLaunchHostFunc's.
    unsafe { launch_host_func(handle, f, data, per_thread) }
}

stream_export!("cuStreamAddCallback", cuStreamAddCallback / cuStreamAddCallback_ptsz => stream_add_callback(hStream: CUstream, callback: CUstreamCallback, userData: *mut c_void, flags: c_uint));
unsafe fn stream_add_callback(
    handle: CUstream,
    callback: CUstreamCallback,
    data: *mut c_void,
    flags: c_uint,
    per_thread: bool,
) -> Res {
    let f = callback.ok_or(INVALID_VALUE)?;
    ensure(flags == 0, INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    if capture::is_capturing(&st, s) {
        // Stream callbacks cannot be captured: the real driver invalidates the capture.
        capture::invalidate(&mut st, s);
        return Err(CAPTURE_UNSUPPORTED);
    }
    let op = Op::Callback {
        f,
        stream: handle.addr(),
        data: data.expose_provenance(),
    };
    result(enqueue(&mut st, s, op))
}

stream_export!("cuStreamWriteValue32", cuStreamWriteValue32_v2 / cuStreamWriteValue32_v2_ptsz => stream_write_value32(stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint));
unsafe fn stream_write_value32(
    handle: CUstream,
    addr: CUdeviceptr,
    value: cuuint32_t,
    _flags: c_uint,
    per_thread: bool,
) -> Res {
    let addr = addr as usize;
    ensure(addr != 0 && addr.is_multiple_of(4), INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    if let Some(captured) = capture::add_node(&mut st, s, NodeKind::Write32 { addr, value }) {
        return captured;
    }
    result(enqueue(&mut st, s, Op::Write32 { addr, value }))
}

stream_export!("cuStreamWriteValue64", cuStreamWriteValue64_v2 / cuStreamWriteValue64_v2_ptsz => stream_write_value64(stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint));
unsafe fn stream_write_value64(
    handle: CUstream,
    addr: CUdeviceptr,
    value: cuuint64_t,
    _flags: c_uint,
    per_thread: bool,
) -> Res {
    let addr = addr as usize;
    ensure(addr != 0 && addr.is_multiple_of(8), INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    if let Some(captured) = capture::add_node(&mut st, s, NodeKind::Write64 { addr, value }) {
        return captured;
    }
    result(enqueue(&mut st, s, Op::Write64 { addr, value }))
}

/// `CU_STREAM_WAIT_VALUE_FLUSH`: a memory-model flag with nothing to do in the fake.
const WAIT_VALUE_FLUSH: c_uint = 1 << 30;

stream_export!("cuStreamWaitValue32", cuStreamWaitValue32_v2 / cuStreamWaitValue32_v2_ptsz => stream_wait_value32(stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint));
unsafe fn stream_wait_value32(
    handle: CUstream,
    addr: CUdeviceptr,
    value: cuuint32_t,
    flags: c_uint,
    per_thread: bool,
) -> Res {
    wait_value(handle, addr, u64::from(value), flags, false, per_thread)
}

stream_export!("cuStreamWaitValue64", cuStreamWaitValue64_v2 / cuStreamWaitValue64_v2_ptsz => stream_wait_value64(stream: CUstream, addr: CUdeviceptr, value: cuuint64_t, flags: c_uint));
unsafe fn stream_wait_value64(
    handle: CUstream,
    addr: CUdeviceptr,
    value: cuuint64_t,
    flags: c_uint,
    per_thread: bool,
) -> Res {
    wait_value(handle, addr, value, flags, true, per_thread)
}

/// Enqueues a wait until the word at `addr` meets the condition in `flags`. Inside a capture the
/// real driver adds a memory-operation node; the fake does not model that (900).
fn wait_value(
    handle: CUstream,
    addr: CUdeviceptr,
    value: u64,
    flags: c_uint,
    wide: bool,
    per_thread: bool,
) -> Res {
    let addr = addr as usize;
    let align = if wide { 8 } else { 4 };
    let condition = flags & !WAIT_VALUE_FLUSH;
    ensure(addr != 0 && addr.is_multiple_of(align), INVALID_VALUE)?;
    ensure(condition <= 3, INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    if capture::is_capturing(&st, s) {
        capture::invalidate(&mut st, s);
        return Err(CAPTURE_UNSUPPORTED);
    }
    result(enqueue(
        &mut st,
        s,
        Op::WaitValue {
            addr,
            value,
            condition,
            wide,
        },
    ))
}
