//! Events per context: created lazily in batches (by the enqueue that found the pool dry, with no
//! lock held), reused once their completion was seen, bounded,
//! and given back (destroyed, with the context's retain) when the poller goes idle: destroyed only
//! if the context still lives, since another binding's reset destroys them with it (see
//! [`Pool::give_back`]).
//!
//! A pool exists only for a device's **primary** context, which the pool retains
//! (`cuDevicePrimaryCtxRetain`) from its first event until it is given back: another binding's last
//! release of the context (cudarc drops its `CudaContext`) then cannot destroy the events that the
//! poller still queries. A context made with `cuCtxCreate` cannot be held that way and is refused
//! ([`Error::NotPrimaryContext`]).
//!
//! Pools are found by context handle **and** id (`support::context_key`): a primary context made
//! again at its handle gets a new pool. A pool whose events are all back, or stranded (a capture
//! may hold them, or the context had a sticky error), gives its retain back ([`Pools::give_back_done`]):
//! a stranded event is never touched again (the context's destruction takes it), and holding
//! the context for it would keep the user's last release from destroying the context and
//! reclaiming its work.

use std::collections::HashMap;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUcontext, CUdevice, CUevent, CUevent_flags};

use crate::support::context_key::{ContextKey, Liveness};
use crate::support::error::Error;
use crate::support::fast_hash::FastHash;
use crate::support::pushed_context::with_pushed;
use crate::transport::primary_release;

/// Events made at once when a pool runs dry (one push and pop of the context for all), by the
/// enqueue that found it dry, with no lock held ([`Pools::take`]).
pub(super) const BATCH: usize = 32;
/// Free events a pool keeps; more are destroyed as they come back.
const MAX_FREE: usize = 4096;
/// Contexts remembered as not primary; the oldest is forgotten beyond this.
const MAX_NOT_PRIMARY: usize = 64;

/// The events of one primary context.
pub(super) struct Pool {
    device: CUdevice,
    /// Events ready to be recorded.
    free: Vec<usize>,
    /// Events taken and not yet back: recorded and waiting, or being recorded.
    pub(super) out: usize,
    /// Events a capture may hold (recorded while another thread began a capture of the stream) or
    /// of a stream whose context failed: never queried, reused or destroyed by the pool again
    /// (the context's destruction takes them; their records wait for it).
    pub(super) stranded: usize,
    /// Callbacks whose event completed and went back, still to run on the lane: the pool keeps
    /// its context retained until they ran. Counted up here (under the pools' lock), down by the
    /// lane with no lock ([`Pools::call_out`]).
    calls: Arc<AtomicUsize>,
    /// Since when the watcher has seen it hold its context for nothing (not busy), while other
    /// contexts had work pending ([`Pools::give_back_idle_for`]).
    idle_since: Option<Instant>,
}

/// The pools, by context (handle and id).
#[derive(Default)]
pub(super) struct Pools {
    by_context: HashMap<ContextKey, Pool, FastHash>,
    /// Contexts found not to be primary (a context made later at the handle has another id):
    /// refused again at once, without the device and primary-context calls that found it
    /// (`CompletionMode::Auto` asks on every completion).
    not_primary: Vec<ContextKey>,
}

