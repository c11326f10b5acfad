//! Events per context: created lazily in batches, reused once their completion was seen, bounded,
//! and given back (destroyed, with the context's retain) when the poller goes idle.
//!
//! A pool exists only for a device's **primary** context, which the pool retains
//! (`cuDevicePrimaryCtxRetain`) from its first event until it is given back: another binding's last
//! release of the context (cudarc drops its `CudaContext`) then cannot destroy the events that the
//! poller still queries. A context made with `cuCtxCreate` cannot be held that way and is refused
//! ([`Error::NotPrimaryContext`]).

use std::collections::HashMap;
use std::ptr;

use cuda_sys::types::{CUcontext, CUdevice, CUevent, CUevent_flags};

use crate::support::error::Error;
use crate::support::raw_stream::context_id;
use crate::transport::primary_release;

/// Events made at once when a pool runs dry (one push and pop of the context for all).
const BATCH: usize = 32;
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
    /// of a stream whose context failed: never queried, reused or destroyed by the pool again. A
    /// pool with any keeps its retain (their releases wait for the context's reset).
    pub(super) stranded: usize,
}

/// The pools, by context handle.
#[derive(Default)]
pub(super) struct Pools {
    by_context: HashMap<usize, Pool>,
    /// Contexts found not to be primary, by handle and `cuCtxGetId` (a context made later at the
    /// handle has another id): refused again at once, without the device and primary-context
    /// calls that found it (`CompletionMode::Auto` asks on every completion).
    not_primary: Vec<(usize, u64)>,
}

impl Pools {
    /// Takes an event of `context`'s pool, creating the pool (retaining the context, which must be
    /// primary) or a batch of events as needed.
    pub(super) fn take(
        &mut self,
        driver: &cuda_sys::Driver,
        context: CUcontext,
    ) -> Result<CUevent, Error> {
        let pool = match self.by_context.entry(context.addr()) {
            std::collections::hash_map::Entry::Occupied(pool) => pool.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let key = (context.addr(), context_id(driver, context)?);
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
        if pool.free.is_empty() {
            pool.refill(driver, context)?;
        }
        let event = pool.free.pop().unwrap_or(0);
        pool.out += 1;
        Ok(ptr::with_exposed_provenance_mut(event))
    }

    /// Gives back an event whose record completed (or was never made): it may be recorded again.
    pub(super) fn give_back(&mut self, driver: &cuda_sys::Driver, context: usize, event: CUevent) {
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

    /// An event that must never be touched again (see [`Pool::stranded`]).
    pub(super) fn strand(&mut self, context: usize) {
        if let Some(pool) = self.by_context.get_mut(&context) {
            pool.out = pool.out.saturating_sub(1);
            pool.stranded += 1;
        }
    }

    /// Whether any pool has events out.
    pub(super) fn any_out(&self) -> bool {
        self.by_context.values().any(|pool| pool.out > 0)
    }

    /// Destroys the free events of every pool with none out and none stranded, and releases its
    /// context. Called by the poller when it goes idle. Returns the device and context of each
    /// release, for [`primary_release::reclaim_if_destroyed`].
    pub(super) fn give_back_idle(&mut self, driver: &cuda_sys::Driver) -> Vec<(CUdevice, usize)> {
        let mut released = Vec::new();
        self.by_context.retain(|&context, pool| {
            if pool.out > 0 || pool.stranded > 0 {
                return true;
            }
            released.push((pool.device, context));
            for &event in &pool.free {
                // SAFETY: an event of this pool's retained context, not in use.
                let _ = unsafe { driver.cuEventDestroy(ptr::with_exposed_provenance_mut(event)) };
            }
            // SAFETY: the pool retained the device's primary context once, in `new`.
            unsafe { primary_release::release(driver, pool.device) };
            false
        });
        released
    }

    /// Forgets `context`'s pool without touching its events, which the context's reset destroys,
    /// and releases the pool's retain. Called before a reset.
    pub(super) fn forget(&mut self, driver: &cuda_sys::Driver, context: usize) {
        if let Some(pool) = self.by_context.remove(&context) {
            pool.release(driver);
        }
    }
}

impl Pool {
    fn new(driver: &cuda_sys::Driver, context: CUcontext) -> Result<Pool, Error> {
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
        Ok(Pool {
            device,
            free: Vec::new(),
            out: 0,
            stranded: 0,
        })
    }

    fn refill(&mut self, driver: &cuda_sys::Driver, context: CUcontext) -> Result<(), Error> {
        let free = &mut self.free;
        pushed(driver, context, || {
            for _ in 0..BATCH {
                let mut event: CUevent = ptr::null_mut();
                // SAFETY: a valid out-pointer; `context` is current, so the event is made in it.
                let made = unsafe {
                    driver.cuEventCreate(&mut event, CUevent_flags::CU_EVENT_DISABLE_TIMING.0)
                };
                if let Err(e) = made {
                    // Fine if at least one was made.
                    return if free.is_empty() { Err(e) } else { Ok(()) };
                }
                free.push(event.expose_provenance());
            }
            Ok(())
        })
    }

    fn release(self, driver: &cuda_sys::Driver) {
        // SAFETY: the pool retained the device's primary context once, in `new`.
        unsafe { primary_release::release(driver, self.device) };
    }
}

/// Runs `f` with `context` pushed as the calling thread's current context. A failed pop is an
/// error too.
fn pushed(
    driver: &cuda_sys::Driver,
    context: CUcontext,
    f: impl FnOnce() -> Result<(), cuda_sys::CallError>,
) -> Result<(), Error> {
    // SAFETY: a live context (the stream's, or one this pool retains).
    unsafe { driver.cuCtxPushCurrent(context)? };
    let result = f();
    let mut popped = ptr::null_mut();
    // SAFETY: pushed just above; a valid out-pointer.
    let pop = unsafe { driver.cuCtxPopCurrent(&mut popped) };
    // `f`'s error first; then a failed pop, which left the context on the caller's stack (the
    // caller hears of it rather than find it there).
    result?;
    Ok(pop?)
}
