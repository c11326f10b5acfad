//! Reporting panics caught in host closures and in owners' `Drop`, through a replaceable handler.
//!
//! Reports are made by the thread that releases the record (the reaper, or a draining thread), never
//! by a driver thread: the handler is user code and may do anything, CUDA calls included.

use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, RwLock};

/// Where a caught panic came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PanicOrigin {
    /// A host closure panicked while it ran on the driver's thread. The panic was caught there; the
    /// stream went on.
    HostFunction,
    /// An owner's `Drop` panicked while the cleanup queue released it. The rest of the record was
    /// still released; the reaper went on.
    OwnerDrop,
    /// A future's waker panicked when it was woken (by a host function on the driver's thread, by
    /// the watcher, or by the release of a launch whose context was lost). The panic was
    /// caught where it happened; the future still resolved.
    Waker,
    /// A callback of [`spawn_after`](crate::spawn_after) panicked on the cleanup queue's thread
    /// (the reaper, or a drain in manual mode). The panic was caught there; the thread went on.
    Callback,
    /// A start hook of [`ThreadSettings::on_start`](crate::ThreadSettings::on_start) panicked on
    /// the crate thread it started. The panic was caught there; the thread went on.
    StartHook,
}

impl fmt::Display for PanicOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PanicOrigin::HostFunction => "a host function",
            PanicOrigin::OwnerDrop => "dropping a host function's owners",
            PanicOrigin::Waker => "waking a future's task",
            PanicOrigin::Callback => "a stream-ordered callback (spawn_after)",
            PanicOrigin::StartHook => "a crate thread's start hook",
        })
    }
}

/// A caught panic, as given to the panic handler.
#[derive(Debug)]
pub struct PanicReport<'a> {
    /// Where it came from.
    pub origin: PanicOrigin,
    /// The panic's message (`"<non-string panic payload>"` if it had none).
    pub message: &'a str,
}

impl fmt::Display for PanicReport<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cuda-host-launch: {} panicked: {}",
            self.origin, self.message
        )
    }
}

type Handler = Arc<dyn Fn(&PanicReport<'_>) + Send + Sync + 'static>;

static HANDLER: RwLock<Option<Handler>> = RwLock::new(None);

/// Replaces the panic handler. The default writes one line to stderr:
/// `cuda-host-launch: a host function panicked: <message>`.
///
/// The handler runs on the thread that releases the record (the reaper, or the thread that drains),
/// never on the driver's thread. A panic inside the handler is caught and ignored.
pub fn set_panic_handler(handler: impl Fn(&PanicReport<'_>) + Send + Sync + 'static) {
    let mut slot = HANDLER
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    *slot = Some(Arc::new(handler));
}

/// Restores the default panic handler.
pub fn reset_panic_handler() {
    let mut slot = HANDLER
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    *slot = None;
}

/// Reports one caught panic.
pub(crate) fn report(origin: PanicOrigin, payload: &(dyn Any + Send)) {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("<non-string panic payload>");
    let report = PanicReport { origin, message };
    let handler = HANDLER
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    let _ = catch_unwind(AssertUnwindSafe(|| match handler {
        Some(handler) => handler(&report),
        None => eprintln!("{report}"),
    }));
}

/// Reports one caught panic, then drops its payload (user data, whose `Drop` may panic too: caught
/// and ignored).
pub(crate) fn report_and_drop(origin: PanicOrigin, payload: Box<dyn Any + Send>) {
    report(origin, &*payload);
    drop_quietly(payload);
}

/// Drops a caught panic's payload, whose `Drop` is user code and may panic too: that panic is
/// caught, and its own payload (which may panic again when dropped) is leaked rather than dropped,
/// so no chain of panicking payloads can unwind out of the calling thread.
pub(crate) fn drop_quietly(payload: Box<dyn Any + Send>) {
    if let Err(nested) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(nested);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// The default handler's line, and each origin's words. (Mutation testing: with either
    /// `Display` emptied, the reports said nothing, and every test passed.)
    #[test]
    fn a_report_reads_as_one_line_naming_its_origin() {
        let report = PanicReport {
            origin: PanicOrigin::OwnerDrop,
            message: "boom",
        };
        assert_eq!(
            report.to_string(),
            "cuda-host-launch: dropping a host function's owners panicked: boom"
        );
        for (origin, words) in [
            (PanicOrigin::HostFunction, "a host function"),
            (PanicOrigin::Waker, "waking a future's task"),
            (
                PanicOrigin::Callback,
                "a stream-ordered callback (spawn_after)",
            ),
        ] {
            assert_eq!(origin.to_string(), words);
        }
    }

    /// `reset_panic_handler` puts the default back: a handler set before sees no more reports.
    /// (The only unit test that touches the process's handler.)
    #[test]
    fn a_reset_handler_sees_no_more_reports() {
        static SEEN: AtomicUsize = AtomicUsize::new(0);
        set_panic_handler(|_| {
            SEEN.fetch_add(1, Ordering::SeqCst);
        });
        report(PanicOrigin::Callback, &"counted");
        assert_eq!(SEEN.load(Ordering::SeqCst), 1);
        reset_panic_handler();
        report(PanicOrigin::Callback, &"to stderr");
        assert_eq!(SEEN.load(Ordering::SeqCst), 1);
    }
}
