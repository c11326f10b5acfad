//! The synchronisation primitives of the lock-free core (the intrusive stack, the cleanup queue and
//! its wake-up protocol, the record pool, the launch state, the ticket table): std's, or loom's when model-checking
//! (`RUSTFLAGS="--cfg loom"`, see `scripts/loom`), so that the loom models run the library's own
//! functions. The pattern of tokio's `src/loom/` and crossbeam-utils' `primitive`.
//!
//! The cell has loom's API shape (`with`, `with_mut`) in both builds.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};

#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// Threads: the reaper's handle and its parking.
pub(crate) mod thread {
    #[cfg(loom)]
    pub(crate) use loom::thread::Thread;
    #[cfg(not(loom))]
    pub(crate) use std::thread::Thread;
}

/// `UnsafeCell` with loom's API.
pub(crate) mod cell {
    #[cfg(loom)]
    pub(crate) use loom::cell::UnsafeCell;

    /// `std::cell::UnsafeCell` with loom's API: access through a raw pointer inside a closure.
    #[cfg(not(loom))]
    #[derive(Debug)]
    #[repr(transparent)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    #[cfg(not(loom))]
    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            UnsafeCell(std::cell::UnsafeCell::new(value))
        }

        /// Calls `f` with a pointer to read the value through.
        #[allow(
            dead_code,
            reason = "loom's API; the library only writes through its cells today"
        )]
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Calls `f` with a pointer to write the value through.
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

/// Locks `mutex`, taking over a poisoned lock (no code of this crate panics while it holds one of
/// these, and what they guard stays consistent if something did).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
