//! The checksums an S3 request declares for its body, checked as the body streams: every
//! algorithm S3 defines (`Content-MD5`, `x-amz-checksum-crc32`, `-crc32c`, `-crc64nvme`,
//! `-sha1`, `-sha256`), announced in a header or, through `x-amz-trailer`, in the body's
//! trailer. A checksum header of any other name is refused before the body is read, so no
//! body is stored whose declared checksum was not checked. Sans-IO: bytes in, a verdict
//! out; the streams that feed it are PutObject's and DeleteObjects'.

use http::HeaderMap;
use s3s::crypto::Checksum as _;
use s3s::{s3_error, S3Error, S3Result};

/// One of S3's checksum algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algo {
    Md5,
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
    /// SigV4's `x-amz-content-sha256` as a hex SHA-256 of the payload (checked here when
    /// no signature check does it: the door without authentication).
    ContentSha256,
}

impl Algo {
    const ALL: [Algo; 6] = [
        Algo::Md5,
        Algo::Crc32,
        Algo::Crc32c,
        Algo::Crc64Nvme,
        Algo::Sha1,
        Algo::Sha256,
    ];

    /// The header (or trailer) that carries it.
    pub(crate) fn header(self) -> &'static str {
        match self {
            Algo::Md5 => "content-md5",
            Algo::Crc32 => "x-amz-checksum-crc32",
            Algo::Crc32c => "x-amz-checksum-crc32c",
            Algo::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Algo::Sha1 => "x-amz-checksum-sha1",
            Algo::Sha256 => "x-amz-checksum-sha256",
            Algo::ContentSha256 => "x-amz-content-sha256",
        }
    }

    /// The digest's length in bytes.
    fn len(self) -> usize {
        match self {
            Algo::Md5 => 16,
            Algo::Crc32 | Algo::Crc32c => 4,
            Algo::Crc64Nvme => 8,
            Algo::Sha1 => 20,
            Algo::Sha256 | Algo::ContentSha256 => 32,
        }
    }

    fn by_header(name: &str) -> Option<Algo> {
        Algo::ALL.into_iter().find(|a| a.header() == name)
    }

    /// By the name `x-amz-sdk-checksum-algorithm` spells it (`CRC32`, `SHA256`, …).
    fn by_name(name: &str) -> Option<Algo> {
        match name.to_ascii_uppercase().as_str() {
            "CRC32" => Some(Algo::Crc32),
            "CRC32C" => Some(Algo::Crc32c),
            "CRC64NVME" => Some(Algo::Crc64Nvme),
            "SHA1" => Some(Algo::Sha1),
            "SHA256" => Some(Algo::Sha256),
            _ => None,
        }
    }
}

/// `x-amz-checksum-*` headers that name no checksum of the body.
const NOT_A_CHECKSUM: [&str; 3] = [
    "x-amz-checksum-type",
    "x-amz-checksum-algorithm",
    "x-amz-checksum-mode",
];

enum Hasher {
    Md5(s3s::crypto::Md5),
    Crc32(s3s::crypto::Crc32),
    Crc32c(s3s::crypto::Crc32c),
    Crc64Nvme(s3s::crypto::Crc64Nvme),
    Sha1(s3s::crypto::Sha1),
    Sha256(s3s::crypto::Sha256),
}

impl Hasher {
    fn new(a: Algo) -> Hasher {
        match a {
            Algo::Md5 => Hasher::Md5(s3s::crypto::Md5::new()),
            Algo::Crc32 => Hasher::Crc32(s3s::crypto::Crc32::new()),
            Algo::Crc32c => Hasher::Crc32c(s3s::crypto::Crc32c::new()),
            Algo::Crc64Nvme => Hasher::Crc64Nvme(s3s::crypto::Crc64Nvme::new()),
            Algo::Sha1 => Hasher::Sha1(s3s::crypto::Sha1::new()),
            Algo::Sha256 | Algo::ContentSha256 => Hasher::Sha256(s3s::crypto::Sha256::new()),
        }
    }

    fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::Md5(h) => h.update(b),
            Hasher::Crc32(h) => h.update(b),
            Hasher::Crc32c(h) => h.update(b),
            Hasher::Crc64Nvme(h) => h.update(b),
            Hasher::Sha1(h) => h.update(b),
            Hasher::Sha256(h) => h.update(b),
        }
    }

    fn finalize(self) -> Vec<u8> {
        match self {
            Hasher::Md5(h) => h.finalize().to_vec(),
            Hasher::Crc32(h) => h.finalize().to_vec(),
            Hasher::Crc32c(h) => h.finalize().to_vec(),
            Hasher::Crc64Nvme(h) => h.finalize().to_vec(),
            Hasher::Sha1(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
        }
    }
}

