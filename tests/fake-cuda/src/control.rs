//! The fake's own C API, for tests: fault injection, call counters, and stand-ins for device
//! behaviour a test needs to provoke (long-running kernels, sticky errors).
//!
//! A test reaches these by opening the fake library again (with `dlopen`/`libloading`); the system
//! loader returns the copy the driver loader already mapped, so both see the same state. None of
//! them needs `cuInit`, and none is affected by `FAKE_CUDA_STUB` or injected faults.

use std::ffi::{CStr, c_char};
use std::sync::atomic::Ordering;

use cuda_dl_sys::types::{CUcontext, CUresult, CUstream};

use crate::calls;
use crate::config::config;
use crate::context::{check_context, current, stack_depth};
use crate::errors::SUCCESS;
use crate::proc_address::{LAST_FLAGS, LAST_VERSION};
use crate::scheduler::{self, WORKERS};
use crate::state::{Op, StreamKind, lock, notify};
use crate::stream::resolve;
use crate::user_object::LIVE;

pub use crate::reset::fake_cuda_reset_steering;

/// # Safety
/// `s` is null or NUL-terminated.
unsafe fn text<'a>(s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        return None;
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(s) }.to_str().ok()
}

/// Makes the `nth` call (1-based, counted from now; 0 = every call) of `name` return `code` with no
/// other effect. `name` is a base symbol (`cuLaunchHostFunc`: every variant) or an export name
/// (`cuLaunchHostFunc_v2`: that one). Replaces an earlier fault of that name.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_set_fault(name: *const c_char, nth: u64, code: u32) {
    // SAFETY: the caller passes a NUL-terminated name.
    if let Some(name) = unsafe { text(name) } {
        calls::set_fault(name, nth, code);
    }
}

/// Makes the `nth` call (1-based, counted from now; 0 = every call) of `name` first run `hook(arg)`,
/// on the calling thread, with no lock of the fake held (so the hook may call the driver), before
/// the call does anything else (an injected fault included). `name` is a base symbol (every
/// variant) or an export name. Replaces an earlier hook of that name; a hook for one call is
/// removed once it ran.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_set_hook(
    name: *const c_char,
    nth: u64,
    hook: extern "C" fn(*mut std::ffi::c_void),
    arg: *mut std::ffi::c_void,
) {
    // SAFETY: the caller passes a NUL-terminated name.
    if let Some(name) = unsafe { text(name) } {
        crate::hooks::set(name, false, nth, hook, arg);
    }
}

/// As [`fake_cuda_set_hook`], but `hook(arg)` runs at the end of the call, once it has done
/// everything but return (on the calling thread, with no lock of the fake held), whatever it
/// returns; a call refused by an injected fault does not reach it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_set_hook_after(
    name: *const c_char,
    nth: u64,
    hook: extern "C" fn(*mut std::ffi::c_void),
    arg: *mut std::ffi::c_void,
) {
    // SAFETY: the caller passes a NUL-terminated name.
    if let Some(name) = unsafe { text(name) } {
        crate::hooks::set(name, true, nth, hook, arg);
    }
}

/// Removes every hook.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_clear_hooks() {
    crate::hooks::clear();
}

/// Removes every injected fault (those of `FAKE_CUDA_FAIL` included).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_clear_faults() {
    calls::clear_faults();
}

/// Calls of `name` so far: a base symbol counts every exported variant (`cuStreamSynchronize`
/// counts `cuStreamSynchronize_ptsz` too), an export name only itself. Faulted and stub calls count.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_call_count(name: *const c_char) -> u64 {
    // SAFETY: the caller passes a NUL-terminated name.
    unsafe { text(name) }.map_or(0, calls::count)
}

/// Calls of `name` (as for [`fake_cuda_call_count`]; an empty name: of every function) made on a
/// driver thread: a context's worker, running a host function, or the user-object destructor
/// thread. The real driver does not allow CUDA calls there (it may fail them or deadlock), so a
/// library that keeps its promise to stay off the driver's thread leaves this at 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_driver_thread_call_count(name: *const c_char) -> u64 {
    // SAFETY: the caller passes a NUL-terminated name (or null, read as empty).
    let name = unsafe { text(name) }.unwrap_or("");
    calls::count_on_driver_threads(name)
}

