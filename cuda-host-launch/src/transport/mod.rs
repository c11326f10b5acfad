//! How the crate learns that stream work has finished, one file per way:
//!
//! - [`host_function`]: the driver runs a host function of this crate on its thread (launches,
//!   graph host nodes, and `CompletionMode::HostFunction` futures); [`user_object`]: the driver
//!   tells that a graph holding records is gone.
//! - [`low_latency`]: the stream writes a flag into host memory and the watcher thread of this crate
//!   sees it (`CompletionMode::LowLatency` futures).
//! - [`event`]: the stream records an event, which the watcher thread of this crate queries
//!   (`release_after`, `spawn_after`, `CompletionMode::Event` futures).
//!
//! A future of either kind shares a [`completion_state::CompletionState`] with its transport. A new
//! transport is a file here and a variant of `CompletionMode`; when a context is gone,
//! [`reclaim_gone`] tells each transport that holds work of it.

use cuda_dl_sys::types::{CUcontext, CUdevice};

use crate::enqueue::pending;
use crate::support::context_key::{Gone, Liveness, key_of};

pub(crate) mod bell;
pub(crate) mod completion_state;
pub(crate) mod event;
pub(crate) mod host_function;
pub(crate) mod low_latency;
pub(crate) mod options;
pub(crate) mod poller_barrier;
pub(crate) mod poller_pace;
pub(crate) mod primary_release;
pub(crate) mod user_object;
pub(crate) mod waker_slot;
pub(crate) mod watcher;

/// Releases the work of every context of the handle `handle` that is gone (see
/// `support::context_key` for the rule, `look` for how the handle is looked at after each
/// transport collected its work, `known` for what the caller knows is gone): the event transport
/// forgets its pools and queues there, pending launches and event work are released through the
/// cleanup queue (futures resolve to `ContextLost`), and low-latency futures fail. Returns how
/// many launches it released.
///
/// # Safety
/// As [`pending::reclaim_gone`]: what `known` names is gone.
pub(crate) unsafe fn reclaim_gone(
    handle: usize,
    look: &dyn Fn() -> Liveness,
    known: Gone,
) -> usize {
    event::forget_gone(handle, look, known);
    // SAFETY: the caller's promise.
    let count = unsafe { pending::reclaim_gone(handle, look, known) };
    low_latency::fail_gone(handle, look, known);
    count
}

/// Releases the work of every context that is gone, wherever this crate holds some (pending
/// launches and event work, event pools, low-latency futures), among the primary contexts this
/// crate retained: contexts whose last release this crate did not make (another binding's), found
/// by the rule of `support::context_key`. (The handle of a context made with `cuCtxCreate` is
/// never looked at: after its destruction it may dangle; `reclaim_pending` is for those.) For
/// [`flush`](crate::flush).
pub(crate) fn sweep_gone() {
    let Some(driver) = cuda_dl_sys::Driver::get() else {
        return;
    };
    let mut handles = pending::pending_handles();
    handles.extend(event::pool_handles());
    handles.extend(low_latency::handles());
    handles.sort_unstable();
    handles.dedup();
    for handle in handles {
        let Some(device) = primary_release::device_of(handle) else {
            continue;
        };
        let look = || Liveness::of_primary(driver, device, handle);
        // SAFETY: nothing is known gone: the look decides.
        unsafe { reclaim_gone(handle, &look, Gone::Unknown) };
    }
}

/// Waits until each poller of this crate has finished a round that began after this call (see
/// `poller_barrier`), or `deadline` passes; whether both did. A poller's own thread does not wait
/// for itself.
pub(crate) fn wait_for_pollers(deadline: Option<std::time::Instant>) -> bool {
    bell::wait_for_round(deadline)
}

/// After this crate let go of a retain of `device`'s primary context, whose handle is `handle`:
/// if that was the last retain, the context is gone, and its work that will never run or complete
/// (after a sticky error) is released. Safe whoever retains the device again meanwhile: only the
/// work of contexts that are gone is taken (see `support::context_key`).
pub(crate) fn reclaim_after_release(driver: &cuda_dl_sys::Driver, device: CUdevice, handle: usize) {
    let look = || Liveness::of_primary(driver, device, handle);
    // SAFETY: nothing is known gone: the look decides (on a driver without context ids, only a
    // handle that names no context now counts as gone: the context of the last release).
    unsafe { reclaim_gone(handle, &look, Gone::Unknown) };
}

