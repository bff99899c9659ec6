//! Crypto envelope (sans-IO): AES-256-GCM sealing of block payloads with per-namespace data
//! keys (DEKs), and wrapping of DEKs by the node's key-encryption key (KEK).
//!
//! - Payload AAD = `"ctxpod/block/v1" ‖ ns_id ‖ key_id ‖ key_len ‖ key`: a record moved under
//!   another key, namespace or key generation fails to open.
//! - Payload nonce = [`ctxpod_format::record::nonce_for`]`(seq, salt)`: unique per node and write
//!   (the sequence number), and across copies of one data directory (the incarnation's salt).
//! - A segmented record's segment `i` is sealed on its own under `nonce_for(seq + i, salt)`
//!   (the record took `n` sequence numbers) and [`segment_aad`]: its record's AAD ‖
//!   `"/segment"` ‖ the record's length ‖ `i`, so that no segment opens at another place,
//!   in another record, or in a record cut shorter or longer.
//! - A compressed record ([`compressed_aad`]): a block's AAD ‖ `"/compressed"` ‖ codec ‖
//!   the block's sequence number ‖ its length ‖ its CRC32C, under a nonce of its own
//!   sequence number: its stored bytes cannot be taken for the block uncompressed, for
//!   another codec's, or for another block's or generation's.
//! - DEK wrapping: AES-256-GCM under the KEK with a random nonce, AAD binding ns_id and key_id.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

pub const KEY_BYTES: usize = 32;

/// Raw key bytes, wiped when dropped. (Expanded keys live in aws-lc's heap-allocated
/// `EVP_AEAD_CTX`, which `OPENSSL_free` cleanses when an [`AeadKey`] is dropped.)
pub type KeyBytes = zeroize::Zeroizing<[u8; KEY_BYTES]>;
/// Wrapped DEK: nonce (12) ‖ ciphertext (32) ‖ tag (16).
pub const WRAPPED_DEK_BYTES: usize = 12 + KEY_BYTES + 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("authentication failed")]
pub struct AuthError;

/// A 256-bit AES-GCM key, ready to use.
pub struct AeadKey(LessSafeKey);

impl AeadKey {
    pub fn new(bytes: &[u8; KEY_BYTES]) -> Self {
        AeadKey(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, bytes).expect("32 bytes is an AES-256 key"),
        ))
    }
}

/// Fresh random key material from the system's CSPRNG.
pub fn random_key() -> KeyBytes {
    let mut k = KeyBytes::new([0u8; KEY_BYTES]);
    aws_lc_rs::rand::fill(&mut *k).expect("the system CSPRNG does not fail");
    k
}

/// A short public identifier of a key (SHA-256 of a domain tag and the key, first 8 bytes),
/// to tell whether a key file changed without keeping its bytes around.
pub fn fingerprint(key: &[u8; KEY_BYTES]) -> [u8; 8] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    ctx.update(b"ctxpod/kek-fingerprint/v1");
    ctx.update(key);
    ctx.finish().as_ref()[..8].try_into().expect("8 bytes")
}

pub fn block_aad(ns_id: u32, key_id: u32, key: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(15 + 9 + key.len());
    aad.extend_from_slice(b"ctxpod/block/v1");
    aad.extend_from_slice(&ns_id.to_le_bytes());
    aad.extend_from_slice(&key_id.to_le_bytes());
    aad.push(key.len() as u8);
    aad.extend_from_slice(key);
    aad
}

/// The associated data of an extent of a large value: a block's, then the value's sequence
/// number and the extent's index, so that no extent can stand in for another (of another
/// value, of another generation of this one, or at another place in it).
pub fn extent_aad(ns_id: u32, key_id: u32, key: &[u8], value_seq: u64, index: u32) -> Vec<u8> {
    let mut aad = block_aad(ns_id, key_id, key);
    aad.extend_from_slice(b"/extent");
    aad.extend_from_slice(&value_seq.to_le_bytes());
    aad.extend_from_slice(&index.to_le_bytes());
    aad
}

