//! The kinds of record content: a C function with its user data and owners, a closure, a value to
//! drop later, and a caught panic on its way to be reported. (Copied bytes have a record layout of
//! their own: see `layout.rs`.)

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::layout::{PanicPayload, Payload, SharedPayload};

/// A raw launch: `f(user_data)`, with owners kept alive until it has returned.
pub(crate) struct RawPayload<O> {
    pub(crate) f: unsafe extern "C" fn(*mut c_void),
    pub(crate) user_data: *mut c_void,
    #[allow(
        dead_code,
        reason = "held only so it is dropped after the run, with the record"
    )]
    pub(crate) owners: O,
}

// SAFETY: `launch_host_function`'s contract makes the caller promise that `f(user_data)` may run on
// another thread; the owners are `Send` by the bound.
unsafe impl<O: Send> Send for RawPayload<O> {}

// SAFETY: the repeatable launch's contract makes the caller promise that `f(user_data)` may run on
// several threads at once; the owners are `Sync` by the bound.
unsafe impl<O: Sync> Sync for RawPayload<O> {}

impl<O: Send + 'static> Payload for RawPayload<O> {
    unsafe fn run(&mut self) {
        // SAFETY: the launch's caller promised `f(user_data)` is sound to call once, here, and that
        // `f` does not unwind (an `extern "C"` function that panics aborts instead).
        unsafe { (self.f)(self.user_data) }
    }
}

impl<O: Send + Sync + 'static> SharedPayload for RawPayload<O> {
    unsafe fn run_shared(&self) {
        // SAFETY: the repeatable launch's caller promised `f(user_data)` is sound to call any
        // number of times, from any driver thread, and does not unwind.
        unsafe { (self.f)(self.user_data) }
    }
}

/// A closure launch: the closure (its captures are the owners) is called once through `&mut`, so
/// the captures outlive the call and are dropped with the record, off the driver's thread.
pub(crate) struct ClosurePayload<F> {
    pub(crate) f: F,
    pub(crate) panic: Option<PanicPayload>,
}

impl<F: FnMut() + Send + 'static> Payload for ClosurePayload<F> {
    unsafe fn run(&mut self) {
        // A panic must not unwind into the driver: catch it and keep it for the reaper to report.
        if let Err(panic) = catch_unwind(AssertUnwindSafe(&mut self.f)) {
            self.panic = Some(panic);
        }
    }

    fn take_panic(&mut self) -> Option<PanicPayload> {
        self.panic.take()
    }
}

/// Carries a panic caught in a repeatable closure to the thread that reports it.
pub(crate) struct PanicCarrier(pub(crate) Option<PanicPayload>);

impl Payload for PanicCarrier {
    unsafe fn run(&mut self) {}

    fn take_panic(&mut self) -> Option<PanicPayload> {
        self.0.take()
    }
}

/// A value to drop off the driver's thread (see `defer_drop`).
pub(crate) struct DeferredDrop<T>(pub(crate) T);

impl<T: Send + 'static> Payload for DeferredDrop<T> {
    unsafe fn run(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_payload_without_owners_is_a_function_and_its_user_data() {
        assert_eq!(size_of::<RawPayload<()>>(), 16);
    }
}
