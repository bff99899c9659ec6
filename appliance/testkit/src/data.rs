//! Deterministic data: block contents from a seed or from the key (so that any bytes served
//! can be checked), seeds that a failed run prints for its replay, and what of a batch to
//! send again after the node answered busy.

use rand::{Rng, SeedableRng};

/// Deterministic pseudo-random bytes for (seed, len).
pub fn block(seed: u64, len: usize) -> bytes::Bytes {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    bytes::Bytes::from(v)
}

/// Block contents derived from the key (FNV-1a of it, as the seed of [`block`]).
pub fn content(key: &[u8], len: usize) -> bytes::Bytes {
    let seed = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    block(seed, len)
}

/// Block contents derived from the key with the byte statistics of a bf16 KV cache: each
/// 16-bit value's low byte (mantissa) random, its high byte (sign and exponent) one of
/// eight, so that an entropy coder (zstd) saves about a third, and LZ4 little. What cold
/// compression's tests store.
pub fn kv_content(key: &[u8], len: usize) -> bytes::Bytes {
    let mut v = content(key, len).to_vec();
    for hi in v.iter_mut().skip(1).step_by(2) {
        *hi = 0x3c | (*hi & 0x83);
    }
    bytes::Bytes::from(v)
}

/// Environment variable `name` parsed as a `T` (a count, a size), or `default` when it is
/// unset or does not parse.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seed in environment variable `name`, or `default`; printed, so that a failing run
/// can be replayed with it.
pub fn seed_from_env(name: &str, default: u64) -> u64 {
    let s = env_or(name, default);
    eprintln!("{name}={s} (set it to replay)");
    s
}

/// The entries of a batch that the node answered 503 (busy: its write queue was full), in
/// their order: what to send again. `statuses` are the batch's, one per entry.
pub fn answered_busy<T>(entries: Vec<T>, statuses: impl IntoIterator<Item = u16>) -> Vec<T> {
    entries
        .into_iter()
        .zip(statuses)
        .filter(|(_, s)| *s == 503)
        .map(|(e, _)| e)
        .collect()
}