/// Writes `text` into `buffer`: at most `len` bytes, NUL-terminated when there is room. Returns
/// the length of the whole text (without the NUL).
///
/// # Safety
/// `buffer` has `len` writable bytes (or is null with `len` 0).
unsafe fn write_text(text: &str, buffer: *mut c_char, len: usize) -> usize {
    if !buffer.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: the caller passes `len` writable bytes at `buffer`; `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buffer.cast::<u8>(), n);
            buffer.add(n).write(0);
        }
    }
    text.len()
}

/// Writes every call counter into `buffer` as text, one line per export name called so far:
/// `export base count` (so a test can see which functions an operation called without knowing
/// their names in advance). Writes at most `len` bytes, NUL-terminated when there is room, and
/// returns the length of the whole text (without the NUL): call again with a larger buffer if that
/// is `len` or more. `buffer` may be null when `len` is 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_call_counts(buffer: *mut c_char, len: usize) -> usize {
    // SAFETY: as the caller promises.
    unsafe { write_text(&calls::counts_text(), buffer, len) }
}

/// How many driver objects of a kind are alive, for leak checks: `streams` (created and not yet
/// destroyed by the user), `events`, `graphs`, `graph_execs`, `graph_nodes` (of live graphs),
/// `contexts` (created with `cuCtxCreate`, not destroyed), `primary_retains` (retains of device
/// 0's primary context), `holds` (not yet finished), `host_registrations` (`cuMemHostRegister`
/// ranges not unregistered, nor dropped with their context), `device_allocations` (`cuMemAlloc`
/// and `cuMemAllocAsync` memory not yet freed: a `cuMemFreeAsync` counts once the stream got to
/// it; freed with its context too), `host_allocations` (page-locked `cuMemHostAlloc` and
/// `cuMemAllocHost` memory), `user_objects` (as [`fake_cuda_live_user_objects`]). Unknown kinds
/// (or null) give 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_live_objects(kind: *const c_char) -> u64 {
    // SAFETY: the caller passes a NUL-terminated name or null.
    let Some(kind) = (unsafe { text(kind) }) else {
        return 0;
    };
    let st = lock();
    let n = match kind {
        "streams" => st
            .streams
            .values()
            .filter(|s| s.kind == StreamKind::Created && !s.destroyed)
            .count(),
        "events" => st.events.len(),
        "graphs" => st.graphs.len(),
        "graph_execs" => st.execs.len(),
        "graph_nodes" => st.nodes.len(),
        "contexts" => st.contexts.values().filter(|c| !c.primary).count(),
        "primary_retains" => st
            .primary
            .get(&0)
            .and_then(|ctx| st.contexts.get(ctx))
            .map_or(0, |c| c.refcount as usize),
        "holds" => st.holds.len(),
        "host_registrations" => crate::memory::registration_count(),
        "device_allocations" => crate::memory::allocation_count(&st, true),
        "host_allocations" => crate::memory::allocation_count(&st, false),
        "user_objects" => LIVE.load(Ordering::SeqCst) as usize,
        _ => 0,
    };
    n as u64
}

/// How many contexts the calling thread's current-context stack holds (`cuCtxPushCurrent` pushes,
/// `cuCtxPopCurrent` pops, `cuCtxSetCurrent` replaces the top): for checks that a library leaves
/// the stack as it found it.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_context_stack_depth() -> u64 {
    stack_depth() as u64
}

/// Sets every call counter back to 0 (those of [`fake_cuda_driver_thread_call_count`] included).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_reset_call_counts() {
    calls::reset_counts();
}

/// With `on`, only the calling thread's driver calls are counted and may meet an injected fault
/// (the library's own threads call the driver at moments of their own); with `!on`, every
/// thread's again.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_focus_calls_on_this_thread(on: bool) {
    calls::focus_on_this_thread(on);
}

/// Calls of `cuGetProcAddress` (`which` = 1) or `cuGetProcAddress_v2` (`which` = 2).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_proc_address_calls(which: u32) -> u64 {
    match which {
        1 => calls::count("cuGetProcAddress") - calls::count("cuGetProcAddress_v2"),
        2 => calls::count("cuGetProcAddress_v2"),
        _ => 0,
    }
}

/// The `flags` of the last `cuGetProcAddress*` call (0 before any).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_last_proc_address_flags() -> u64 {
    LAST_FLAGS.load(Ordering::SeqCst)
}

/// The `cudaVersion` of the last `cuGetProcAddress*` call (0 before any).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_last_proc_address_version() -> i32 {
    LAST_VERSION.load(Ordering::SeqCst)
}

/// The `syncMode` of the last `cuLaunchHostFunc_v2` call (`which` 0) or of the last host node added
/// through `cuGraphAddNode` (`which` 1); `u32::MAX` before any (and for another `which`).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_last_sync_mode(which: u32) -> u32 {
    usize::try_from(which)
        .ok()
        .and_then(|which| crate::stream::LAST_SYNC_MODE.get(which))
        .map_or(crate::stream::NO_SYNC_MODE, |mode| {
            mode.load(Ordering::SeqCst)
        })
}

/// Changes the version `cuDriverGetVersion` reports (and `cuGetProcAddress*` gates on).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_set_version(version: i32) {
    config().set_version(version);
}

/// Turns stub behaviour (every driver call returns 34) on (non-zero) or off.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_set_stub(on: u32) {
    config().set_stub(on != 0);
}

/// Replaces the `FAKE_CUDA_MISSING` list (comma-separated base symbols; null clears it).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_set_missing(list: *const c_char) {
    // SAFETY: the caller passes a NUL-terminated list or null.
    config().set_missing(unsafe { text(list) }.unwrap_or(""));
}

/// Makes `cuGetProcAddress*` register the variant of `symbol` (a base symbol) that the fake lists at
/// ABI `version` at `registered` instead: a driver that registers a variant at another version
/// than the headers' typedef says (`cuLaunchHostFunc` 13020 at 13030: asked for at 13020, a 13.3
/// driver then answers with the 10.0 variant). `registered` = `version` undoes it; so does
/// [`fake_cuda_reset_steering`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_register_variant_at(
    symbol: *const c_char,
    version: i32,
    registered: i32,
) {
    // SAFETY: the caller passes a NUL-terminated name.
    if let Some(symbol) = unsafe { text(symbol) } {
        crate::proc_address::register_at(symbol, version, registered);
    }
}

/// Changes the number of devices.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_set_device_count(count: i32) {
    config().set_devices(count);
}

/// Enqueues "device work" on `stream` (0 or `CU_STREAM_LEGACY`: the current context's legacy
/// stream; `CU_STREAM_PER_THREAD`: the calling thread's) that blocks that stream, like a spinning
/// kernel, until [`fake_cuda_release_hold`]. Other streams keep running. Returns the token, or 0 if
/// the stream is invalid or capturing.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_hold_stream(stream: CUstream) -> u64 {
    let mut st = lock();
    let Ok(s) = resolve(&mut st, stream, false) else {
        return 0;
    };
    if crate::capture::is_capturing(&st, s) {
        return 0;
    }
    let token = st.next_id();
    st.holds.insert(token, false);
    if scheduler::enqueue(&mut st, s, Op::Hold { token }) != SUCCESS {
        st.holds.remove(&token);
        return 0;
    }
    token
}

/// Lets the held stream continue. Unknown (or already finished) tokens are ignored.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_release_hold(token: u64) {
    let mut st = lock();
    if let Some(released) = st.holds.get_mut(&token) {
        *released = true;
    }
    notify();
}

/// A sticky error in `ctx` (null: the current context), as after a trapping kernel: from now on
/// its host functions never run (pending ones included), synchronize/query calls return 719
/// (`CUDA_ERROR_LAUNCH_FAILED`), and `cuLaunchHostFunc` (any enqueue) returns 0 until one of them
/// has reported the error, 719 after (as the real driver does once the error has surfaced). Cleared only by the last
/// release or a reset of a primary context. Returns 0, or 201 for an invalid context.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_poison_context(ctx: CUcontext) -> CUresult {
    let mut st = lock();
    let ctx = if ctx.is_null() {
        match current(&st) {
            Ok(ctx) => ctx,
            Err(code) => return code,
        }
    } else {
        ctx.addr()
    };
    match check_context(&st, ctx) {
        Ok(c) => c.poisoned.store(true, Ordering::Release),
        Err(code) => return code,
    }
    scheduler::drain(&mut st, ctx);
    notify();
    SUCCESS
}

/// Host functions (and stream callbacks, and host nodes of launched graphs) of `ctx` (null: every
/// context) enqueued and not yet finished, the one running now included.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_pending_host_functions(ctx: CUcontext) -> u64 {
    scheduler::pending_host_functions(&lock(), ctx.addr())
}

/// User objects created and not yet destroyed: a count drops once the destructor has returned.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_live_user_objects() -> u64 {
    LIVE.load(Ordering::SeqCst)
}

/// User objects that still have a reference (the user's, a graph's, an executable graph's or a
/// launch's): those whose destructor has not been queued yet. Unlike
/// [`fake_cuda_live_user_objects`], this drops synchronously with the call that releases the last
/// reference, so a test can tell "still referenced" from "destroyed, destructor pending".
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_referenced_user_objects() -> u64 {
    lock().user_objects.len() as u64
}

/// Context worker threads ("driver threads") running now: one per context that has had work.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_driver_thread_count() -> u64 {
    WORKERS.load(Ordering::SeqCst)
}

/// Makes the next `count` capture queries (`cuStreamGetCaptureInfo`, `cuStreamIsCapturing`) of a
/// capturing stream answer "not capturing": a stand-in for a capture that another thread begins
/// just after a library looked (queries of streams that are not capturing do not count).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_hide_capture(count: u64) {
    crate::capture::HIDDEN_QUERIES.store(count, Ordering::Release);
}

/// From now on (non-zero) `cuCtxCreate` gives a new context the handle of the context most recently
/// destroyed with `cuCtxDestroy`, as the real driver may (its handles are heap addresses); `0`
/// turns it off. The new context is a different context: its own streams, its own
/// `cuCtxGetId`, none of the old one's host-memory registrations.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_reuse_context_handles(on: u32) {
    crate::context::REUSE_HANDLES.store(on != 0, Ordering::Release);
}

/// The calling thread's stream-capture interaction mode (0 `GLOBAL`, the default; 1
/// `THREAD_LOCAL`; 2 `RELAXED`), as `cuThreadExchangeStreamCaptureMode` last set it.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_capture_interaction_mode() -> u32 {
    crate::capture_mode::current()
}

/// Driver calls made after the driver's teardown at process exit (see `teardown.rs`): for an exit
/// handler of a test, registered before the driver was initialised (so it runs after the teardown).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_calls_after_teardown() -> u64 {
    crate::teardown::calls_after_teardown()
}

/// Calls since the fake was loaded that named an event it does not know (destroyed, also with
/// its context by a destroy, last release or reset; or never made): on the real driver such a
/// handle may name another event made since.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_unknown_event_calls() -> u64 {
    crate::oracle::unknown_event_calls()
}

/// Whether the driver's teardown at process exit has run (1) or not (0).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_torn_down() -> u32 {
    u32::from(crate::teardown::torn_down())
}

/// How far the stream with id `stream_id` (its `cuStreamGetId`) got: operations enqueued in stream
/// order (captured ones are graph nodes, not counted) and completed by its driver thread (none
/// after a sticky error). Kept after the stream is destroyed. Returns 1 and writes both if the
/// stream ever had work, 0 otherwise (nothing written).
///
/// # Safety
/// `enqueued` and `completed` are valid places to write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_stream_progress(
    stream_id: u64,
    enqueued: *mut u64,
    completed: *mut u64,
) -> u32 {
    let Some(progress) = crate::oracle::progress(&lock(), stream_id) else {
        return 0;
    };
    // SAFETY: the caller's promise.
    unsafe {
        enqueued.write(progress.enqueued);
        completed.write(progress.completed);
    }
    1
}

/// Whether a usable context has the `cuCtxGetId` `id` (1) or none has (0): a context that was
/// destroyed, or a primary context released for the last time or reset, lives no more (made again,
/// it has another id).
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_context_alive(id: u64) -> u32 {
    u32::from(crate::oracle::context_alive(&lock(), id))
}

/// How many prohibited calls (see `capture_mode.rs`) invalidated a capture from a thread whose
/// name (as the operating system knows it: 15 bytes on Linux) starts with `prefix`.
///
/// # Safety
/// `prefix` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_invalidations_by(prefix: *const c_char) -> u64 {
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { text(prefix) }.map_or(0, crate::oracle::invalidations_by)
}

/// Driver calls made after the driver's teardown at process exit by threads whose name (as the
/// operating system knows it: 15 bytes on Linux) starts with `prefix`: for checks that a library's
/// own threads stop calling before the teardown, while the user's threads may still run.
///
/// # Safety
/// `prefix` is NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_calls_after_teardown_by(prefix: *const c_char) -> u64 {
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { text(prefix) }.map_or(0, crate::teardown::calls_after_teardown_by)
}

/// Writes what [`fake_cuda_calls_after_teardown_by`] counts as text into `buffer`, as
/// [`fake_cuda_call_counts`] does: one line `thread export` per call after the teardown (the
/// first 1000), then the stack of the first one made by a thread of `cuda-host-launch` (named
/// `cuda-h…`). Returns the length of the whole text.
///
/// # Safety
/// `buffer` has `len` writable bytes (or is null with `len` 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fake_cuda_after_teardown_report(buffer: *mut c_char, len: usize) -> usize {
    // SAFETY: as the caller promises.
    unsafe { write_text(&crate::teardown::report(), buffer, len) }
}

/// Whether the context with `cuCtxGetId` `id` has had a sticky error (1; see
/// [`fake_cuda_poison_context`]): it lives with it, or died with it. 0 for one that never had.
#[unsafe(no_mangle)]
pub extern "C" fn fake_cuda_context_poisoned(id: u64) -> u32 {
    u32::from(crate::oracle::context_poisoned(&lock(), id))
}
