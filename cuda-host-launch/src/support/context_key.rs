//! A context as the crate names it: its handle **and** its `cuCtxGetId`.
//!
//! A handle alone does not name one context for the life of the process: a primary context keeps
//! its handle when it is made again after its last release or a reset (the same handle,
//! `cuCtxGetId` 1 then 2: the conformance suite's `contexts` cases), and a `cuCtxCreate` context
//! may get a destroyed one's handle. The id is never given to another context in the process. So every per-context
//! record of the crate (a launch's ticket, an event pool, a low-latency page) carries both, and a
//! reclaim takes only the work of contexts that are gone, found by this rule ([`Liveness`]):
//!
//! > a context whose handle, looked at **after** its work was collected, names another context (or
//! > none), is gone for good.
//!
//! The look must come after the collection: work collected earlier was enqueued into a context
//! that lived then; if the handle names another now, that one is gone (a handle names one context
//! at a time, and a context never comes back). Work enqueued after the look may be of a context
//! newer than the one the look saw, so it is never judged by it.
//!
//! Drivers before 12.0 have no `cuCtxGetId`: there the id is 0, the rule cannot tell two contexts
//! of one handle apart, and a reclaim falls back to what its caller knows (the context it released
//! or reset is gone).

use cuda_dl_sys::types::{CUcontext, CUdevice, CUresult};

use crate::support::error::Error;

/// A context: its handle and its `cuCtxGetId` (0 on drivers before 12.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ContextKey {
    /// The handle, as an address.
    pub(crate) handle: usize,
    /// `cuCtxGetId`; 0 where the driver has none.
    pub(crate) id: u64,
}

impl ContextKey {
    /// The handle as the driver takes it.
    pub(crate) fn raw(self) -> CUcontext {
        std::ptr::with_exposed_provenance_mut(self.handle)
    }
}

/// `context`'s key: its `cuCtxGetId`, or 0 on a driver without one (before 12.0).
///
/// # Errors
/// The driver's error for `cuCtxGetId` on a driver that has it (a dead handle, say).
pub(crate) fn key_of(
    driver: &cuda_dl_sys::Driver,
    context: CUcontext,
) -> Result<ContextKey, Error> {
    let id = match driver.raw().cuCtxGetId() {
        Ok(get_id) => {
            let mut id = 0;
            // SAFETY: a context handle from the driver or a binding (a dead one is refused); a
            // valid out-pointer.
            let code = unsafe { get_id(context, &mut id) };
            driver.check(code, "cuCtxGetId")?;
            id
        }
        Err(cuda_dl_sys::Error::DriverTooOld { .. } | cuda_dl_sys::Error::SymbolMissing { .. }) => {
            0
        }
        Err(e) => return Err(e.into()),
    };
    Ok(ContextKey {
        handle: context.addr(),
        id,
    })
}

/// What a handle names now, for the rule in the module's docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// The handle names the live context with this id.
    Live(u64),
    /// The handle names no live context: every context it named before is gone.
    None,
    /// Not known (the driver has no ids, before 12.0, or the look failed for another reason).
    Unknown,
}

impl Liveness {
    /// Looks at `handle`, the primary context of `device`: none if the device's primary context
    /// is inactive, else the id its handle names. `cuDevicePrimaryCtxGetState` waits while a last
    /// release or a reset of the context runs its pending work, so "none" means that work is over;
    /// `cuCtxGetId` answers at once, refusing the handle while the context is being destroyed
    /// (both the real driver's behaviour, checked against it by the conformance suite's
    /// `..._during_a_last_release_...`), so
    /// its refusal is only believed once the state, asked again, confirms it.
    ///
    /// The handle of a primary context stays the driver's for the process's life, so asking for
    /// its id is sound whatever happened to the context; a handle of a context made with
    /// `cuCtxCreate` is never looked at (after its destruction it may dangle).
    pub(crate) fn of_primary(
        driver: &cuda_dl_sys::Driver,
        device: CUdevice,
        handle: usize,
    ) -> Liveness {
        for _ in 0..2 {
            let (mut flags, mut active) = (0, 0);
            // SAFETY: a device the driver named; valid out-pointers.
            match unsafe { driver.cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) } {
                Ok(()) if active == 0 => return Liveness::None,
                Ok(()) => {}
                Err(_) => return Liveness::Unknown,
            }
            let Ok(get_id) = driver.raw().cuCtxGetId() else {
                return Liveness::Unknown;
            };
            let mut id = 0;
            // SAFETY: a primary context's handle (kept by the driver); a valid out-pointer.
            let code = unsafe { get_id(std::ptr::with_exposed_provenance_mut(handle), &mut id) };
            if code == CUresult::CUDA_SUCCESS {
                return Liveness::Live(id);
            }
            // Refused: a release in progress, or an error. The state, asked again, waits for the
            // release and says.
        }
        Liveness::Unknown
    }

    /// Whether the context `key` (of the handle looked at, collected before the look) is gone,
    /// given what the caller knows ([`Gone`]). Without ids (`key.id` 0, a driver before 12.0)
    /// contexts of one handle cannot be told apart: gone if the handle names none now.
    pub(crate) fn is_gone(self, key: ContextKey, known: Gone) -> bool {
        match known {
            Gone::Handle => return true,
            Gone::Context(id) if id == key.id => return true,
            _ => {}
        }
        if key.id == 0 {
            return self == Liveness::None;
        }
        match self {
            Liveness::Live(id) => id != key.id,
            Liveness::None => true,
            Liveness::Unknown => false,
        }
    }
}

/// What the caller of a reclaim knows is gone, beside what the look tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gone {
    /// Nothing: only the look decides.
    Unknown,
    /// The context with this id (it reset it: read before the reset).
    Context(u64),
    /// Every context the handle named before the call (the caller destroyed or reset it, and
    /// promises nothing of a later one at the handle has work pending).
    Handle,
}