/// Where a checksum's expected value comes from.
enum Want {
    /// The request's header, decoded.
    Header(Vec<u8>),
    /// The body's trailer (named in `x-amz-trailer`).
    Trailer,
}

/// The checksums one body must match, fed as it streams.
pub(crate) struct Digests {
    checks: Vec<(Algo, Hasher, Want)>,
    /// Always computed: the object's ETag and `x-amz-checksum-crc32c` answer.
    crc32c: s3s::crypto::Crc32c,
}

/// What a whole body came to.
pub(crate) struct Verified {
    pub crc32c: [u8; 4],
    /// The algorithms whose declared value the body matched (read by the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub checked: Vec<Algo>,
}

fn b64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .ok()
}

/// The checksum headers of `h` added to `checks`: Content-MD5 and each
/// `x-amz-checksum-*` of an algorithm S3 defines, each a well-formed value, none twice.
fn header_checks(h: &HeaderMap, checks: &mut Vec<(Algo, Hasher, Want)>) -> S3Result<()> {
    for (name, value) in h {
        let name = name.as_str();
        let algo = if name == "content-md5" {
            Algo::Md5
        } else if let Some(a) = Algo::by_header(name) {
            a
        } else if name.starts_with("x-amz-checksum-") && !NOT_A_CHECKSUM.contains(&name) {
            return Err(s3_error!(
                InvalidRequest,
                "{name} is not a checksum this door checks (it checks Content-MD5 and \
                 x-amz-checksum-crc32, -crc32c, -crc64nvme, -sha1 and -sha256)"
            ));
        } else {
            continue;
        };
        let want = value
            .to_str()
            .ok()
            .and_then(b64_decode)
            .filter(|d| d.len() == algo.len())
            .ok_or_else(|| {
                s3_error!(
                    InvalidDigest,
                    "{name} is not {} bytes in base64",
                    algo.len()
                )
            })?;
        if checks.iter().any(|(a, ..)| *a == algo) {
            return Err(s3_error!(InvalidRequest, "{name} is given twice"));
        }
        checks.push((algo, Hasher::new(algo), Want::Header(want)));
    }
    Ok(())
}

/// The trailers `x-amz-trailer` names added to `checks`: each a checksum S3 defines, and
/// not a header too.
fn trailer_checks(h: &HeaderMap, checks: &mut Vec<(Algo, Hasher, Want)>) -> S3Result<()> {
    for trailer in h.get_all("x-amz-trailer") {
        let names = trailer
            .to_str()
            .map_err(|_| s3_error!(InvalidRequest, "x-amz-trailer is not text"))?;
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let name = name.to_ascii_lowercase();
            let algo = Algo::by_header(&name)
                .filter(|a| *a != Algo::Md5)
                .ok_or_else(|| {
                    s3_error!(
                        InvalidRequest,
                        "a trailer {name} is not a checksum this door checks (it checks \
                     x-amz-checksum-crc32, -crc32c, -crc64nvme, -sha1 and -sha256)"
                    )
                })?;
            if checks.iter().any(|(a, ..)| *a == algo) {
                return Err(s3_error!(
                    InvalidRequest,
                    "{name} is both a header and a trailer"
                ));
            }
            checks.push((algo, Hasher::new(algo), Want::Trailer));
        }
    }
    Ok(())
}

/// Refuses an algorithm `h` names (`x-amz-sdk-checksum-algorithm`,
/// `x-amz-checksum-algorithm`) that none of `checks` carries the value of.
fn algorithms_carried(h: &HeaderMap, checks: &[(Algo, Hasher, Want)]) -> S3Result<()> {
    // An algorithm named without a value (neither header nor trailer) cannot be checked.
    for name in ["x-amz-sdk-checksum-algorithm", "x-amz-checksum-algorithm"] {
        if let Some(v) = h.get(name).and_then(|v| v.to_str().ok()) {
            let Some(algo) = Algo::by_name(v) else {
                return Err(s3_error!(
                    InvalidRequest,
                    "{name}: {v} is not a checksum this door checks"
                ));
            };
            if !checks.iter().any(|(a, ..)| *a == algo) {
                return Err(s3_error!(
                    InvalidRequest,
                    "{name} says {v}, but no {} header or trailer carries its value",
                    algo.header()
                ));
            }
        }
    }
    Ok(())
}

