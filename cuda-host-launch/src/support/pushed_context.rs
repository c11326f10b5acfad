//! A context pushed onto the calling thread's context stack for a few driver calls, and popped
//! again: the one place the crate does that.
//!
//! The calling thread may be a user's (an enqueue that makes an event batch or a low-latency
//! page, a stream made by [`PrimaryContext`](crate::PrimaryContext)) or a crate thread that runs
//! user code (the reaper dropping owners, the poller dropping wakers). Either way the thread's
//! stack must be as it was when the call returns. A pop can fail (a fault injected by the fake
//! driver; on the H100 a real pop failed only on an empty stack, and then popped nothing, sticky
//! errors included: `tools/probes/context_stack_pops.out`), and a context left pushed would then
//! be current under the caller's feet, above whatever the caller had: so a failed pop is tried
//! once more, unless another context is current by then (a pop that failed after popping must
//! not take the caller's). The first pop's error is what the caller hears of, as it was the
//! first sign of trouble.

use cuda_dl_sys::CallError;
use cuda_dl_sys::types::CUcontext;

/// Runs `f` with `context` pushed as the calling thread's current context, then pops it, trying
/// a failed pop once more.
///
/// An error if the push failed (`f` did not run, nothing was pushed); else `f`'s value and the
/// pop's outcome: the first pop's error if it failed, even when the second one popped.
///
/// # Safety
/// `context` must be a handle the driver accepts for a push while `f` runs: a live context, or a
/// primary context's handle (the driver keeps those valid for the process's life).
pub(crate) unsafe fn with_pushed<R>(
    driver: &cuda_dl_sys::Driver,
    context: CUcontext,
    f: impl FnOnce() -> R,
) -> Result<(R, Result<(), CallError>), CallError> {
    // SAFETY: a handle the driver accepts (the caller's promise).
    unsafe { driver.cuCtxPushCurrent(context)? };
    let value = f();
    let mut popped = std::ptr::null_mut();
    // SAFETY: pushed just above; a valid out-pointer.
    let pop = unsafe { driver.cuCtxPopCurrent(&mut popped) };
    if pop.is_err() {
        // Once more, so that a passing failure does not leave `context` on the caller's stack;
        // not when another context is current (the failed pop popped after all: the caller's
        // own context is on top now). If the question fails too, what is current is not known:
        // the pop is tried, as a context of ours left pushed is the likelier case.
        let mut current = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let asked = unsafe { driver.cuCtxGetCurrent(&mut current) };
        if asked.is_err() || current == context {
            // SAFETY: as above.
            let _ = unsafe { driver.cuCtxPopCurrent(&mut popped) };
        }
    }
    Ok((value, pop))
}