impl Pools {
    /// Takes an event of `key`'s pool, creating the pool (retaining the context, which must be
    /// primary) as needed. A pool with no free event reserves a batch instead (`None`): [`BATCH`]
    /// events counted out, so that the pool and its retain stay while the caller makes them with
    /// no lock held ([`make_events`]) and hands them in ([`Pools::settle`]). The pools' lock is
    /// process-wide: the watcher's rounds and every enqueue take it.
    pub(super) fn take(
        &mut self,
        driver: &cuda_dl_sys::Driver,
        key: ContextKey,
    ) -> Result<Option<CUevent>, Error> {
        let context = key.raw();
        let pool = match self.by_context.entry(key) {
            std::collections::hash_map::Entry::Occupied(pool) => pool.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let refused = Error::NotPrimaryContext {
                    context: context.addr(),
                };
                if self.not_primary.contains(&key) {
                    return Err(refused);
                }
                match Pool::new(driver, context) {
                    Ok(pool) => slot.insert(pool),
                    Err(Error::NotPrimaryContext { .. }) => {
                        if self.not_primary.len() >= MAX_NOT_PRIMARY {
                            self.not_primary.remove(0);
                        }
                        self.not_primary.push(key);
                        return Err(refused);
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let Some(event) = pool.free.pop() else {
            pool.out += BATCH;
            return Ok(None);
        };
        pool.out += 1;
        Ok(Some(ptr::with_exposed_provenance_mut(event)))
    }

    /// Ends the reservation of a [`Pools::take`] that found `key`'s pool dry: the events `made`
    /// join its free ones, and one of them is taken (counted out) if `take_one`. A pool found
    /// gone (the context was reset meanwhile, and forgotten) leaves them as a forgotten pool's
    /// are, never destroyed, since their handles may name another binding's events by now; the
    /// event taken is then the caller's to record, which the gone context refuses.
    pub(super) fn settle(
        &mut self,
        key: ContextKey,
        made: &mut Vec<usize>,
        take_one: bool,
    ) -> Option<CUevent> {
        let event = if take_one { made.pop() } else { None };
        if let Some(pool) = self.by_context.get_mut(&key) {
            pool.out = pool.out.saturating_sub(BATCH) + usize::from(event.is_some());
            pool.free.append(made);
        } else {
            made.clear();
        }
        event.map(ptr::with_exposed_provenance_mut)
    }

    /// Gives back an event whose record completed (or was never made): it may be recorded again.
    pub(super) fn give_back(
        &mut self,
        driver: &cuda_dl_sys::Driver,
        context: ContextKey,
        event: CUevent,
    ) {
        let Some(pool) = self.by_context.get_mut(&context) else {
            return;
        };
        pool.out = pool.out.saturating_sub(1);
        if pool.free.len() < MAX_FREE {
            pool.free.push(event.expose_provenance());
        } else {
            // SAFETY: an event of this pool's (live, retained) context that nothing uses any more.
            let _ = unsafe { driver.cuEventDestroy(event) };
        }
    }

    /// A callback of `context` whose event completed (and goes back) is on its way to the lane:
    /// returns the count the lane takes it off once the callback ran, so that the pool keeps its
    /// context retained meanwhile. `None` if the context has no pool (forgotten by a reset).
    pub(super) fn call_out(&mut self, context: ContextKey) -> Option<Arc<AtomicUsize>> {
        let pool = self.by_context.get(&context)?;
        pool.calls.fetch_add(1, Ordering::AcqRel);
        Some(Arc::clone(&pool.calls))
    }

    /// An event that must never be touched again (see [`Pool::stranded`]).
    pub(super) fn strand(&mut self, context: ContextKey) {
        if let Some(pool) = self.by_context.get_mut(&context) {
            pool.out = pool.out.saturating_sub(1);
            pool.stranded += 1;
        }
    }

    /// Whether there is no pool.
    pub(super) fn is_empty(&self) -> bool {
        self.by_context.is_empty()
    }

    /// Gives back every pool (as [`Pools::give_back_done`] with `all`) if none has an event out;
    /// `None` (nothing given back) if one has. The event side's idle give-back and the watcher's
    /// stop both decide this way.
    pub(super) fn give_back_all_if_none_out(
        &mut self,
        driver: &cuda_dl_sys::Driver,
    ) -> Option<Vec<(CUdevice, usize)>> {
        (!self.any_out()).then(|| self.give_back_done(driver, true))
    }

    /// Whether any pool has events out.
    pub(super) fn any_out(&self) -> bool {
        self.by_context.values().any(Pool::busy)
    }

    /// Gives back every pool with no event out (its free events destroyed, its stranded ones left
    /// to the context) and releases its context: all of them when the poller goes idle (`all`),
    /// else those with stranded events (nothing of theirs is waited for: their context is held for
    /// nothing). Returns the device and handle of each release, for
    /// `transport::reclaim_after_release`.
    pub(super) fn give_back_done(
        &mut self,
        driver: &cuda_dl_sys::Driver,
        all: bool,
    ) -> Vec<(CUdevice, usize)> {
        let done: Vec<ContextKey> = self
            .by_context
            .iter()
            .filter(|(_, pool)| !pool.busy() && (all || pool.stranded > 0))
            .map(|(key, _)| *key)
            .collect();
        self.give_back_all_of(driver, done)
    }

    /// Gives back every pool that has held its context for nothing (no event out, no callback to
    /// run) for `idle_exit` up to `now`, as seen by these calls (the first that finds a pool idle
    /// starts its count; one that finds it busy ends it). For the watcher while other contexts'
    /// work is pending: one context's pool must not wait for every context to be idle, since it
    /// keeps the user's last release from destroying the context and reclaiming its work. Returns
    /// the releases, as [`Pools::give_back_done`].
    pub(super) fn give_back_idle_for(
        &mut self,
        driver: &cuda_dl_sys::Driver,
        now: Instant,
        idle_exit: Duration,
    ) -> Vec<(CUdevice, usize)> {
        let mut done = Vec::new();
        for (key, pool) in &mut self.by_context {
            if pool.busy() {
                pool.idle_since = None;
                continue;
            }
            let since = *pool.idle_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= idle_exit {
                done.push(*key);
            }
        }
        self.give_back_all_of(driver, done)
    }

    /// Gives back the pools of `keys` (their free events destroyed, their stranded ones left to
    /// the context) and releases their contexts; returns the device and handle of each release.
    fn give_back_all_of(
        &mut self,
        driver: &cuda_dl_sys::Driver,
        keys: Vec<ContextKey>,
    ) -> Vec<(CUdevice, usize)> {
        let mut released = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(pool) = self.by_context.remove(&key) {
                released.push((pool.device, key.handle));
                pool.give_back(driver, key);
            }
        }
        released
    }

    /// Gives back `context`'s pool (as [`Pools::give_back_done`] does) if none of its events is
    /// out; returns the release's device and handle.
    pub(super) fn give_back_if_idle(
        &mut self,
        driver: &cuda_dl_sys::Driver,
        context: ContextKey,
    ) -> Option<(CUdevice, usize)> {
        if self.by_context.get(&context)?.busy() {
            return None;
        }
        let pool = self.by_context.remove(&context)?;
        let device = pool.device;
        pool.give_back(driver, context);
        Some((device, context.handle))
    }

    /// The handles of the contexts that have a pool.
    pub(super) fn handles(&self) -> Vec<usize> {
        self.by_context.keys().map(|k| k.handle).collect()
    }

    /// The contexts of `handle` that have a pool.
    pub(super) fn keys_of(&self, handle: usize) -> impl Iterator<Item = ContextKey> + '_ {
        self.by_context
            .keys()
            .copied()
            .filter(move |k| k.handle == handle)
    }

    /// Forgets `context`'s pool without touching its events, which the context's destruction took
    /// (it is gone), and releases the pool's retain.
    pub(super) fn forget(&mut self, driver: &cuda_dl_sys::Driver, context: ContextKey) {
        if let Some(pool) = self.by_context.remove(&context) {
            pool.release(driver);
        }
    }
}

impl Pool {
    /// Whether it holds its context for something: events out, or callbacks still to run.
    fn busy(&self) -> bool {
        self.out > 0 || self.calls.load(Ordering::Acquire) > 0
    }

