//! Block identity: the chained block hash of NVIDIA Dynamo's KV router, so engines that
//! already compute it can use its values as ctxpod keys (and a KV-aware router reading
//! ctxpod's events sees the same ids).
//!
//! - A block's *local hash* is XXH3-64, seeded with the salt hash, over its token ids as
//!   little-endian `u32`s (only complete blocks are hashed).
//! - Its *sequence hash* chains it to its prefix: the first block's is its local hash; block
//!   `i`'s is XXH3-64, seeded with [`XXH3_SEED`], over `LE(seq[i-1]) ‖ LE(local[i])`.
//! - The salt hash starts at [`XXH3_SEED`] (1337, Dynamo's seed) and adds, wrapping, XXH3-64
//!   of the LoRA name (seed 0) and of the salt — model, tenant or cache namespace — (seed 1);
//!   with neither it is 1337 and the values are Dynamo's published test vectors.
//!
//! Sources: ai-dynamo/dynamo `lib/kv-router/src/protocols.rs` (`XXH3_SEED`,
//! `compute_block_hash_for_seq`, `compute_seq_hash_for_block`), `lib/kv-hashing/src/salt.rs`
//! (`compute_salt_hash`), and the vectors in `lib/llm/src/tokens.rs`. Mooncake's traces use
//! remapped integers, and its Conductor a chained SHA-256 after vLLM: keys from those stay
//! opaque bytes to ctxpod.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Dynamo's XXH3 seed.
pub const XXH3_SEED: u64 = 1337;

/// The seed of local block hashes for a salt and a LoRA adapter (`None` or empty: absent).
pub fn salt_hash(salt: Option<&str>, lora: Option<&str>) -> u64 {
    let mut seed = XXH3_SEED;
    if let Some(l) = lora.filter(|l| !l.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(l.as_bytes(), 0));
    }
    if let Some(s) = salt.filter(|s| !s.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(s.as_bytes(), 1));
    }
    seed
}

/// The local hash of one block of token ids.
pub fn local_hash(tokens: &[u32], salt_hash: u64) -> u64 {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, salt_hash)
}

/// The sequence hash of a block whose parent's sequence hash is `parent` (`None` for the
/// first block of a sequence).
pub fn chain(parent: Option<u64>, local: u64) -> u64 {
    match parent {
        None => local,
        Some(p) => {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&p.to_le_bytes());
            b[8..].copy_from_slice(&local.to_le_bytes());
            xxh3_64_with_seed(&b, XXH3_SEED)
        }
    }
}

/// Sequence hashes of every complete block of `block_size` tokens (a trailing partial block
/// is not hashed).
pub fn sequence_hashes(tokens: &[u32], block_size: usize, salt_hash: u64) -> Vec<u64> {
    assert!(block_size > 0, "a block has at least one token");
    let mut parent = None;
    tokens
        .chunks_exact(block_size)
        .map(|b| {
            let h = chain(parent, local_hash(b, salt_hash));
            parent = Some(h);
            h
        })
        .collect()
}

/// A sequence hash as a ctxpod key: its 8 bytes, big-endian (so the hex form reads as the
/// number in hex).
pub fn key_of(hash: u64) -> [u8; 8] {
    hash.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dynamo's vectors (`lib/llm/src/tokens.rs`, block size 4, salt hash 1337).
    #[test]
    fn dynamo_test_vectors() {
        assert_eq!(salt_hash(None, None), 1337);
        assert_eq!(salt_hash(Some(""), Some("")), 1337);
        assert_eq!(local_hash(&[1, 2, 3, 4], 1337), 14643705804678351452);
        assert_eq!(local_hash(&[5, 6, 7, 8], 1337), 16777012769546811212);
        assert_eq!(local_hash(&[9, 10, 11, 12], 1337), 483935686894639516);
        let tokens: Vec<u32> = (1..=14).collect();
        assert_eq!(
            sequence_hashes(&tokens, 4, 1337),
            vec![
                14643705804678351452,
                4945711292740353085,
                12583592247330656132
            ],
            "two tokens of a partial block are not hashed"
        );
    }

    #[test]
    fn salts_separate_and_prefixes_chain() {
        let t: Vec<u32> = (0..64).collect();
        let a = sequence_hashes(&t, 16, salt_hash(Some("llama-3-8b"), None));
        let b = sequence_hashes(&t, 16, salt_hash(Some("tenant-b"), None));
        let c = sequence_hashes(&t, 16, salt_hash(Some("llama-3-8b"), Some("lora-1")));
        assert!(a.iter().all(|h| !b.contains(h) && !c.contains(h)));
        // Same prefix, different continuation: shared leading hashes only.
        let mut u = t.clone();
        u[40] = 9999;
        let d = sequence_hashes(&u, 16, salt_hash(Some("llama-3-8b"), None));
        assert_eq!(a[..2], d[..2]);
        assert_ne!(a[2], d[2]);
        assert_ne!(a[3], d[3], "a change poisons every later block");
        assert_eq!(key_of(0x0102030405060708), [1, 2, 3, 4, 5, 6, 7, 8]);
    }
}
