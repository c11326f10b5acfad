//! The default-stream modes and the special stream handles `cuda.h` defines as casts, which bindgen
//! cannot translate. Written by hand; `tests/generated_bindings_are_fresh.rs` checks the handles
//! against the pinned header's defines (with the `regenerate` feature, which has the header).

use crate::types::{CUstream, cuuint64_t};

/// `CU_STREAM_LEGACY`: the legacy default stream, which synchronizes with every other blocking
/// stream of its context, whichever default-stream table a call goes through.
pub const CU_STREAM_LEGACY: CUstream = std::ptr::without_provenance_mut(0x1);

/// `CU_STREAM_PER_THREAD`: the calling host thread's own default stream, which does not synchronize
/// with other streams, whichever default-stream table a call goes through.
pub const CU_STREAM_PER_THREAD: CUstream = std::ptr::without_provenance_mut(0x2);

/// Which default stream the handle `0` (the "null stream") means in stream-ordered calls.
///
/// The process's driver has one table of functions for each mode, side by side
/// ([`Driver::legacy`](crate::Driver::legacy), [`Driver::per_thread`](crate::Driver::per_thread)).
/// A mode picks which variant of every stream-ordered function its table resolves (through
/// `cuGetProcAddress`'s `CU_GET_PROC_ADDRESS_LEGACY_STREAM` or `..._PER_THREAD_DEFAULT_STREAM` flag,
/// or the `_ptsz`/`_ptds` export on old drivers), exactly as `nvcc --default-stream` does for C++.
/// The explicit handles [`CU_STREAM_LEGACY`] and [`CU_STREAM_PER_THREAD`] mean the same in either
/// mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DefaultStream {
    /// The legacy default stream, which synchronizes with other blocking streams (the default).
    #[default]
    Legacy,
    /// A default stream per host thread, which does not synchronize with other streams.
    PerThread,
}

impl DefaultStream {
    /// The `cuGetProcAddress` flag that selects this mode's variants:
    /// `CU_GET_PROC_ADDRESS_LEGACY_STREAM` (1) or `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` (2).
    pub fn proc_address_flag(self) -> cuuint64_t {
        match self {
            DefaultStream::Legacy => 1,
            DefaultStream::PerThread => 2,
        }
    }
}
