//! Contexts: primary (one refcounted handle per device) and created ones, and each thread's stack
//! of current contexts.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cuda_dl_sys::types::{CUcontext, CUctxCreateParams, CUdevice, CUexecAffinityParam};

use crate::device::check_device;
use crate::errors::{INVALID_CONTEXT, INVALID_VALUE, NOT_PERMITTED, Res, ensure};
use crate::scheduler::{on_worker_of, shut_down, wait_context};
use crate::state::{Context, State, StreamKind, as_ptr, lock, new_handle, wait};
use crate::stream::add_stream;

thread_local! {
    /// The calling thread's context stack; the last entry is current.
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// How many contexts the calling thread's stack holds.
pub(crate) fn stack_depth() -> usize {
    STACK.with(|s| s.borrow().len())
}

fn top() -> Option<usize> {
    STACK.with(|s| s.borrow().last().copied())
}

/// `ctx` if it can be used now: live and not closing (its own worker may still use a closing one).
pub(crate) fn check_context(
    st: &State,
    ctx: usize,
) -> Result<&Context, cuda_dl_sys::types::CUresult> {
    match st.contexts.get(&ctx) {
        Some(c) if c.usable() => Ok(c),
        Some(c) if c.closing && !c.stop && on_worker_of(ctx) => Ok(c),
        _ => Err(INVALID_CONTEXT),
    }
}

/// The calling thread's current context, or 201.
pub(crate) fn current(st: &State) -> Result<usize, cuda_dl_sys::types::CUresult> {
    let ctx = top().ok_or(INVALID_CONTEXT)?;
    check_context(st, ctx)?;
    Ok(ctx)
}

/// `ctx`, or the current context if `ctx` is null.
fn given_or_current(st: &State, ctx: CUcontext) -> Result<usize, cuda_dl_sys::types::CUresult> {
    if ctx.is_null() {
        current(st)
    } else {
        check_context(st, ctx.addr())?;
        Ok(ctx.addr())
    }
}

/// Whether `cuCtxCreate` hands out the handle of the last destroyed created context again (off by
/// default: handles are never reused). The real driver's handles are heap addresses, which a later
/// context may get again; see [`crate::control::fake_cuda_reuse_context_handles`].
pub(crate) static REUSE_HANDLES: AtomicBool = AtomicBool::new(false);

/// Handles of destroyed created contexts, most recent last (kept only while reuse is on). Their
/// cells are never freed, so handing one out again is safe.
static DESTROYED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn destroyed() -> std::sync::MutexGuard<'static, Vec<usize>> {
    DESTROYED.lock().unwrap_or_else(|e| e.into_inner())
}

fn create(st: &mut State, device: CUdevice, primary: bool, flags: u32) -> usize {
    let reused = if primary || !REUSE_HANDLES.load(Ordering::Acquire) {
        None
    } else {
        destroyed().pop()
    };
    let handle = reused.unwrap_or_else(new_handle);
    let id = st.next_id();
    st.contexts.insert(
        handle,
        Context {
            id,
            device,
            primary,
            refcount: u32::from(primary),
            flags,
            closing: false,
            poisoned: Arc::new(AtomicBool::new(false)),
            surfaced: AtomicBool::new(false),
            legacy_stream: 0,
            per_thread_streams: BTreeMap::new(),
            streams: Vec::new(),
            worker: None,
            stop: false,
            cursor: 0,
        },
    );
    let legacy = add_stream(st, handle, StreamKind::Legacy, 0, 0);
    if let Some(c) = st.contexts.get_mut(&handle) {
        c.legacy_stream = legacy;
    }
    handle
}

/// Runs the pending work of a primary context, joins its worker and gives it fresh state: a new
/// context at the same handle, with a new `cuCtxGetId` (as the real driver's: measured on the
/// H200, the handle stays and the id changes).
fn reset_primary(st: std::sync::MutexGuard<'static, State>, ctx: usize) {
    let mut st = shut_down(st, ctx);
    let id = st.next_id();
    if let Some(c) = st.contexts.get_mut(&ctx) {
        c.id = id;
        c.closing = false;
        c.stop = false;
        c.poisoned = Arc::new(AtomicBool::new(false));
        c.surfaced = AtomicBool::new(false);
        c.per_thread_streams.clear();
        c.streams.clear();
        c.cursor = 0;
    }
    let legacy = add_stream(&mut st, ctx, StreamKind::Legacy, 0, 0);
    if let Some(c) = st.contexts.get_mut(&ctx) {
        c.legacy_stream = legacy;
    }
    crate::state::notify();
}

