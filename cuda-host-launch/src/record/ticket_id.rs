//! What the driver is handed as a run-once launch's `userData`: a ticket's index and the launch's
//! generation, packed into the pointer's 64 bits (see `tickets.rs`).

use std::ffi::c_void;
use std::num::NonZeroU64;
use std::ptr;

use super::launch_state::GENERATION_BITS;

/// The width of a ticket's index.
pub(crate) const INDEX_BITS: u32 = 24;
/// The index's bits of an id.
pub(crate) const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const _: () = assert!(INDEX_BITS + GENERATION_BITS <= 64);

/// A ticket and the generation of one launch: what the driver gets as `userData`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TicketId(NonZeroU64);

impl TicketId {
    /// The id of `index` (never 0) at `generation`.
    pub(crate) fn new(index: u32, generation: u64) -> Option<TicketId> {
        NonZeroU64::new((generation << INDEX_BITS) | u64::from(index)).map(TicketId)
    }

    /// The ticket's index.
    pub(crate) fn index(self) -> u32 {
        (self.0.get() & INDEX_MASK) as u32
    }

    /// The launch's generation.
    pub(crate) fn generation(self) -> u64 {
        self.0.get() >> INDEX_BITS
    }

    /// The `userData` for the driver: the id itself, not an address (never null).
    pub(crate) fn as_user_data(self) -> *mut c_void {
        ptr::without_provenance_mut(self.0.get() as usize)
    }

    /// The id a trampoline was called with (`None` for a null `userData`, which no launch of
    /// this crate passes).
    pub(crate) fn from_user_data(user_data: *mut c_void) -> Option<TicketId> {
        NonZeroU64::new(user_data.addr() as u64).map(TicketId)
    }
}
