//! Knowing whether the current thread is inside a host function (on a driver thread).
//!
//! The trampoline marks the thread while the user's function runs. Library code asks before anything
//! a driver thread must not do: calling CUDA (launches, flush) or dropping values whose `Drop` may
//! call CUDA (this crate's resource types defer their destruction instead). Host functions launched
//! by other code mark their thread with the same [`HostFunctionScope`].

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    // How many marks the thread holds. A const-initialised `Cell<usize>` has no destructor to
    // register, so it is cheap and safe to touch on threads this program did not create (the
    // driver's).
    static HOST_FUNCTION_MARKS: Cell<usize> = const { Cell::new(0) };
}

/// Whether the calling thread is inside a host function, that is, a thread of the driver where
/// CUDA calls are not allowed and values that may call CUDA in `Drop` must not be dropped.
///
/// This crate knows its own host functions (its trampolines, and its user objects' destructors).
/// It cannot know a host function that another library launched with `cuLaunchHostFunc` itself:
/// such a function that calls into this crate (launches, [`flush`](crate::flush), drops a
/// [`Stream`](crate::Stream)) is treated as an ordinary thread, and this crate calls CUDA there,
/// unless the function marks its thread first with a [`HostFunctionScope`].
#[inline]
pub fn in_host_function() -> bool {
    HOST_FUNCTION_MARKS.with(Cell::get) != 0
}

/// Marks the calling thread as inside a host function while it lives: [`in_host_function`] is
/// true, this crate's launches and [`flush`](crate::flush) return
/// [`Error::InsideHostFunction`](crate::Error::InsideHostFunction), and this crate's resource types
/// dropped there ([`Stream`](crate::Stream), [`Graph`](crate::Graph), ...) are destroyed later by the
/// cleanup queue, off this thread.
///
/// This crate's trampolines hold one while they run the user's function. A host function launched
/// by other code (a raw `cuLaunchHostFunc`, another binding) that may call into this crate makes
/// one first:
///
/// ```
/// use cuda_host_launch::{HostFunctionScope, in_host_function};
///
/// unsafe extern "C" fn my_host_function(_user_data: *mut std::ffi::c_void) {
///     let _mark = HostFunctionScope::enter();
///     assert!(in_host_function());
///     // ... code that may drop a `Stream` or try a launch: deferred or refused, not run here.
/// }
/// # // SAFETY: the function ignores its data.
/// # unsafe { my_host_function(std::ptr::null_mut()) };
/// # assert!(!in_host_function());
/// ```
///
/// Marks count: the thread is marked until the last one alive is dropped, whatever the order of
/// the drops, so no mark can end another's (a mark dropped inside this crate's host function leaves
/// the thread marked). A mark cannot leave its thread (`!Send`); one that is leaked
/// (`std::mem::forget`) leaves the thread marked for good, which only makes this crate refuse
/// launches and defer drops there.
#[derive(Debug)]
#[must_use = "the thread is marked only while the scope lives"]
pub struct HostFunctionScope {
    /// Neither `Send` nor `Sync`: the mark belongs to the thread that made it.
    _thread_bound: PhantomData<*const ()>,
}

impl HostFunctionScope {
    /// Marks the calling thread until the returned value is dropped.
    #[inline]
    pub fn enter() -> Self {
        // Saturating: 2^64 leaked marks would leave the thread marked for good, never unmarked.
        HOST_FUNCTION_MARKS.with(|c| c.set(c.get().saturating_add(1)));
        HostFunctionScope {
            _thread_bound: PhantomData,
        }
    }
}

impl Drop for HostFunctionScope {
    #[inline]
    fn drop(&mut self) {
        // At least 1: this mark counted itself on this thread (it cannot leave it).
        HOST_FUNCTION_MARKS.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// `Err(InsideHostFunction)` on a thread inside a host function, naming `operation`: the check of
/// every public call that reaches the driver.
#[inline]
pub(crate) fn refuse_inside_host_function(
    operation: &'static str,
) -> Result<(), crate::support::error::Error> {
    if in_host_function() {
        Err(crate::support::error::Error::InsideHostFunction { operation })
    } else {
        Ok(())
    }
}