export!("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain => primary_retain(pctx: *mut CUcontext, dev: CUdevice));
unsafe fn primary_retain(pctx: *mut CUcontext, dev: CUdevice) -> Res {
    ensure(!pctx.is_null(), INVALID_VALUE)?;
    check_device(dev)?;
    let mut st = lock();
    let ctx = loop {
        match st.primary.get(&dev).copied() {
            None => {
                let ctx = create(&mut st, dev, true, 0);
                st.primary.insert(dev, ctx);
                break ctx;
            }
            Some(ctx) => match st.contexts.get_mut(&ctx) {
                // A release or reset is still running its pending work: wait for it to finish.
                Some(c) if c.closing => st = wait(st),
                Some(c) => {
                    c.refcount += 1;
                    break ctx;
                }
                None => return Err(INVALID_CONTEXT),
            },
        }
    };
    // SAFETY: non-null, and the caller passes a valid place for a context handle.
    unsafe { pctx.write(as_ptr(ctx)) };
    Ok(())
}

/// Waits (the lock released meanwhile) while the context `which` names is closing: its destruction,
/// last release or reset is running its pending work. Its own worker does not wait (it is part of
/// that work).
fn wait_while_closing(
    mut st: std::sync::MutexGuard<'static, State>,
    which: impl Fn(&State) -> Option<usize>,
) -> std::sync::MutexGuard<'static, State> {
    loop {
        let Some(ctx) = which(&st) else {
            return st;
        };
        match st.contexts.get(&ctx) {
            Some(c) if c.closing && !on_worker_of(ctx) => st = wait(st),
            _ => return st,
        }
    }
}

