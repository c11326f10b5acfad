//! The special stream handles `cuda.h` defines as casts, which bindgen cannot translate. Written by
//! hand; `tests/generated_bindings_are_fresh.rs` checks them against the pinned header's defines
//! (with the `regenerate` feature, which has the header).

use crate::types::CUstream;

/// `CU_STREAM_LEGACY`: the legacy default stream, which synchronizes with every other blocking
/// stream of its context, whichever default-stream mode the table was loaded with.
pub const CU_STREAM_LEGACY: CUstream = std::ptr::without_provenance_mut(0x1);

/// `CU_STREAM_PER_THREAD`: the calling host thread's own default stream, which does not synchronize
/// with other streams, whichever default-stream mode the table was loaded with.
pub const CU_STREAM_PER_THREAD: CUstream = std::ptr::without_provenance_mut(0x2);
