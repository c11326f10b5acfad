//! Knowing whether the current thread is inside a host function (on a driver thread).
//!
//! The trampoline marks the thread while the user's function runs. Library code asks before anything
//! a driver thread must not do: calling CUDA (launches, flush) or dropping values whose `Drop` may
//! call CUDA (this crate's resource types defer their destruction instead).

use std::cell::Cell;

thread_local! {
    // A const-initialised `Cell<bool>` has no destructor to register, so it is cheap and safe to
    // touch on threads this program did not create (the driver's).
    static IN_HOST_FUNCTION: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is running a host function launched through this crate (or a user
/// object's destructor of this crate), that is, a thread of the driver where CUDA calls are not
/// allowed and values that may call CUDA in `Drop` must not be dropped.
#[inline]
pub fn in_host_function() -> bool {
    IN_HOST_FUNCTION.with(Cell::get)
}

/// Marks the thread as inside a host function until dropped (restoring the previous mark, so nested
/// scopes are fine).
pub(crate) struct HostFunctionScope {
    previous: bool,
}

impl HostFunctionScope {
    #[inline]
    pub(crate) fn enter() -> Self {
        HostFunctionScope {
            previous: IN_HOST_FUNCTION.with(|c| c.replace(true)),
        }
    }
}

impl Drop for HostFunctionScope {
    #[inline]
    fn drop(&mut self) {
        IN_HOST_FUNCTION.with(|c| c.set(self.previous));
    }
}