impl Digests {
    /// The checksums `h` declares: every checksum header (each must be a well-formed value
    /// of its algorithm), and the trailer `x-amz-trailer` names. A checksum header or
    /// trailer of an algorithm S3 does not define is refused (InvalidRequest, named).
    /// With `content_sha256`, a hex `x-amz-content-sha256` is checked too (where no
    /// signature check does it).
    pub(crate) fn from_headers(h: &HeaderMap, content_sha256: bool) -> S3Result<Digests> {
        let mut checks: Vec<(Algo, Hasher, Want)> = Vec::new();
        if let Some(v) = h.get(Algo::ContentSha256.header()) {
            let hexed = v
                .to_str()
                .ok()
                .filter(|v| v.len() == 64)
                .and_then(|v| hex::decode(v).ok());
            if let (true, Some(want)) = (content_sha256, hexed) {
                checks.push((
                    Algo::ContentSha256,
                    Hasher::new(Algo::ContentSha256),
                    Want::Header(want),
                ));
            }
        }
        header_checks(h, &mut checks)?;
        trailer_checks(h, &mut checks)?;
        algorithms_carried(h, &checks)?;
        Ok(Digests {
            checks,
            crc32c: s3s::crypto::Crc32c::new(),
        })
    }

    /// Whether any checksum of the body was declared.
    pub(crate) fn any(&self) -> bool {
        !self.checks.is_empty()
    }

    pub(crate) fn update(&mut self, b: &[u8]) {
        self.crc32c.update(b);
        for (_, h, _) in &mut self.checks {
            h.update(b);
        }
    }

    /// At the body's end: every declared checksum compared with what was read (a
    /// trailer's from `trailer`). A mismatch is BadDigest; a trailer announced but not
    /// sent is InvalidRequest.
    pub(crate) fn finish(self, trailer: Option<&HeaderMap>) -> Result<Verified, S3Error> {
        let mut checked = Vec::with_capacity(self.checks.len());
        for (algo, h, want) in self.checks {
            let want = match want {
                Want::Header(w) => w,
                Want::Trailer => trailer
                    .and_then(|t| t.get(algo.header()))
                    .and_then(|v| v.to_str().ok())
                    .and_then(b64_decode)
                    .ok_or_else(|| {
                        s3_error!(
                            InvalidRequest,
                            "the trailer {} was announced but not sent (or is not base64)",
                            algo.header()
                        )
                    })?,
            };
            if h.finalize() != want {
                let name = match algo {
                    Algo::Md5 => "Content-MD5",
                    a => a.header(),
                };
                return Err(s3_error!(BadDigest, "{name} does not match the body"));
            }
            checked.push(algo);
        }
        Ok(Verified {
            crc32c: self.crc32c.finalize(),
            checked,
        })
    }
}

/// A request body checked against its [`Digests`] as it is read: at its end a mismatch
/// goes to `verdict` and ends the stream with an error, so whoever reads it acts on
/// nothing.
pub(crate) struct CheckedBody<S> {
    inner: S,
    digests: Option<Digests>,
    verdict: std::sync::Arc<parking_lot::Mutex<Option<S3Error>>>,
}

impl<S> CheckedBody<S> {
    pub(crate) fn new(
        inner: S,
        digests: Digests,
        verdict: std::sync::Arc<parking_lot::Mutex<Option<S3Error>>>,
    ) -> Self {
        CheckedBody {
            inner,
            digests: Some(digests),
            verdict,
        }
    }
}