    fn new(driver: &cuda_dl_sys::Driver, context: CUcontext) -> Result<Pool, Error> {
        let mut device: CUdevice = 0;
        pushed(driver, context, || {
            // SAFETY: a valid out-pointer; `context` is current.
            unsafe { driver.cuCtxGetDevice(&mut device) }
        })?;
        // Resolved before the retain: a retain must be released again.
        primary_release::release_function(driver)?;
        let (mut flags, mut active) = (0, 0);
        // SAFETY: a device the driver just named; valid out-pointers.
        unsafe { driver.cuDevicePrimaryCtxGetState(device, &mut flags, &mut active)? };
        if active == 0 {
            // The device's primary context does not exist, so `context` is not it; a retain would
            // create one (a context's worth of device memory) only to destroy it again.
            return Err(Error::NotPrimaryContext {
                context: context.addr(),
            });
        }
        let mut primary: CUcontext = ptr::null_mut();
        // SAFETY: a device the driver just named; a valid out-pointer.
        unsafe { driver.cuDevicePrimaryCtxRetain(&mut primary, device)? };
        if primary != context {
            // Not the primary context: let the retain go again.
            // SAFETY: retained just above.
            unsafe { primary_release::release(driver, device) };
            return Err(Error::NotPrimaryContext {
                context: context.addr(),
            });
        }
        primary_release::remember(context.addr(), device);
        Ok(Pool {
            device,
            free: Vec::new(),
            out: 0,
            stranded: 0,
            calls: Arc::default(),
            idle_since: None,
        })
    }