/// The associated data of a compressed record of the block written with sequence number
/// `seq`, of `len` bytes and CRC32C `crc`, whose body is stored `codec`-compressed. The
/// sequence number binds it to its generation (its nonce is not `seq`'s, unlike an
/// uncompressed record's): a compressed body of an earlier block of the same key, length
/// and CRC32C does not open as a later one's. For an extent of a large value (`extent`),
/// the value's generation and the extent's index follow, as in [`extent_aad`]; a block's
/// associated data is what it always was.
pub fn compressed_aad(
    (ns_id, key_id, key): (u32, u32, &[u8]),
    codec: ctxpod_format::record::Codec,
    seq: u64,
    (len, crc): (u32, u32),
    extent: Option<ctxpod_format::record::ExtentOf>,
) -> Vec<u8> {
    let mut aad = block_aad(ns_id, key_id, key);
    aad.extend_from_slice(b"/compressed");
    aad.push(codec as u8);
    aad.extend_from_slice(&seq.to_le_bytes());
    aad.extend_from_slice(&len.to_le_bytes());
    aad.extend_from_slice(&crc.to_le_bytes());
    if let Some(x) = extent {
        aad.extend_from_slice(b"/extent");
        aad.extend_from_slice(&x.value_seq.to_le_bytes());
        aad.extend_from_slice(&x.index.to_le_bytes());
    }
    aad
}

/// The associated data of segment `index` of a segmented record of `len` bytes whose
/// record (block or extent) is sealed under `record_aad`.
pub fn segment_aad(record_aad: &[u8], len: u32, index: u32) -> Vec<u8> {
    let mut aad = Vec::with_capacity(record_aad.len() + 16);
    aad.extend_from_slice(record_aad);
    aad.extend_from_slice(b"/segment");
    aad.extend_from_slice(&len.to_le_bytes());
    aad.extend_from_slice(&index.to_le_bytes());
    aad
}

/// Makes `aad`, a [`segment_aad`], that of segment `index` of the same record (in place: one
/// buffer for all of a record's segments).
pub fn set_segment_index(aad: &mut [u8], index: u32) {
    let n = aad.len();
    aad[n - 4..].copy_from_slice(&index.to_le_bytes());
}

/// Decrypts `in_out` in place against a tag kept apart from it.
pub fn open_separate(
    key: &AeadKey,
    nonce: [u8; 12],
    aad: &[u8],
    tag: &[u8; 16],
    in_out: &mut [u8],
) -> Result<(), AuthError> {
    key.0
        .open_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            tag,
            in_out,
        )
        .map(|_| ())
        .map_err(|_| AuthError)
}

/// Encrypts `in_out` in place; returns the tag.
pub fn seal(key: &AeadKey, nonce: [u8; 12], aad: &[u8], in_out: &mut [u8]) -> [u8; 16] {
    let tag = key
        .0
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
        .expect("AES-GCM sealing of a bounded buffer cannot fail");
    tag.as_ref().try_into().expect("AES-GCM tags are 16 bytes")
}

/// Decrypts `ciphertext ‖ tag` in place; returns the plaintext's length.
pub fn open(
    key: &AeadKey,
    nonce: [u8; 12],
    aad: &[u8],
    in_out: &mut [u8],
) -> Result<usize, AuthError> {
    key.0
        .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
        .map(|p| p.len())
        .map_err(|_| AuthError)
}

fn wrap_aad(ns_id: u32, key_id: u32) -> Vec<u8> {
    let mut aad = b"ctxpod/dek/v1".to_vec();
    aad.extend_from_slice(&ns_id.to_le_bytes());
    aad.extend_from_slice(&key_id.to_le_bytes());
    aad
}

pub fn wrap_dek(kek: &AeadKey, ns_id: u32, key_id: u32, dek: &[u8; KEY_BYTES]) -> Vec<u8> {
    let mut nonce = [0u8; 12];
    aws_lc_rs::rand::fill(&mut nonce).expect("the system CSPRNG does not fail");
    let mut ct = KeyBytes::new(*dek);
    let tag = seal(kek, nonce, &wrap_aad(ns_id, key_id), &mut *ct);
    let mut out = Vec::with_capacity(WRAPPED_DEK_BYTES);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&*ct);
    out.extend_from_slice(&tag);
    out
}

