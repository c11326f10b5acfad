//! The special stream handles `cuda.h` defines as casts, which bindgen cannot translate.

use crate::types::CUstream;

/// `CU_STREAM_LEGACY`: the legacy default stream, which synchronizes with every other blocking
/// stream of its context, whichever default-stream mode the table was loaded with.
pub const CU_STREAM_LEGACY: CUstream = std::ptr::without_provenance_mut(0x1);

/// `CU_STREAM_PER_THREAD`: the calling host thread's own default stream, which does not synchronize
/// with other streams, whichever default-stream mode the table was loaded with.
pub const CU_STREAM_PER_THREAD: CUstream = std::ptr::without_provenance_mut(0x2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_stream_handles_have_the_values_cuda_h_gives() {
        assert_eq!(CU_STREAM_LEGACY as usize, 1);
        assert_eq!(CU_STREAM_PER_THREAD as usize, 2);
    }
}