    /// Destroys the free events (the stranded ones are left to the context) and releases the
    /// context, `key`.
    ///
    /// The retain keeps the context from a last release, not from a reset: another binding's
    /// `cuDevicePrimaryCtxReset` (`cudaDeviceReset`) destroys it with its events, the retain
    /// count kept; the next retain makes a new one at the handle (as the real driver does). The events' handles may then name other
    /// bindings' events, so they are destroyed only if the handle still names this context (on a
    /// driver without context ids, before 12.0, this cannot be told, and they are destroyed). A
    /// look that fails leaves them to the context: a few events kept too long, never another's
    /// destroyed.
    fn give_back(self, driver: &cuda_dl_sys::Driver, key: ContextKey) {
        let alive = key.id == 0
            || Liveness::of_primary(driver, self.device, key.handle) == Liveness::Live(key.id);
        if alive {
            for &event in &self.free {
                // SAFETY: an event of this pool's context, which still lives (looked at just
                // above; a reset meanwhile would be another binding's use of the context while
                // this crate's poller uses it, which the reset's own contract forbids); not in
                // use.
                let _ = unsafe { driver.cuEventDestroy(ptr::with_exposed_provenance_mut(event)) };
            }
        }
        self.release(driver);
    }

    fn release(self, driver: &cuda_dl_sys::Driver) {
        // SAFETY: the pool retained the device's primary context once, in `new`.
        unsafe { primary_release::release(driver, self.device) };
    }
}

/// Makes up to [`BATCH`] events in `context` (pushed for the while) into `made`, for a dry pool
/// ([`Pools::take`]): with no lock held, so that the watcher and the other enqueues need not wait
/// for these driver calls. An error if none could be made (fewer is fine), or if the context
/// could not be popped again; the events made are in `made` either way.
pub(super) fn make_events(
    driver: &cuda_dl_sys::Driver,
    context: CUcontext,
    made: &mut Vec<usize>,
) -> Result<(), Error> {
    pushed(driver, context, || {
        for _ in 0..BATCH {
            let mut event: CUevent = ptr::null_mut();
            // SAFETY: a valid out-pointer; `context` is current, so the event is made in it.
            let created = unsafe {
                driver.cuEventCreate(&mut event, CUevent_flags::CU_EVENT_DISABLE_TIMING.0)
            };
            if let Err(e) = created {
                // Fine if at least one was made.
                return if made.is_empty() { Err(e) } else { Ok(()) };
            }
            made.push(event.expose_provenance());
        }
        Ok(())
    })
}

/// Runs `f` with `context` pushed as the calling thread's current context ([`with_pushed`]: a
/// failed pop is tried once more). A failed pop is an error too.
fn pushed(
    driver: &cuda_dl_sys::Driver,
    context: CUcontext,
    f: impl FnOnce() -> Result<(), cuda_dl_sys::CallError>,
) -> Result<(), Error> {
    // SAFETY: a live context (the stream's, or one this pool retains).
    let (result, pop) = unsafe { with_pushed(driver, context, f) }?;
    // `f`'s error first; then the first pop's (the caller hears of it even where the second pop
    // set its stack right).
    result?;
    Ok(pop?)
}