pub fn unwrap_dek(
    kek: &AeadKey,
    ns_id: u32,
    key_id: u32,
    wrapped: &[u8],
) -> Result<KeyBytes, AuthError> {
    if wrapped.len() != WRAPPED_DEK_BYTES {
        return Err(AuthError);
    }
    let nonce: [u8; 12] = wrapped[..12].try_into().expect("12 bytes");
    let mut buf = zeroize::Zeroizing::new(wrapped[12..].to_vec());
    let n = open(kek, nonce, &wrap_aad(ns_id, key_id), &mut buf)?;
    let key: [u8; KEY_BYTES] = buf[..n].try_into().map_err(|_| AuthError)?;
    Ok(KeyBytes::new(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_and_binding() {
        let k = AeadKey::new(&random_key());
        let aad = block_aad(1, 1, b"key");
        let mut buf = b"hello block".to_vec();
        let tag = seal(&k, [7; 12], &aad, &mut buf);
        assert_ne!(&buf[..], b"hello block");
        let mut sealed = buf.clone();
        sealed.extend_from_slice(&tag);
        let mut ok = sealed.clone();
        assert_eq!(open(&k, [7; 12], &aad, &mut ok), Ok(11));
        assert_eq!(&ok[..11], b"hello block");
        // Another key, namespace or key id in the AAD, another nonce, a flipped bit: refused.
        for bad_aad in [
            block_aad(1, 1, b"kez"),
            block_aad(2, 1, b"key"),
            block_aad(1, 2, b"key"),
        ] {
            assert!(open(&k, [7; 12], &bad_aad, &mut sealed.clone()).is_err());
        }
        assert!(open(&k, [8; 12], &aad, &mut sealed.clone()).is_err());
        let mut flipped = sealed.clone();
        flipped[3] ^= 1;
        assert!(open(&k, [7; 12], &aad, &mut flipped).is_err());
    }

    #[test]
    fn wrap_unwrap() {
        let kek = AeadKey::new(&random_key());
        let dek = random_key();
        let w = wrap_dek(&kek, 4, 1, &dek);
        assert_eq!(w.len(), WRAPPED_DEK_BYTES);
        assert_eq!(unwrap_dek(&kek, 4, 1, &w), Ok(dek));
        assert!(unwrap_dek(&kek, 5, 1, &w).is_err());
        let other = AeadKey::new(&random_key());
        assert!(unwrap_dek(&other, 4, 1, &w).is_err());
    }

    /// Known answers: AES-256 test cases 13-16 of McGrew and Viega, "The Galois/Counter Mode
    /// of Operation (GCM)" (the GCM submission to NIST), through `seal` and `open` as the
    /// data path calls them. Each was also checked against Python's `cryptography`.
    #[test]
    fn aes_256_gcm_known_answers() {
        let h = |s: &str| hex::decode(s).expect("hex");
        let k15 = "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308";
        let p15 = "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
                   1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255";
        let c15 = "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
                   8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad";
        let squeeze = |s: &str| s.split_whitespace().collect::<String>();
        let (p15, c15) = (squeeze(p15), squeeze(c15));
        // (key, iv, plaintext, aad, ciphertext, tag)
        let cases: [(String, &str, String, &str, String, &str); 4] = [
            (
                "00".repeat(32),
                "000000000000000000000000",
                String::new(),
                "",
                String::new(),
                "530f8afbc74536b9a963b4f1c4cb738b",
            ),
            (
                "00".repeat(32),
                "000000000000000000000000",
                "00".repeat(16),
                "",
                "cea7403d4d606b6e074ec5d3baf39d18".into(),
                "d0d1c8a799996bf0265b98b5d48ab919",
            ),
            (
                k15.into(),
                "cafebabefacedbaddecaf888",
                p15.clone(),
                "",
                c15.clone(),
                "b094dac5d93471bdec1a502270e3cc6c",
            ),
            (
                k15.into(),
                "cafebabefacedbaddecaf888",
                p15[..120].into(),
                "feedfacedeadbeeffeedfacedeadbeefabaddad2",
                c15[..120].into(),
                "76fc6ece0f4e1768cddf8853bb2d551b",
            ),
        ];
        for (i, (key, iv, pt, aad, ct, tag)) in cases.iter().enumerate() {
            let k = AeadKey::new(&h(key).try_into().expect("32 bytes"));
            let nonce: [u8; 12] = h(iv).try_into().expect("12 bytes");
            let mut buf = h(pt);
            let t = seal(&k, nonce, &h(aad), &mut buf);
            assert_eq!(hex::encode(&buf), *ct, "case {} ciphertext", i + 13);
            assert_eq!(hex::encode(t), *tag, "case {} tag", i + 13);
            buf.extend_from_slice(&t);
            let n = open(&k, nonce, &h(aad), &mut buf.clone()).expect("opens");
            assert_eq!(n, h(pt).len());
            // Every single-bit flip of ciphertext or tag is refused.
            for bit in 0..buf.len() * 8 {
                let mut bad = buf.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                assert!(
                    open(&k, nonce, &h(aad), &mut bad).is_err(),
                    "case {} bit {bit}",
                    i + 13
                );
            }
        }
    }
}
