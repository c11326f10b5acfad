//! A fast hasher for the crate's own small keys (context keys, stream ids): the multiply-rotate
//! hash of rustc's `FxHasher`. Not resistant to chosen keys, which is fine for keys the driver
//! hands out; the standard SipHash costs tens of nanoseconds per lookup on the poller's path.

use std::hash::{BuildHasherDefault, Hasher};

/// See the module's docs.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        for &byte in chunks.remainder() {
            self.add(u64::from(byte));
        }
    }

    #[inline]
    fn write_u64(&mut self, word: u64) {
        self.add(word);
    }

    #[inline]
    fn write_usize(&mut self, word: usize) {
        self.add(word as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap`/`HashSet` hasher builder using [`FastHasher`].
pub(crate) type FastHash = BuildHasherDefault<FastHasher>;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::{BuildHasher, Hash};

    use super::*;

    fn hash(value: impl Hash) -> u64 {
        FastHash::default().hash_one(value)
    }

    /// Distinct keys of the shapes the crate hashes (words, pairs of words as in a context key,
    /// smaller integers, which go through `write`) get distinct hashes: the hash spreads them, as a map needs. (Mutation
    /// testing: with a step of the hash emptied or its `^` changed, keys collided, which the
    /// maps survive, only slower, so every test passed.)
    #[test]
    fn distinct_keys_get_distinct_hashes() {
        let words: HashSet<u64> = (0..1000u64).map(hash).collect();
        assert_eq!(words.len(), 1000);
        let sizes: HashSet<u64> = (0..1000usize).map(hash).collect();
        assert_eq!(sizes.len(), 1000);
        let pairs: HashSet<u64> = (0..64usize)
            .flat_map(|a| (0..64u64).map(move |b| hash((a, b))))
            .collect();
        assert_eq!(pairs.len(), 64 * 64);
        // A `u32` (a device ordinal, say) goes through `write`, as its bytes.
        let bytes: HashSet<u64> = (0..1000u32).map(hash).collect();
        assert_eq!(bytes.len(), 1000);
    }
}
