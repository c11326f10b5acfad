//! Contexts: their destruction with work pending, one host-function thread each, sticky errors.

use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cuda_dl_sys::types::{CUcontext, CUresult};
use cuda_workspace::testing::bump;

use super::harness::{Cx, Log, SETTLE, Tagged, cases, code, data, leak, log_tag};

cases! {
    /// `cuCtxDestroy` with host functions pending runs them first, then returns success; the
    /// destroyed context is popped from the thread's stack (the primary one is current again).
    fn context_destroy_runs_pending_host_functions_first(cx) {
        let mut context: CUcontext = ptr::null_mut();
        // SAFETY: a valid out-pointer; the new context becomes current.
        unsafe { cx.driver.cuCtxCreate(&mut context, ptr::null_mut(), 0, cx.device) }.unwrap();
        let stream = cx.stream();
        let count = leak(AtomicUsize::new(0));
        let hold = cx.hold(stream);
        // SAFETY: `count` is leaked.
        unsafe { cx.driver.cuLaunchHostFunc(stream, Some(bump), data(count)) }.unwrap();
        let release = hold.releaser();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            release();
        });
        // SAFETY: a live context, not used afterwards.
        unsafe { cx.driver.cuCtxDestroy(context) }.unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 1, "destroyed before its pending work ran");
        releaser.join().unwrap();
        let mut current: CUcontext = ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { cx.driver.cuCtxGetCurrent(&mut current) }.unwrap();
        assert_eq!(current, cx.context, "the destroyed context was not popped");
    }

    /// Each context's host functions run on one thread of its own: two contexts, two threads.
    fn each_context_has_its_own_host_function_thread(cx) {
        let log = leak(Log::default());
        let mut contexts = Vec::new();
        for tag in 0..2u8 {
            let mut context: CUcontext = ptr::null_mut();
            // SAFETY: a valid out-pointer; the new context becomes current.
            unsafe { cx.driver.cuCtxCreate(&mut context, ptr::null_mut(), 0, cx.device) }.unwrap();
            let stream = cx.stream();
            // SAFETY: the tags are leaked; a live stream.
            unsafe {
                cx.driver.cuLaunchHostFunc(stream, Some(log_tag), Tagged::data(log, tag)).unwrap();
                cx.driver.cuLaunchHostFunc(stream, Some(log_tag), Tagged::data(log, tag)).unwrap();
                cx.driver.cuStreamSynchronize(stream).unwrap();
            }
            contexts.push(context);
        }
        for context in contexts {
            // SAFETY: live contexts, not used afterwards.
            unsafe { cx.driver.cuCtxDestroy(context) }.unwrap();
        }
        let entries = log.entries();
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0].1, entries[1].1, "one context, two threads: {entries:?}");
        assert_eq!(entries[2].1, entries[3].1, "one context, two threads: {entries:?}");
        assert_ne!(entries[0].1, entries[2].1, "two contexts, one thread: {entries:?}");
    }

    /// After a sticky error (a trapping kernel), host functions pending in the context never run,
    /// synchronize and query calls return `CUDA_ERROR_LAUNCH_FAILED`, and
    /// `cuDevicePrimaryCtxReset` succeeds.
    fn a_sticky_error_stops_host_functions_and_the_reset_succeeds(cx) {
        sticky_error_then_reset(cx, false);
    }

    /// Once the sticky error has surfaced (a synchronize returned it), a launch is refused with
    /// it (`CUDA_ERROR_LAUNCH_FAILED`). (Launches made before it surfaced are accepted and never
    /// run: `gpu_pending_reclaim`.)
    fn a_launch_after_a_surfaced_sticky_error_is_refused(cx) {
        sticky_error_then_reset(cx, true);
    }

    /// The fake's recovery: after a sticky error and the reset, the primary context retained
    /// again runs new work. (Not so on the H200's 13.0 driver: see the differences list.)
    fn after_a_sticky_error_and_the_reset_the_context_runs_new_work(cx) {
        sticky_error_then_reset(cx, false);
        let count = leak(AtomicUsize::new(0));
        let mut context: CUcontext = ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe {
            cx.driver.cuDevicePrimaryCtxRetain(&mut context, cx.device).unwrap();
            cx.driver.cuCtxSetCurrent(context).unwrap();
        }
        let stream = cx.stream();
        // SAFETY: `count` is leaked.
        unsafe {
            cx.driver.cuLaunchHostFunc(stream, Some(bump), data(count)).unwrap();
            cx.driver.cuStreamSynchronize(stream).unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// The fake's recovery: the last release of a primary context with a sticky error clears it:
    /// retained again, the context runs new work. (Not so on the H200's 13.0 driver: see the
    /// differences list.)
    fn after_a_sticky_error_the_last_release_clears_it(cx) {
        let stream = cx.stream();
        cx.sticky_error(stream);
        // SAFETY: no arguments.
        assert_eq!(code(unsafe { cx.driver.cuCtxSynchronize() }), Some(CUresult::CUDA_ERROR_LAUNCH_FAILED));
        let count = leak(AtomicUsize::new(0));
        let mut context: CUcontext = ptr::null_mut();
        // SAFETY: the case's one retain is released, the stream not used again; valid
        // out-pointers; `count` is leaked.
        unsafe {
            cx.driver.cuDevicePrimaryCtxRelease(cx.device).unwrap();
            cx.driver.cuDevicePrimaryCtxRetain(&mut context, cx.device).unwrap();
            cx.driver.cuCtxSetCurrent(context).unwrap();
            let stream = cx.stream();
            cx.driver.cuLaunchHostFunc(stream, Some(bump), data(count)).unwrap();
            cx.driver.cuStreamSynchronize(stream).unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// Device 0's primary context keeps its handle when it is released to nothing and retained
    /// again.
    fn the_primary_context_keeps_its_handle_across_its_last_release(cx) {
        let mut again: CUcontext = ptr::null_mut();
        // SAFETY: the case's one retain is released; a valid out-pointer.
        unsafe {
            cx.driver.cuDevicePrimaryCtxRelease(cx.device).unwrap();
            cx.driver.cuDevicePrimaryCtxRetain(&mut again, cx.device).unwrap();
        }
        assert_eq!(again, cx.context);
    }

    /// A primary context released for the last time and retained again is a new context at the
    /// same handle: its `cuCtxGetId` differs (measured on the H200: 1, then 2). Libraries that
    /// keep records per context must key them by the id, not the handle.
    fn a_primary_context_made_again_keeps_its_handle_and_gets_a_new_id(cx) {
        let (mut before, mut after) = (0, 0);
        let mut again: CUcontext = ptr::null_mut();
        // SAFETY: the case's context and its one retain, released then taken again; valid
        // out-pointers.
        unsafe {
            cx.driver.cuCtxGetId(cx.context, &mut before).unwrap();
            cx.driver.cuDevicePrimaryCtxRelease(cx.device).unwrap();
            cx.driver.cuDevicePrimaryCtxRetain(&mut again, cx.device).unwrap();
            cx.driver.cuCtxGetId(again, &mut after).unwrap();
        }
        assert_eq!(again, cx.context, "the handle stays");
        assert_ne!(after, before, "a new id");
    }

    /// A primary context reset while retained is made again at the same handle with a new
    /// `cuCtxGetId` (read after a retain, as a library re-activating it would).
    fn a_reset_primary_context_gets_a_new_id(cx) {
        let (mut before, mut after) = (0, 0);
        let mut again: CUcontext = ptr::null_mut();
        // SAFETY: the case's context, reset with nothing of it in use, then retained once more
        // and released; valid out-pointers.
        unsafe {
            cx.driver.cuCtxGetId(cx.context, &mut before).unwrap();
            cx.driver.cuDevicePrimaryCtxReset(cx.device).unwrap();
            cx.driver.cuDevicePrimaryCtxRetain(&mut again, cx.device).unwrap();
            cx.driver.cuCtxGetId(again, &mut after).unwrap();
            cx.driver.cuDevicePrimaryCtxRelease(cx.device).unwrap();
        }
        assert_eq!(again, cx.context, "the handle stays");
        assert_ne!(after, before, "a new id");
    }

    /// Between its last release and the next retain, a primary context's handle names no
    /// context: `cuCtxGetId` refuses it (`CUDA_ERROR_INVALID_CONTEXT` or
    /// `CUDA_ERROR_CONTEXT_IS_DESTROYED`) and `cuDevicePrimaryCtxGetState` reports it inactive.
    fn a_released_primary_contexts_handle_has_no_id(cx) {
        let mut id = 0;
        let (mut flags, mut active) = (0, 1);
        let mut again: CUcontext = ptr::null_mut();
        // SAFETY: the case's one retain, released then taken again; valid out-pointers.
        let answer = unsafe {
            cx.driver.cuCtxSetCurrent(ptr::null_mut()).unwrap();
            cx.driver.cuDevicePrimaryCtxRelease(cx.device).unwrap();
            cx.driver.cuDevicePrimaryCtxGetState(cx.device, &mut flags, &mut active).unwrap();
            let answer = code(cx.driver.cuCtxGetId(cx.context, &mut id));
            cx.driver.cuDevicePrimaryCtxRetain(&mut again, cx.device).unwrap();
            cx.driver.cuCtxSetCurrent(again).unwrap();
            answer
        };
        assert_eq!(active, 0, "inactive after the last release");
        assert!(
            matches!(
                answer,
                Some(CUresult::CUDA_ERROR_INVALID_CONTEXT | CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED)
            ),
            "cuCtxGetId of the released handle: {answer:?} (id {id})"
        );
    }

    /// While the last release of a primary context runs its pending work (a held stream with a
    /// host function behind it), another thread's `cuDevicePrimaryCtxGetState` answers only once
    /// the release is over (then: inactive). A library that reclaims the work of a context it
    /// finds gone relies on this: "gone" must not be seen while the context still runs (and
    /// writes) its pending work.
    fn the_state_during_a_last_release_is_answered_once_the_release_is_over(cx) {
        let (early, active, ran) = during_the_last_release(cx, |driver, device, _| {
            let (mut flags, mut active) = (0, 0);
            // SAFETY: valid out-pointers.
            unsafe { driver.cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) }.unwrap();
            active
        });
        assert_eq!(ran, 1, "the pending host function ran");
        assert!(!early, "the state was answered while the last release still ran the context's work");
        assert_eq!(active, 0, "inactive once the release is over");
    }

    /// `cuCtxGetId` of the context's handle, unlike the state, is answered at once while the last
    /// release runs the context's pending work (measured on the H200), with the id the context
    /// still has: a library that reads it then learns "alive", never "gone" too early (the state
    /// query, which waits, says when it is gone).
    fn a_context_id_during_a_last_release_is_answered_at_once_with_the_old_id(cx) {
        let mut before = 0;
        // SAFETY: the case's live context; a valid out-pointer.
        unsafe { cx.driver.cuCtxGetId(cx.context, &mut before) }.unwrap();
        let (early, answer, ran) = during_the_last_release(cx, |driver, _, handle| {
            let mut id = 0;
            // SAFETY: a handle the driver gave out (a primary context's, which it keeps); a valid
            // out-pointer.
            let code = code(unsafe {
                driver.cuCtxGetId(std::ptr::with_exposed_provenance_mut(handle), &mut id)
            });
            (code, id)
        });
        assert_eq!(ran, 1, "the pending host function ran");
        assert!(early, "the id was answered only once the release was over");
        assert_eq!(
            answer,
            (None, before),
            "cuCtxGetId of the handle during the release (the id before: {before})"
        );
    }

    /// `cuDevicePrimaryCtxGetState` reports the primary context active while retained.
    fn the_primary_context_is_active_while_retained(cx) {
        let (mut flags, mut active) = (0, 0);
        // SAFETY: valid out-pointers.
        unsafe { cx.driver.cuDevicePrimaryCtxGetState(cx.device, &mut flags, &mut active) }.unwrap();
        assert_eq!(active, 1);
    }
}

/// A held stream with a host function pending, a sticky error from another stream (and, if
/// `launch_after`, a launch after it has surfaced, which is refused): nothing runs, the calls
/// report the error, and the primary context's reset succeeds. Each step is logged (stderr), so a case that
/// hangs on the real driver says where.
fn sticky_error_then_reset(cx: &Cx, launch_after: bool) {
    let (held, other) = (cx.stream(), cx.stream());
    let count = leak(AtomicUsize::new(0));
    let trap = cx.trap();
    eprintln!("sticky error: the trap is ready");
    let hold = cx.hold(held);
    // SAFETY: `count` is leaked (the functions never run anyway).
    unsafe { cx.driver.cuLaunchHostFunc(held, Some(bump), data(count)) }.unwrap();
    eprintln!("sticky error: a host function pending behind a hold");
    trap.fire(other);
    eprintln!("sticky error: the trap's error is there");
    // Released (by the drop) now: its word's memory goes with the context's reset below.
    drop(hold);
    // SAFETY: live streams; `count` is leaked.
    unsafe {
        if launch_after {
            let launched = cx.driver.cuLaunchHostFunc(held, Some(bump), data(count));
            assert_eq!(code(launched), Some(CUresult::CUDA_ERROR_LAUNCH_FAILED));
        }
        let failed = Some(CUresult::CUDA_ERROR_LAUNCH_FAILED);
        assert_eq!(code(cx.driver.cuStreamSynchronize(held)), failed);
        eprintln!("sticky error: the held stream's synchronize failed");
        assert_eq!(code(cx.driver.cuStreamQuery(held)), failed);
        assert_eq!(code(cx.driver.cuCtxSynchronize()), failed);
    }
    std::thread::sleep(SETTLE);
    assert_eq!(
        count.load(Ordering::SeqCst),
        0,
        "a host function ran after the sticky error"
    );
    // SAFETY: the streams are not used after the reset.
    unsafe { cx.driver.cuDevicePrimaryCtxReset(cx.device) }.unwrap();
    eprintln!("sticky error: the reset succeeded");
}

/// Releases the case's (last) retain of the primary context on another thread while a held stream
/// keeps a host function pending, asks `ask` on a third thread 100 ms into the release, lets the
/// hold go 200 ms later, and retains the context again for the case's clean-up. Returns whether
/// `ask` answered before the hold was let go, its answer, and how many times the host function
/// ran. Each step is logged (stderr), so a case that crashes on the real driver says where.
fn during_the_last_release<T: Send + 'static>(
    cx: &Cx,
    ask: fn(&'static cuda_dl_sys::Driver, cuda_dl_sys::types::CUdevice, usize) -> T,
) -> (bool, T, usize) {
    use std::sync::atomic::AtomicBool;
    let stream = cx.stream();
    let count = leak(AtomicUsize::new(0));
    let hold = cx.hold(stream);
    // SAFETY: `count` is leaked.
    unsafe { cx.driver.cuLaunchHostFunc(stream, Some(bump), data(count)) }.unwrap();
    let (driver, device, handle) = (cx.driver, cx.device, cx.context.addr());
    let released = leak(AtomicBool::new(false));
    eprintln!("releasing the last retain on another thread");
    let releaser = std::thread::spawn(move || {
        // SAFETY: the case's one retain; nothing of the context is used after it.
        unsafe { driver.cuDevicePrimaryCtxRelease(device) }.unwrap();
        released.store(true, Ordering::SeqCst);
    });
    std::thread::sleep(Duration::from_millis(100));
    let answered = leak(AtomicBool::new(false));
    eprintln!(
        "asking on a third thread (release returned: {})",
        released.load(Ordering::SeqCst)
    );
    let asker = std::thread::spawn(move || {
        let answer = ask(driver, device, handle);
        answered.store(true, Ordering::SeqCst);
        answer
    });
    std::thread::sleep(Duration::from_millis(200));
    let early = answered.load(Ordering::SeqCst);
    eprintln!("letting the hold go (answered early: {early})");
    hold.release();
    // The hold's word lives in the context's page-locked memory, which the release frees: not to
    // be written again.
    std::mem::forget(hold);
    releaser.join().unwrap();
    let answer = asker.join().unwrap();
    eprintln!("release and question over");
    let mut again: CUcontext = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe {
        cx.driver
            .cuDevicePrimaryCtxRetain(&mut again, cx.device)
            .unwrap();
        cx.driver.cuCtxSetCurrent(again).unwrap();
    }
    (early, answer, count.load(Ordering::SeqCst))
}
