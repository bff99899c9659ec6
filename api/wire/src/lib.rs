//! ctxpod API v1, sans-IO: the contract between a ctxpod node and its clients.
//!
//! - `openapi.json` (beside this crate's `Cargo.toml`) is the HTTP contract, OpenAPI 3.0.3.
//! - [`frame`] is the binary framing of `batch/get` and `batch/put` bodies (sans-IO codec).
//! - [`proto`] is the transfer protocol (CXP1) codec, sans-IO; `PROTOCOL.md` specifies it.
//! - [`key`] and [`namespace`] validate the identifiers that appear in URLs.
//! - [`types`] are the JSON bodies.
//! - [`placement`] and [`block_hash`]: where a block lives in a pod, and the engines' chained
//!   block hashes; [`pod_plan`]: the pod's rules for an operation over keys (which member
//!   is asked what, and what each answer means), driven by every path that serves a pod.
//!
//! The clients that speak this contract are in `ctxpod-client`.
//!
//! Architecture invariants: this crate does no I/O and has no runtime (no tokio: checked by
//! the layering test); it knows nothing of the engine, RocksDB or devices; every other crate
//! depends on it, it on none of them.

/// Fieldless enums that travel on the wire as their `u8` discriminants, each variant listed
/// once: every one is `Debug, Clone, Copy, PartialEq, Eq` (more derives may be given), with
/// `from_u8`, the variant of a byte (`None` for a byte that names none). Variants given a
/// name (`Fast = 1 => "fast"`: all of an enum's or none) also get `name` and `parse`.
macro_rules! wire_enum {
    ($(
        $(#[$meta:meta])*
        pub enum $t:ident {
            $($(#[$vmeta:meta])* $v:ident = $n:literal $(=> $name:literal)?,)+
        }
    )+) => {$(
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $t {
            $($(#[$vmeta])* $v = $n,)+
        }

        impl $t {
            /// The variant whose discriminant is `v`, if any.
            pub fn from_u8(v: u8) -> Option<$t> {
                match v {
                    $($n => Some($t::$v),)+
                    _ => None,
                }
            }
        }

        wire_enum!(@names $t { $($v $(=> $name)?,)+ });
    )+};
    (@names $t:ident { $($v:ident => $name:literal,)+ }) => {
        impl $t {
            /// The variant's name, as JSON, headers and configuration spell it.
            pub fn name(self) -> &'static str {
                match self {
                    $($t::$v => $name,)+
                }
            }

            /// The variant of a name, if any.
            pub fn parse(s: &str) -> Option<$t> {
                match s {
                    $($name => Some($t::$v),)+
                    _ => None,
                }
            }
        }
    };
    (@names $t:ident { $($v:ident,)+ }) => {};
}

pub mod block_hash;
pub mod frame;
pub mod key;
pub mod namespace;
pub mod placement;
pub mod pod_plan;
pub mod proto;
pub mod types;

/// The OpenAPI 3.0.3 document of HTTP API v1.
pub const OPENAPI_JSON: &str = include_str!("../../openapi.json");

/// Largest body stored as one record (8 MiB): larger values are stored as a sequence of
/// extents (up to the node's `value_bytes_max`).
pub const BLOCK_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Bytes of each extent of a large value but its last (4 MiB).
pub const EXTENT_BYTES: usize = 4 * 1024 * 1024;
/// Bytes of the piece of a value of `len` bytes that starts at `offset`, as values travel
/// piece by piece (CXP1 `PutValue`) and are stored: the whole value when it is one record,
/// otherwise an extent (the last one shorter); 0 past the end.
pub fn value_piece_len(len: u64, offset: u64) -> usize {
    let rest = len.saturating_sub(offset);
    if len <= BLOCK_BYTES_MAX as u64 {
        rest as usize
    } else {
        rest.min(EXTENT_BYTES as u64) as usize
    }
}

/// Highest `value_bytes_max` a node may be configured with (1 GiB).
pub const VALUE_BYTES_MAX: u64 = 1 << 30;
/// `value_bytes_max` of a node that names none (256 MiB).
pub const VALUE_BYTES_MAX_DEFAULT: u64 = 256 << 20;
/// Longest key, in bytes (keys travel as lowercase hex, so twice this in characters).
pub const KEY_BYTES_MAX: usize = 128;
/// Most entries in one batch request (get, put, match, pin).
pub const BATCH_ENTRIES_MAX: usize = 1024;
/// Most keys in one `match` request.
pub const MATCH_KEYS_MAX: usize = 4096;
/// Most keys in one page of a key listing (`GET /v1/namespaces/{ns}/blocks`), and the
/// page size when the caller names none: S3's `max-keys` limit.
pub const LIST_KEYS_MAX: usize = 1000;
/// Largest `batch/put` body, in bytes (frame overhead included).
pub const BATCH_BODY_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Longest lease a `pin` may ask for, in milliseconds (one hour).
pub const LEASE_MS_MAX: u64 = 3_600_000;
/// Longest lease a prefetch ticket keeps after its pushes, in milliseconds (one minute): a
/// prefetch stages blocks that decode reads within seconds, and needs only read access,
/// so it may not hold the device for long (a longer promise is a `pin`, which needs write
/// access).
pub const PREFETCH_LEASE_MS_MAX: u64 = 60_000;
/// Most copies of a block in a pod (`pod.replication`, a namespace's `replication`).
pub const REPLICATION_MAX: u32 = 5;

/// Request/response header carrying the CRC32C of a block body as 8 lowercase hex digits.
pub const HEADER_CRC32C: &str = "x-ctxpod-crc32c";
/// Response header of a HEAD (and of an S3 HEAD): when the block was stored, in ms since
/// the Unix epoch.
pub const HEADER_STORED_MS: &str = "x-ctxpod-stored-ms";
/// Request header choosing durability: `durable` (default) or `fast`.
pub const HEADER_DURABILITY: &str = "x-ctxpod-durability";
/// Request header with which an admin acts in a tenant's namespaces.
pub const HEADER_TENANT: &str = "x-ctxpod-tenant";
/// On a single-block request: already routed (by a node that forwarded it, or by a client
/// that computes the placement itself), so the node that receives it serves it. Its value
/// names who routed it.
pub const HEADER_ROUTED: &str = "x-ctxpod-forwarded-by";
/// On a put (or `batch/put`): the bytes are a copy of a block another member holds (read
/// repair, backfill), not a new write. A node refuses a copy of a block the pod deleted
/// (410, code `deleted`), so a member that missed a delete cannot write the block back.
pub const HEADER_COPY: &str = "x-ctxpod-copy";
/// On a routed block delete: the pod has recorded it (its tombstone is in etcd), and the
/// member that did asks this one to apply it while settling it. The member takes the
/// tombstone at once, before its watch delivers it, so that it refuses a copy of the block
/// from then on.
pub const HEADER_DELETE_RECORDED: &str = "x-ctxpod-delete-recorded";
/// On a `batch/get`: the most block bytes the answer may carry (at most 64 MiB); blocks
/// beyond answer 413. A node answering a batch for the pod gives each member its share of
/// the answer this way, having taken it from its egress budget before asking.
pub const HEADER_ANSWER_BYTES_MAX: &str = "x-ctxpod-answer-bytes-max";

/// On an S3 CreateBucket: the class of the namespace it creates (`kv`, the default, or
/// `weights`), as `class` in the body of `PUT /v1/namespaces/{ns}`.
pub const HEADER_NAMESPACE_CLASS: &str = "x-ctxpod-namespace-class";

/// On an S3 CreateBucket: how the namespace's blocks are compressed as they move to a
/// node's dense tier (`lz4` or `zstd`), as `compression` in the body of `PUT
/// /v1/namespaces/{ns}`.
pub const HEADER_NAMESPACE_COMPRESSION: &str = "x-ctxpod-compression";

/// CRC32C (Castagnoli) of `bytes`, the checksum used everywhere on the wire and on disk.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC32C of `a ‖ bytes` from the CRC32C of `a`: a checksum carried along a stream piece by
/// piece. Cheaper than [`crc32c_combine`] of each piece's own CRC32C, whose cost per call
/// (a matrix power) outweighs checksumming a 64 KiB piece.
pub fn crc32c_append(crc_a: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc_a, bytes)
}

/// CRC32C of `a ‖ b` from the CRC32C of each (`b` being `len_b` bytes long): `a`'s CRC32C
/// run through `len_b` zero bytes (a linear map over GF(2)), then `b`'s added. The maps for
/// 2^k zero bytes are computed once ([`zeros_operators`]), so a call costs one 32×32
/// matrix-times-vector per set bit of `len_b` (well under a microsecond); the `crc32c`
/// crate's `crc32c_combine` builds them on every call (tens of µs for 64 KiB), which at one
/// call per 64 KiB segment of a record cost a PUT as much CPU as all its other work.
pub fn crc32c_combine(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    let ops = zeros_operators();
    let (mut crc, mut n, mut k) = (crc_a, len_b, 0);
    while n > 0 {
        if n & 1 == 1 {
            crc = gf2_times(&ops[k], crc);
        }
        n >>= 1;
        k += 1;
    }
    crc ^ crc_b
}

/// A linear map of 32-bit CRC registers over GF(2), by the images of its 32 basis vectors.
type Gf2Matrix = [u32; 32];

fn gf2_times(m: &Gf2Matrix, v: u32) -> u32 {
    let mut sum = 0;
    for (i, col) in m.iter().enumerate() {
        if v >> i & 1 == 1 {
            sum ^= col;
        }
    }
    sum
}

fn gf2_square(m: &Gf2Matrix) -> Gf2Matrix {
    std::array::from_fn(|i| gf2_times(m, m[i]))
}

/// `ops[k]` runs a CRC32C register through 2^k zero bytes (zlib's zeros operators, for the
/// Castagnoli polynomial), for every length a `usize` can hold.
fn zeros_operators() -> &'static [Gf2Matrix; usize::BITS as usize] {
    static OPS: std::sync::OnceLock<[Gf2Matrix; usize::BITS as usize]> = std::sync::OnceLock::new();
    OPS.get_or_init(|| {
        // One zero bit: a shift, with the reflected polynomial fed back from bit 0.
        let bit: Gf2Matrix =
            std::array::from_fn(|i| if i == 0 { 0x82F6_3B78 } else { 1 << (i - 1) });
        let byte = gf2_square(&gf2_square(&gf2_square(&bit)));
        let mut ops = [byte; usize::BITS as usize];
        for k in 1..ops.len() {
            ops[k] = gf2_square(&ops[k - 1]);
        }
        ops
    })
}

/// Formats a CRC32C the way [`HEADER_CRC32C`] carries it.
pub fn crc32c_hex(crc: u32) -> String {
    format!("{crc:08x}")
}

/// Parses an [`HEADER_CRC32C`] value: exactly 8 hex digits.
pub fn parse_crc32c_hex(s: &str) -> Option<u32> {
    if s.len() != 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

wire_enum! {
    /// Durability of a put, chosen per request: a header or JSON string on HTTP, its `u8`
    /// discriminant in CXP1.
    #[derive(Default, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum Durability {
        /// Acknowledged after the data is flushed to the device and the index batch is synced.
        #[default]
        Durable = 0 => "durable",
        /// Acknowledged once written, before the flush: may vanish on a crash, never corrupt.
        Fast = 1 => "fast",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_hex_round_trip() {
        let c = crc32c(b"123456789");
        assert_eq!(c, 0xe306_9283, "CRC32C check value");
        assert_eq!(parse_crc32c_hex(&crc32c_hex(c)), Some(c));
        assert_eq!(parse_crc32c_hex("e30692"), None);
        assert_eq!(parse_crc32c_hex("e306928g"), None);
        // Carried piece by piece, as a streamed body is checked.
        let appended = [&b"1234"[..], b"", b"56789"]
            .iter()
            .fold(0, |crc, piece| crc32c_append(crc, piece));
        assert_eq!(appended, c);
        assert_eq!(crc32c_combine(crc32c(b"1234"), crc32c(b"56789"), 5), c);
    }

    /// The combine agrees with the `crc32c` crate's and with checksumming the concatenation,
    /// for lengths around every power of two up to 8 MiB and for empty parts.
    #[test]
    fn crc_combine_matches_the_concatenation() {
        let data: Vec<u8> = (0..(8 << 20) + 70_000)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut lens = vec![0, 1, 2, 3, 100, 4095, 65_536, 65_537, (1 << 20) + 100];
        lens.extend((0..=23).flat_map(|k| [(1usize << k) - 1, 1 << k, (1 << k) + 1]));
        for len_b in lens {
            for len_a in [0, 1, 7, 4096, 65_536 + 3] {
                let (a, b) = (&data[..len_a], &data[len_a..len_a + len_b]);
                let (ca, cb) = (crc32c(a), crc32c(b));
                let whole = crc32c(&data[..len_a + len_b]);
                assert_eq!(crc32c_combine(ca, cb, len_b), whole, "{len_a} + {len_b}");
                assert_eq!(
                    crc32c::crc32c_combine(ca, cb, len_b),
                    whole,
                    "{len_a} + {len_b}"
                );
            }
        }
    }

    #[test]
    fn openapi_is_json_3_0_3() {
        let v: serde_json::Value = serde_json::from_str(OPENAPI_JSON).expect("openapi.json parses");
        assert_eq!(v["openapi"], "3.0.3");
    }
}
