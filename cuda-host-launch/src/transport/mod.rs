//! How the crate learns that stream work has finished, one file per way:
//!
//! - [`host_function`]: the driver runs a host function of this crate on its thread (launches,
//!   graph host nodes, and `CompletionMode::HostFunction` futures); [`user_object`]: the driver
//!   tells that a graph holding records is gone.
//! - [`low_latency`]: the stream writes a flag into host memory and a poller thread of this crate
//!   sees it (`CompletionMode::LowLatency` futures).
//! - [`event`]: the stream records an event, which a poller thread of this crate queries
//!   (`release_after`, `spawn_after`, `CompletionMode::Event` futures).
//!
//! A future of either kind shares a [`completion_state::CompletionState`] with its transport. A new
//! transport is a file here and a variant of `CompletionMode`; when a context is lost, [`reclaim`]
//! tells each transport that holds work of it.

use cuda_sys::types::CUcontext;

use crate::tracking::pending;

pub(crate) mod completion_state;
pub(crate) mod event;
pub(crate) mod host_function;
pub(crate) mod low_latency;
pub(crate) mod options;
pub(crate) mod poller_pace;
pub(crate) mod primary_release;
pub(crate) mod user_object;
pub(crate) mod waker_slot;

/// Releases, through the cleanup queue, the owners of every launch into `context` whose host
/// function has not run, and fails the low-latency futures of `context`; returns how many launches.
///
/// # Safety
/// As [`reclaim_pending`].
pub(crate) unsafe fn reclaim(context: CUcontext) -> usize {
    // The event transport's pool and queues of the context go first: its events are dead.
    event::forget_context(context);
    // SAFETY: the caller's promise.
    let count = unsafe { pending::reclaim(context) };
    // Low-latency completions of the context wait for flags it will never write.
    low_latency::fail_context(context);
    count
}

/// Runs `reset`, the driver's reset of the primary context `context`, while the event poller
/// queries nothing (the reset destroys the context's events), and if it succeeds reclaims the
/// context's work as [`reclaim`] does (the event transport forgot the context under the same lock
/// as the reset); returns how many launches. A failed reset reclaims and forgets nothing.
///
/// # Safety
/// `reset` resets `context` (then, as for [`reclaim`], the driver runs none of its host functions
/// any more).
pub(crate) unsafe fn reset_and_reclaim<E>(
    context: CUcontext,
    reset: impl FnOnce() -> Result<(), E>,
) -> Result<usize, E> {
    event::around_reset(context, reset)?;
    // SAFETY: the reset has returned (the caller's promise).
    let count = unsafe { pending::reclaim(context) };
    low_latency::fail_context(context);
    Ok(count)
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
/// A launch still inside its launch call is never taken (its launcher or the driver's thread
/// releases it), so launches racing this call are released exactly once either way.
///
/// # Safety
/// The driver must no longer be able to run host functions of `context` that were launched before
/// this call: it was destroyed or reset, and that call returned. Otherwise a host function could
/// run after its owners were dropped.
pub unsafe fn reclaim_pending(context: CUcontext) -> usize {
    // SAFETY: the caller's promise is `reclaim`'s precondition.
    unsafe { reclaim(context) }
}