impl<S, E> futures::Stream for CheckedBody<S>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    type Item = Result<bytes::Bytes, std::io::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use futures::StreamExt as _;
        use std::task::Poll;
        if self.digests.is_none() {
            return Poll::Ready(None);
        }
        match self.inner.poll_next_unpin(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(b))) => {
                if let Some(d) = &mut self.digests {
                    d.update(&b);
                }
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.digests = None;
                Poll::Ready(Some(Err(std::io::Error::other(e.to_string()))))
            }
            Poll::Ready(None) => {
                let d = self.digests.take().expect("checked above");
                match d.finish(None) {
                    Ok(_) => Poll::Ready(None),
                    Err(e) => {
                        let msg = e.message().unwrap_or_default().to_string();
                        *self.verdict.lock() = Some(e);
                        Poll::Ready(Some(Err(std::io::Error::other(msg))))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(b: &[u8]) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(b)
    }

    fn headers(pairs: &[(&str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn digest(a: Algo, body: &[u8]) -> Vec<u8> {
        let mut h = Hasher::new(a);
        h.update(body);
        h.finalize()
    }

    #[test]
    fn every_algorithm_right_passes_and_wrong_is_bad_digest() {
        let body = b"the quick brown fox jumps over the lazy dog".repeat(1000);
        for a in Algo::ALL {
            let right = headers(&[(a.header(), b64(&digest(a, &body)))]);
            let mut d = Digests::from_headers(&right, false).unwrap();
            for c in body.chunks(777) {
                d.update(c);
            }
            assert_eq!(d.finish(None).unwrap().checked, vec![a]);
            let mut wrong_digest = digest(a, &body);
            wrong_digest[0] ^= 1;
            let wrong = headers(&[(a.header(), b64(&wrong_digest))]);
            let mut d = Digests::from_headers(&wrong, false).unwrap();
            d.update(&body);
            let e = d.finish(None).err().expect("a wrong checksum is refused");
            assert_eq!(*e.code(), s3s::S3ErrorCode::BadDigest, "{a:?}");
        }
    }

    #[test]
    fn a_trailer_is_checked_and_a_missing_one_refused() {
        let body = vec![7u8; 100_000];
        for a in Algo::ALL.into_iter().filter(|a| *a != Algo::Md5) {
            let h = headers(&[("x-amz-trailer", a.header().to_string())]);
            let mut d = Digests::from_headers(&h, false).unwrap();
            d.update(&body);
            let t = headers(&[(a.header(), b64(&digest(a, &body)))]);
            assert!(d.finish(Some(&t)).is_ok());
            let mut d = Digests::from_headers(&h, false).unwrap();
            d.update(&body);
            let t = headers(&[(a.header(), b64(&digest(a, b"other")))]);
            let e = d.finish(Some(&t)).err().unwrap();
            assert_eq!(*e.code(), s3s::S3ErrorCode::BadDigest);
            let mut d = Digests::from_headers(&h, false).unwrap();
            d.update(&body);
            assert!(
                d.finish(None).is_err(),
                "an announced trailer that never came"
            );
        }
    }

    #[test]
    fn unknown_or_malformed_checksums_are_refused_before_the_body() {
        let unknown = headers(&[("x-amz-checksum-xxhash64", "AAAAAAAAAAA=".into())]);
        let e = Digests::from_headers(&unknown, false).err().unwrap();
        assert_eq!(*e.code(), s3s::S3ErrorCode::InvalidRequest);
        assert!(e.message().unwrap().contains("x-amz-checksum-xxhash64"));
        let trailer = headers(&[("x-amz-trailer", "x-amz-checksum-md4".into())]);
        assert!(Digests::from_headers(&trailer, false).is_err());
        let short = headers(&[("x-amz-checksum-sha256", b64(&[1, 2, 3]))]);
        let e = Digests::from_headers(&short, false).err().unwrap();
        assert_eq!(*e.code(), s3s::S3ErrorCode::InvalidDigest);
        let named_only = headers(&[("x-amz-sdk-checksum-algorithm", "SHA1".into())]);
        assert!(Digests::from_headers(&named_only, false).is_err());
        let named_unknown = headers(&[("x-amz-sdk-checksum-algorithm", "XXH3".into())]);
        assert!(Digests::from_headers(&named_unknown, false).is_err());
        // Not checksums of the body.
        let other = headers(&[("x-amz-checksum-mode", "ENABLED".into())]);
        assert!(!Digests::from_headers(&other, false).unwrap().any());
    }

    #[test]
    fn a_hex_content_sha256_is_checked_when_asked() {
        let body = b"payload".repeat(100);
        let right = headers(&[(
            "x-amz-content-sha256",
            hex::encode(digest(Algo::Sha256, &body)),
        )]);
        let wrong = headers(&[("x-amz-content-sha256", hex::encode([9u8; 32]))]);
        let unsigned = headers(&[("x-amz-content-sha256", "UNSIGNED-PAYLOAD".into())]);
        for (h, ok) in [(&right, true), (&wrong, false), (&unsigned, true)] {
            let mut d = Digests::from_headers(h, true).unwrap();
            d.update(&body);
            assert_eq!(d.finish(None).is_ok(), ok);
        }
        // Not asked (a signature check does it): not computed.
        assert!(!Digests::from_headers(&wrong, false).unwrap().any());
    }
}
