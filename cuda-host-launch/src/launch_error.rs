//! [`LaunchError`]: the error of a call that was handed values to keep (owners, a closure), which
//! gives them back when nothing took them, as `std::sync::mpsc::SendError<T>` does.

use std::fmt;
use std::mem::ManuallyDrop;

use crate::enqueue::refusal::Refusal;
use crate::reaper::defer_drop::defer_drop;
use crate::support::error::Error;

/// Why a launch, a release, a callback or a graph host node was refused, with the values it was
/// given (the owners, the closure) handed back where the crate did not take them.
///
/// The calls that take values ([`host_launch`](crate::host_launch),
/// [`launch_host_function`](crate::launch_host_function), [`release_after`](crate::release_after),
/// [`spawn_after`](crate::spawn_after), [`host_launch_async`](crate::host_launch_async),
/// [`add_host_node`](crate::add_host_node) and the methods of
/// [`LaunchOptions`](crate::LaunchOptions)) return this error. Work enqueued on the stream before
/// the call may still use what was handed over (a staging buffer a copy reads, a device buffer a
/// kernel writes), so the crate never drops it on an error: it gives it back, and the caller
/// decides (synchronize the stream and then drop it, or try another stream).
///
/// - [`into_inner`](LaunchError::into_inner) is `Some(value)` when the values are handed back:
///   whenever nothing was enqueued (a capturing stream, a driver error, a call inside a host
///   function, a too-old driver, a forked child, ...).
/// - It is `None` when the crate keeps them, and releases them once nothing can use them: a
///   capture another thread began during the call may hold what was enqueued (pending until the
///   context is reset or destroyed), the work was accepted and only a later step failed (the
///   watcher thread could not be started). Each call's `# Errors` section says which errors are
///   which.
///
/// **Dropped, it drops the values off the driver's thread**: at once on an ordinary thread, through
/// the cleanup queue inside a host function (where a `Drop` that calls CUDA must not run). `?` in a
/// function that returns `Result<_, `[`Error`]`>` converts it (`From`), dropping the values the
/// same way: the caller's choice, after which earlier work on the stream must no longer use them.
/// `Debug` and `Display` do not need `T: Debug`, so `.unwrap()` works whatever the owners are; and
/// it is `Send` and `Sync` for any `T: Send` (nothing reaches the value through a shared
/// reference), so `?` into `Box<dyn Error + Send + Sync>` or `anyhow` works too.
///
/// # Examples
/// Synchronize before dropping what a refused release handed back:
/// ```no_run
/// use cuda_host_launch::{release_after, Error, Stream};
/// # fn example(stream: &Stream, staging: Vec<u8>) -> Result<(), Error> {
/// // ... enqueue a copy on `stream` that reads `staging` ...
/// if let Err(refused) = release_after(stream, staging) {
///     let (error, staging) = refused.into_parts();
///     stream.synchronize()?;
///     drop(staging); // the copy is done: dropping it is safe now
///     return Err(error);
/// }
/// # Ok(()) }
/// ```
pub struct LaunchError<T: Send + 'static> {
    error: Error,
    /// The values handed back; `None` if the crate keeps them (or after they were taken).
    value: Option<T>,
}

impl<T: Send + 'static> LaunchError<T> {
    /// An error with the values handed back (`Some`) or kept by the crate (`None`).
    pub(crate) fn new(error: Error, value: Option<T>) -> Self {
        LaunchError { error, value }
    }

    /// An enqueue's refusal, with the record (if it is the caller's) unpacked into what the caller
    /// gave by `take`.
    ///
    /// # Safety
    /// The refusal's record must have been made with a payload of type `P`.
    pub(crate) unsafe fn unpack<P>(refusal: Refusal, take: impl FnOnce(P) -> Option<T>) -> Self {
        // SAFETY: the caller's promise.
        let (error, value) = unsafe { refusal.unpack(take) };
        LaunchError::new(error, value.flatten())
    }

    /// What went wrong.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// Whether the values are handed back (`false`: the crate keeps them, and releases them once
    /// nothing can use them).
    pub fn is_handed_back(&self) -> bool {
        self.value.is_some()
    }

    /// The values handed back (`None`: the crate keeps them); the error is dropped.
    pub fn into_inner(self) -> Option<T> {
        self.into_parts().1
    }

    /// The error and the values handed back (`None`: the crate keeps them).
    pub fn into_parts(self) -> (Error, Option<T>) {
        let mut this = ManuallyDrop::new(self);
        let value = this.value.take();
        // SAFETY: `this` is never used or dropped again, so its error is moved out once.
        let error = unsafe { std::ptr::read(&this.error) };
        (error, value)
    }

    /// The error alone; the values handed back are dropped off the driver's thread (at once, or
    /// through the cleanup queue inside a host function). What `?` does.
    pub fn into_error(self) -> Error {
        let (error, value) = self.into_parts();
        if let Some(value) = value {
            defer_drop(value);
        }
        error
    }
}

