//! Dropping a value off the driver's thread.

use super::owned_record::OwnedRecord;
use crate::record::payload::DeferredDrop;
use crate::support::host_thread::in_host_function;

/// Drops `value` off the driver's thread: at once if the caller is not on one, else through the
/// cleanup queue.
///
/// For `Drop` implementations of types that may be dropped inside a host function and whose
/// destruction calls CUDA: this crate's own [`Stream`](crate::Stream), [`Event`](crate::Event) and
/// [`PrimaryContext`](crate::PrimaryContext) use it.
pub fn defer_drop<T: Send + 'static>(value: T) {
    if in_host_function() {
        drop(OwnedRecord::new(DeferredDrop(value)));
    } else {
        drop(value);
    }
}