/// Runs `reset`, the driver's reset of `device`'s primary context `handle`, while the watcher
/// queries nothing (the reset destroys the context's events), and if it succeeds releases the
/// reset context's work as [`reclaim_gone`] does (the event transport forgets it under the same
/// lock as the reset); returns how many launches. A failed reset reclaims and forgets nothing.
///
/// # Safety
/// `reset` resets the primary context of `device`, whose handle is `handle`.
pub(crate) unsafe fn reset_and_reclaim<E>(
    driver: &cuda_dl_sys::Driver,
    device: CUdevice,
    handle: usize,
    reset: impl FnOnce() -> Result<(), E>,
) -> Result<usize, E> {
    // The context being reset, by id where the driver gives one (the look after the reset may
    // fail; the reset context is gone all the same). If the id look fails on a driver that has
    // ids, the look after the reset decides alone: work of a context made again at the handle
    // meanwhile (by another thread's retain) is never taken.
    let known = match key_of(driver, std::ptr::with_exposed_provenance_mut(handle)) {
        Ok(key) if key.id != 0 => Gone::Context(key.id),
        _ => unknown_context(driver),
    };
    let look = || Liveness::of_primary(driver, device, handle);
    event::around_reset(handle, reset, &look, known)?;
    // SAFETY: the reset has returned: the context it reset is gone.
    let count = unsafe { pending::reclaim_gone(handle, &look, known) };
    low_latency::fail_gone(handle, &look, known);
    Ok(count)
}

/// What a reclaim knows is gone when it could not learn the id of the context it reset or was told
/// of: on a driver with context ids (CUDA 12.0), nothing (the look after the work was collected
/// decides, and work of a context made again at the handle is left alone: a failed look must not
/// take it); without ids, every context of the handle (the caller's promise), as nothing else
/// can be told.
fn unknown_context(driver: &cuda_dl_sys::Driver) -> Gone {
    if driver.raw().cuCtxGetId().is_ok() {
        Gone::Unknown
    } else {
        Gone::Handle
    }
}

/// Releases, through the cleanup queue, the owners of every launch into `context` whose host
/// function has not run, and returns how many.
///
/// Call it after destroying a context yourself (`cuCtxDestroy`), or resetting a primary context
/// (`cuDevicePrimaryCtxReset`), that may have had a sticky error: the driver then never runs those
/// host functions, and without this their owners would never be dropped. (After a normal destroy
/// the driver has already run them all, and this finds nothing.)
/// [`PrimaryContext::reset`](crate::PrimaryContext::reset) and the last release of a
/// [`PrimaryContext`](crate::PrimaryContext) do it for you.
///
/// Only launches into contexts that are gone are taken: on drivers with context ids (`cuCtxGetId`,
/// CUDA 12.0), launches into a context made since at the same handle (the handle of a primary
/// context stays when it is made again) are left alone. A launch still inside its launch call is
/// never taken (its launcher or the driver's thread releases it), so launches racing this call are
/// released exactly once either way.
///
/// # Safety
/// The driver must no longer be able to run host functions of `context` that were launched before
/// this call: it was destroyed or reset, and that call returned. Otherwise (on a driver before 12.0,
/// which cannot tell contexts of one handle apart) a host function could run after its owners were
/// dropped.
pub unsafe fn reclaim_pending(context: CUcontext) -> usize {
    let Some(driver) = cuda_dl_sys::Driver::get() else {
        // Nothing was ever launched.
        return 0;
    };
    let handle = context.addr();
    // A primary context's handle stays the driver's: its state tells a context made again since
    // apart from the one the caller destroyed or reset. Any other handle may dangle: never asked.
    match primary_release::device_of(handle) {
        Some(device) => {
            let look = || Liveness::of_primary(driver, device, handle);
            let known = match look() {
                Liveness::Unknown => unknown_context(driver),
                _ => Gone::Unknown,
            };
            // SAFETY: the caller's promise: the handle's context before this call is gone.
            unsafe { reclaim_gone(handle, &look, known) }
        }
        None => {
            let look = || Liveness::Unknown;
            // SAFETY: the caller's promise: every context of the handle before this call is gone.
            unsafe { reclaim_gone(handle, &look, Gone::Handle) }
        }
    }
}