// SAFETY: no `&LaunchError` reaches the value (the methods taking `&self`, `Debug` and `Display`
// read the error and whether a value is held, never the value itself); it is reached only by
// moving the error (`into_inner`, `into_parts`, `into_error`, `Drop`), which needs ownership, and
// `T: Send` lets that owner be on any thread. So sharing a `&LaunchError<T>` between threads shares
// no `&T`, whatever `T` is: the error can go into `Box<dyn Error + Send + Sync>` (and `anyhow`)
// with owners that are not `Sync`.
unsafe impl<T: Send + 'static> Sync for LaunchError<T> {}

impl<T: Send + 'static> Drop for LaunchError<T> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            defer_drop(value);
        }
    }
}

impl<T: Send + 'static> From<LaunchError<T>> for Error {
    /// [`LaunchError::into_error`]: the values handed back are dropped off the driver's thread.
    fn from(error: LaunchError<T>) -> Error {
        error.into_error()
    }
}

impl<T: Send + 'static> fmt::Debug for LaunchError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = if self.value.is_some() {
            "handed back"
        } else {
            "kept by the crate"
        };
        f.debug_struct("LaunchError")
            .field("error", &self.error)
            .field("value", &format_args!("{value}"))
            .finish()
    }
}

impl<T: Send + 'static> fmt::Display for LaunchError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_some() {
            write!(
                f,
                "{} (what the call was given is handed back in this error: \
                 LaunchError::into_inner; earlier work on the stream may still use it)",
                self.error
            )
        } else {
            write!(
                f,
                "{} (the crate keeps what the call was given and releases it once nothing can use \
                 it)",
                self.error
            )
        }
    }
}

impl<T: Send + 'static> std::error::Error for LaunchError<T> {
    /// The source of the inner [`Error`] (this error's message already includes the inner one's).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::support::host_thread::HostFunctionScope;

    /// Counts its drops; deliberately not `Debug`.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// `Debug` and `Display` need nothing of the value (so `.unwrap()` works on any owners) and
    /// say whether it is handed back; the parts come back whole.
    #[test]
    fn debug_and_display_need_no_debug_value_and_the_parts_come_back() {
        let drops = Arc::new(AtomicUsize::new(0));
        let handed = LaunchError::new(Error::NullFunction, Some(Counted(Arc::clone(&drops))));
        let kept = LaunchError::<Counted>::new(Error::NullFunction, None);
        assert!(format!("{handed:?}").contains("handed back"));
        assert!(format!("{kept:?}").contains("kept by the crate"));
        assert!(
            handed
                .to_string()
                .starts_with(&Error::NullFunction.to_string())
        );
        assert!(handed.to_string().contains("into_inner"));
        assert!(handed.is_handed_back() && !kept.is_handed_back());
        // Send and Sync whatever the value (a `Cell` is not `Sync`): `?` into an error type that
        // needs both (`Box<dyn Error + Send + Sync>`, `anyhow`) works with any owners.
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(LaunchError::new(
            Error::NullFunction,
            Some(std::cell::Cell::new(0u8)),
        ));
        assert!(boxed.to_string().contains("into_inner"));
        assert!(matches!(handed.error(), Error::NullFunction));
        let (error, value) = handed.into_parts();
        assert!(matches!(error, Error::NullFunction));
        assert_eq!(
            drops.load(Ordering::SeqCst),
            0,
            "into_parts dropped the value"
        );
        drop(value);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(kept.into_inner().is_none());
    }

    /// Dropped (or turned into an `Error`) on an ordinary thread, the value goes at once; inside a
    /// host function it goes through the cleanup queue, never on the driver's thread.
    #[test]
    fn a_dropped_error_drops_its_value_off_the_drivers_thread() {
        let drops = Arc::new(AtomicUsize::new(0));
        drop(LaunchError::new(
            Error::NullFunction,
            Some(Counted(Arc::clone(&drops))),
        ));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        let error: Error =
            LaunchError::new(Error::NullFunction, Some(Counted(Arc::clone(&drops)))).into();
        assert!(matches!(error, Error::NullFunction));
        assert_eq!(drops.load(Ordering::SeqCst), 2);
        std::thread::spawn({
            let drops = Arc::clone(&drops);
            move || {
                let _inside = HostFunctionScope::enter();
                drop(LaunchError::new(
                    Error::NullFunction,
                    Some(Counted(Arc::clone(&drops))),
                ));
                let _: Error =
                    LaunchError::new(Error::NullFunction, Some(Counted(Arc::clone(&drops)))).into();
                assert_eq!(
                    drops.load(Ordering::SeqCst),
                    2,
                    "dropped inside a host function"
                );
            }
        })
        .join()
        .unwrap();
        // Released by a drain here (or by a reaper, if another test started one).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while drops.load(Ordering::SeqCst) < 4 && std::time::Instant::now() < deadline {
            crate::reaper::release::drain();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            drops.load(Ordering::SeqCst),
            4,
            "the deferred drops were not queued"
        );
    }
}