/// `cuDevicePrimaryCtxRelease` (7000) and `_v2` (11000) share this signature and behaviour.
unsafe fn primary_release(dev: CUdevice) -> Res {
    check_device(dev)?;
    let mut st = lock();
    let ctx = st.primary.get(&dev).copied().ok_or(INVALID_CONTEXT)?;
    if on_worker_of(ctx) {
        return Err(NOT_PERMITTED);
    }
    let c = st.contexts.get_mut(&ctx).ok_or(INVALID_CONTEXT)?;
    ensure(c.refcount > 0 && !c.closing, INVALID_CONTEXT)?;
    c.refcount -= 1;
    if c.refcount == 0 {
        c.closing = true;
        reset_primary(st, ctx);
    }
    Ok(())
}
export!("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease => primary_release(dev: CUdevice));
export!("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2 => primary_release(dev: CUdevice));

/// `cuDevicePrimaryCtxReset` (7000) and `_v2` (11000): run pending work, then fresh state; the
/// retain count is kept, so retained handles stay usable.
unsafe fn primary_reset(dev: CUdevice) -> Res {
    check_device(dev)?;
    let mut st = lock();
    let Some(ctx) = st.primary.get(&dev).copied() else {
        return Ok(());
    };
    if on_worker_of(ctx) {
        return Err(NOT_PERMITTED);
    }
    let c = st.contexts.get_mut(&ctx).ok_or(INVALID_CONTEXT)?;
    ensure(!c.closing, INVALID_CONTEXT)?;
    c.closing = true;
    reset_primary(st, ctx);
    Ok(())
}
export!("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset => primary_reset(dev: CUdevice));
export!("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2 => primary_reset(dev: CUdevice));

export!("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState => primary_get_state(dev: CUdevice, flags: *mut c_uint, active: *mut c_int));
unsafe fn primary_get_state(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) -> Res {
    ensure(!flags.is_null() && !active.is_null(), INVALID_VALUE)?;
    check_device(dev)?;
    // A last release or a reset in progress (running the context's pending work) is one step of
    // the device's primary-context state: the answer comes once it is over.
    let st = wait_while_closing(lock(), |st| st.primary.get(&dev).copied());
    let c = st.primary.get(&dev).and_then(|ctx| st.contexts.get(ctx));
    // SAFETY: both non-null, and the caller passes valid places for them.
    unsafe {
        flags.write(c.map_or(0, |c| c.flags));
        active.write(c.is_some_and(|c| c.refcount > 0) as c_int);
    }
    Ok(())
}

export!("cuDevicePrimaryCtxSetFlags", cuDevicePrimaryCtxSetFlags_v2 => primary_set_flags(dev: CUdevice, flags: c_uint));
unsafe fn primary_set_flags(dev: CUdevice, flags: c_uint) -> Res {
    check_device(dev)?;
    let mut st = lock();
    let ctx = match st.primary.get(&dev).copied() {
        Some(ctx) => ctx,
        None => {
            let ctx = create(&mut st, dev, true, 0);
            if let Some(c) = st.contexts.get_mut(&ctx) {
                c.refcount = 0;
            }
            st.primary.insert(dev, ctx);
            ctx
        }
    };
    if let Some(c) = st.contexts.get_mut(&ctx) {
        c.flags = flags;
    }
    Ok(())
}

/// Creates a context and pushes it onto the calling thread's stack.
unsafe fn ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Res {
    ensure(!pctx.is_null(), INVALID_VALUE)?;
    check_device(dev)?;
    let mut st = lock();
    let ctx = create(&mut st, dev, false, flags);
    STACK.with(|s| s.borrow_mut().push(ctx));
    // SAFETY: non-null, and the caller passes a valid place for a context handle.
    unsafe { pctx.write(as_ptr(ctx)) };
    Ok(())
}

export!("cuCtxCreate", cuCtxCreate_v2 => ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice));

export!("cuCtxCreate", cuCtxCreate_v3 => ctx_create_v3(pctx: *mut CUcontext, paramsArray: *mut CUexecAffinityParam, numParams: c_int, flags: c_uint, dev: CUdevice));
unsafe fn ctx_create_v3(
    pctx: *mut CUcontext,
    _params: *mut CUexecAffinityParam,
    _num_params: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> Res {
    // SAFETY: the caller's contract covers `pctx`; the affinity parameters are ignored.
    unsafe { ctx_create(pctx, flags, dev) }
}

export!("cuCtxCreate", cuCtxCreate_v4 => ctx_create_v4(pctx: *mut CUcontext, ctxCreateParams: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice));
unsafe fn ctx_create_v4(
    pctx: *mut CUcontext,
    _params: *mut CUctxCreateParams,
    flags: c_uint,
    dev: CUdevice,
) -> Res {
    // SAFETY: the caller's contract covers `pctx`; the creation parameters are ignored.
    unsafe { ctx_create(pctx, flags, dev) }
}

export!("cuCtxDestroy", cuCtxDestroy_v2 => ctx_destroy(ctx: CUcontext));
unsafe fn ctx_destroy(ctx: CUcontext) -> Res {
    let ctx = ctx.addr();
    let mut st = lock();
    let c = st.contexts.get_mut(&ctx).ok_or(INVALID_CONTEXT)?;
    ensure(!c.primary && !c.closing, INVALID_CONTEXT)?;
    if on_worker_of(ctx) {
        return Err(NOT_PERMITTED);
    }
    c.closing = true;
    let mut st = shut_down(st, ctx);
    st.contexts.remove(&ctx);
    drop(st);
    if REUSE_HANDLES.load(Ordering::Acquire) {
        destroyed().push(ctx);
    }
    STACK.with(|s| s.borrow_mut().retain(|c| *c != ctx));
    crate::state::notify();
    Ok(())
}

export!("cuCtxGetId", cuCtxGetId => ctx_get_id(ctx: CUcontext, ctxId: *mut std::ffi::c_ulonglong));
/// A number unique to each context for the process's life (a context created at a destroyed one's
/// handle gets a new one, and so does a primary context made again after its last release or a
/// reset).
unsafe fn ctx_get_id(ctx: CUcontext, id: *mut std::ffi::c_ulonglong) -> Res {
    ensure(!id.is_null(), INVALID_VALUE)?;
    // A context being destroyed (running its pending work first) is answered for at once, with
    // the id it still has, as the H200's driver answers (unlike the primary-context state, which
    // waits: see `primary_get_state`).
    let st = lock();
    let ctx = if ctx.is_null() {
        current(&st)?
    } else {
        ctx.addr()
    };
    let number = match st.contexts.get(&ctx) {
        Some(c) if c.closing && !c.stop => c.id,
        _ => check_context(&st, ctx)?.id,
    };
    // SAFETY: non-null, and the caller passes a valid place for the id.
    unsafe { id.write(number) };
    Ok(())
}

export!("cuCtxSetCurrent", cuCtxSetCurrent => ctx_set_current(ctx: CUcontext));
unsafe fn ctx_set_current(ctx: CUcontext) -> Res {
    if ctx.is_null() {
        STACK.with(|s| s.borrow_mut().pop());
        return Ok(());
    }
    let st = lock();
    check_context(&st, ctx.addr())?;
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        s.push(ctx.addr());
    });
    Ok(())
}

export!("cuCtxGetCurrent", cuCtxGetCurrent => ctx_get_current(pctx: *mut CUcontext));
unsafe fn ctx_get_current(pctx: *mut CUcontext) -> Res {
    ensure(!pctx.is_null(), INVALID_VALUE)?;
    let ctx = top().unwrap_or(0);
    // SAFETY: non-null, and the caller passes a valid place for a context handle.
    unsafe { pctx.write(as_ptr(ctx)) };
    Ok(())
}

export!("cuCtxPushCurrent", cuCtxPushCurrent_v2 => ctx_push_current(ctx: CUcontext));
unsafe fn ctx_push_current(ctx: CUcontext) -> Res {
    let st = lock();
    check_context(&st, ctx.addr())?;
    STACK.with(|s| s.borrow_mut().push(ctx.addr()));
    Ok(())
}

export!("cuCtxPopCurrent", cuCtxPopCurrent_v2 => ctx_pop_current(pctx: *mut CUcontext));
unsafe fn ctx_pop_current(pctx: *mut CUcontext) -> Res {
    let ctx = STACK
        .with(|s| s.borrow_mut().pop())
        .ok_or(INVALID_CONTEXT)?;
    if !pctx.is_null() {
        // SAFETY: non-null, and the caller passes a valid place for a context handle.
        unsafe { pctx.write(as_ptr(ctx)) };
    }
    Ok(())
}

export!("cuCtxSynchronize", cuCtxSynchronize => ctx_synchronize());
unsafe fn ctx_synchronize() -> Res {
    let st = lock();
    let ctx = current(&st)?;
    crate::errors::result(wait_context(st, ctx))
}

export!("cuCtxSynchronize", cuCtxSynchronize_v2 => ctx_synchronize_v2(ctx: CUcontext));
unsafe fn ctx_synchronize_v2(ctx: CUcontext) -> Res {
    let st = lock();
    let ctx = given_or_current(&st, ctx)?;
    crate::errors::result(wait_context(st, ctx))
}

export!("cuCtxGetDevice", cuCtxGetDevice => ctx_get_device(device: *mut CUdevice));
unsafe fn ctx_get_device(device: *mut CUdevice) -> Res {
    // SAFETY: the caller's contract covers `device`.
    unsafe { ctx_get_device_v2(device, std::ptr::null_mut()) }
}

export!("cuCtxGetDevice", cuCtxGetDevice_v2 => ctx_get_device_v2(device: *mut CUdevice, ctx: CUcontext));
unsafe fn ctx_get_device_v2(device: *mut CUdevice, ctx: CUcontext) -> Res {
    ensure(!device.is_null(), INVALID_VALUE)?;
    let st = lock();
    let ctx = given_or_current(&st, ctx)?;
    let dev = check_context(&st, ctx)?.device;
    // SAFETY: non-null, and the caller passes a valid place for a device.
    unsafe { device.write(dev) };
    Ok(())
}
