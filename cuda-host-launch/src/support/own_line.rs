//! A value on cache lines of its own.

/// Keeps a value on a cache line (a pair of lines, for adjacent-line prefetching) of its own, so
/// that what one thread writes often does not share a line with what another thread reads or
/// writes: the cleanup queue's head and counters, the record pool's list of free segments, each
/// pending-list shard's lock.
#[repr(align(128))]
pub(crate) struct OwnLine<T>(pub(crate) T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
