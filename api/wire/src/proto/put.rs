//! The one parser of a CXP1 `Put` body: a sans-IO push parser. The node's socket reader
//! drives it (`ctxpod::transfer`), landing each block's bytes straight into the buffer its
//! record is written from; [`decode_put_body`] drives it over a body held in memory (the
//! codec's [`super::Request::decode`]); the `put_body` fuzz target drives both, in arbitrary
//! pieces, and checks that they agree.
//!
//! Layout (api/PROTOCOL.md): `str8` ns, `u8` durability, `count` n, n × (`key8`, `u32`
//! crc32c, `u32` len, len bytes). Every field is checked against the bytes left in the
//! body before a byte of it is asked for, so a short body can never make the reader wait
//! for, or take, the next frame's bytes.

use super::{Durability, Op, ProtoError, PutEntry, NAMESPACE_BYTES_MAX};
use bytes::Bytes;

/// What the driver of a [`PutBodyParser`] does next.
#[derive(Debug, PartialEq, Eq)]
pub enum PutStep {
    /// Offer more bytes with [`PutBodyParser::feed`]: it takes at most this many, never
    /// block data.
    Need(usize),
    /// An entry: exactly `len` bytes of its data come next (1..=`BLOCK_BYTES_MAX`, within
    /// the body). Land them where they belong, then report them with
    /// [`PutBodyParser::landed`].
    Block { key: Bytes, crc32c: u32, len: usize },
    /// `n` bytes of the current block are still to be landed.
    Land(usize),
    /// The body is well formed and wholly consumed.
    Done { ns: String, durability: Durability },
    /// Malformed: discard the `skip` bytes left of the body and answer 400 (the stream's
    /// framing is intact: the frame's length is known).
    Bad { error: ProtoError, skip: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    NsLen,
    Ns(usize),
    Durability,
    Count,
    KeyLen,
    Key(usize),
    CrcLen,
    Data(usize),
    End,
    Failed,
}

/// A PUT body of a known length, parsed as its bytes are offered.
pub struct PutBodyParser {
    /// Body bytes neither fed nor landed yet.
    left: usize,
    state: State,
    /// The small field being read (at most a key of 128 bytes).
    field: Vec<u8>,
    ns: Option<String>,
    durability: Durability,
    /// Entries announced, and how many the body says it has.
    entries: usize,
    count: usize,
    key: Bytes,
    error: Option<ProtoError>,
}

impl PutBodyParser {
    pub fn new(body_len: usize) -> PutBodyParser {
        PutBodyParser {
            left: body_len,
            state: State::NsLen,
            field: Vec::with_capacity(crate::KEY_BYTES_MAX),
            ns: None,
            durability: Durability::Durable,
            entries: 0,
            count: 0,
            key: Bytes::new(),
            error: None,
        }
    }

    /// Body bytes neither fed nor landed yet.
    pub fn left(&self) -> usize {
        self.left
    }

    /// Entries the body announces (0 until its count is read).
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes of the field the parser is reading (0 when it reads none: block data, or
    /// done).
    fn field_len(&self) -> usize {
        match self.state {
            State::NsLen | State::Durability | State::KeyLen => 1,
            State::Ns(n) | State::Key(n) => n,
            State::Count => 4,
            State::CrcLen => 8,
            State::Data(_) | State::End | State::Failed => 0,
        }
    }

    fn fail(&mut self, e: ProtoError) -> PutStep {
        self.state = State::Failed;
        self.error = Some(e.clone());
        PutStep::Bad {
            error: e,
            skip: self.left,
        }
    }

    /// What to do next. Until bytes are fed or landed, it says the same again.
    pub fn step(&mut self) -> PutStep {
        loop {
            let want = self.field_len();
            match self.state {
                State::Failed => {
                    let e = self.error.clone().expect("failed with an error");
                    return PutStep::Bad {
                        error: e,
                        skip: self.left,
                    };
                }
                State::Data(n) => return PutStep::Land(n),
                State::End => {
                    if self.left > 0 {
                        return self.fail(ProtoError::Trailing(Op::Put, self.left));
                    }
                    return PutStep::Done {
                        ns: self.ns.clone().expect("read before the entries"),
                        durability: self.durability,
                    };
                }
                _ => {}
            }
            let missing = want - self.field.len();
            // Checked before a byte of the field is asked for: the field must fit the body.
            if missing > self.left {
                return self.fail(ProtoError::Truncated(Op::Put));
            }
            if missing > 0 {
                return PutStep::Need(missing);
            }
            let f = std::mem::take(&mut self.field);
            match self.state {
                State::NsLen => {
                    let n = f[0] as usize;
                    if n == 0 || n > NAMESPACE_BYTES_MAX {
                        return self.fail(ProtoError::BadNamespace(n));
                    }
                    self.state = State::Ns(n);
                }
                State::Ns(n) => match String::from_utf8(f.clone()) {
                    Ok(ns) => {
                        self.ns = Some(ns);
                        self.state = State::Durability;
                    }
                    Err(_) => return self.fail(ProtoError::BadNamespace(n)),
                },
                State::Durability => {
                    self.durability = match Durability::from_u8(f[0]) {
                        Some(d) => d,
                        None => return self.fail(ProtoError::BadDurability(f[0])),
                    };
                    self.state = State::Count;
                }
                State::Count => {
                    let n = u32::from_le_bytes(f[..4].try_into().expect("4 bytes")) as usize;
                    if n > crate::BATCH_ENTRIES_MAX {
                        return self.fail(ProtoError::TooManyEntries(n));
                    }
                    self.count = n;
                    self.state = if n == 0 { State::End } else { State::KeyLen };
                }
                State::KeyLen => {
                    let k = f[0] as usize;
                    if k == 0 || k > crate::KEY_BYTES_MAX {
                        return self.fail(ProtoError::BadKeyLength(k));
                    }
                    self.state = State::Key(k);
                }
                State::Key(_) => {
                    self.key = Bytes::copy_from_slice(&f);
                    self.state = State::CrcLen;
                }
                State::CrcLen => {
                    let crc32c = u32::from_le_bytes(f[..4].try_into().expect("4 bytes"));
                    let len = u32::from_le_bytes(f[4..8].try_into().expect("4 bytes"));
                    if len as usize > crate::BLOCK_BYTES_MAX {
                        return self.fail(ProtoError::BlockTooLarge(len));
                    }
                    if len == 0 {
                        return self.fail(ProtoError::EmptyBlock);
                    }
                    if len as usize > self.left {
                        return self.fail(ProtoError::Truncated(Op::Put));
                    }
                    self.state = State::Data(len as usize);
                    self.field = f;
                    self.field.clear();
                    return PutStep::Block {
                        key: std::mem::take(&mut self.key),
                        crc32c,
                        len: len as usize,
                    };
                }
                State::Data(_) | State::End | State::Failed => unreachable!("handled above"),
            }
            // The field's buffer is kept for the next one.
            self.field = f;
            self.field.clear();
        }
    }

    /// Takes bytes of the current field from `input` (at most what [`PutStep::Need`]
    /// said); how many it took. Never takes block data.
    pub fn feed(&mut self, input: &[u8]) -> usize {
        let want = self.field_len();
        let n = want
            .saturating_sub(self.field.len())
            .min(input.len())
            .min(self.left);
        self.field.extend_from_slice(&input[..n]);
        self.left -= n;
        n
    }

    /// `n` bytes of the current block were landed by the driver.
    pub fn landed(&mut self, n: usize) {
        let State::Data(rest) = self.state else {
            debug_assert!(n == 0, "landed {n} bytes outside a block");
            return;
        };
        let n = n.min(rest);
        self.left -= n;
        if n == rest {
            self.entries += 1;
            self.state = if self.entries == self.count {
                State::End
            } else {
                State::KeyLen
            };
        } else {
            self.state = State::Data(rest - n);
        }
    }
}

/// A decoded `Put` body: namespace, durability, entries.
pub type PutBody = (String, Durability, Vec<PutEntry>);

/// A whole PUT body held in memory, through the same parser (block data are zero-copy
/// slices of `body`).
pub fn decode_put_body(body: &Bytes) -> Result<PutBody, ProtoError> {
    let mut p = PutBodyParser::new(body.len());
    let mut at = 0;
    let mut entries = Vec::new();
    loop {
        match p.step() {
            PutStep::Need(_) => at += p.feed(&body[at..]),
            PutStep::Block { key, crc32c, len } => {
                entries.push(PutEntry {
                    key,
                    crc32c,
                    data: body.slice(at..at + len),
                });
                at += len;
                p.landed(len);
            }
            PutStep::Land(_) => unreachable!("landed whole"),
            PutStep::Done { ns, durability } => return Ok((ns, durability, entries)),
            PutStep::Bad { error, .. } => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Request;
    use rand::{Rng, SeedableRng};

    fn body(ns: &[u8], dur: u8, entries: &[(&[u8], u32, &[u8])]) -> Vec<u8> {
        let mut b = vec![ns.len() as u8];
        b.extend_from_slice(ns);
        b.push(dur);
        b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for (k, crc, d) in entries {
            b.push(k.len() as u8);
            b.extend_from_slice(k);
            b.extend_from_slice(&crc.to_le_bytes());
            b.extend_from_slice(&(d.len() as u32).to_le_bytes());
            b.extend_from_slice(d);
        }
        b
    }

    /// The parser fed in pieces of the given sizes (block data landed in pieces too):
    /// the outcome, and the bytes fed + landed + skipped (always the body's length).
    fn chunked(
        b: &[u8],
        sizes: &mut impl Iterator<Item = usize>,
    ) -> (Result<PutBody, ProtoError>, usize) {
        let mut p = PutBodyParser::new(b.len());
        let (mut at, mut entries) = (0, Vec::new());
        let mut cur: Option<(Bytes, u32, Vec<u8>)> = None;
        loop {
            match p.step() {
                PutStep::Need(n) => {
                    let piece = sizes.next().unwrap_or(1).max(1);
                    let end = (at + piece).min(b.len());
                    let k = p.feed(&b[at..end]);
                    assert!(k <= n && k <= end - at);
                    assert!(k > 0, "fed nothing with bytes offered");
                    at += k;
                }
                PutStep::Block { key, crc32c, len } => {
                    assert!(cur.is_none());
                    assert!((1..=crate::BLOCK_BYTES_MAX).contains(&len));
                    cur = Some((key, crc32c, Vec::with_capacity(len)));
                }
                PutStep::Land(n) => {
                    let piece = sizes.next().unwrap_or(1).clamp(1, n);
                    let c = cur.as_mut().expect("a block");
                    c.2.extend_from_slice(&b[at..at + piece]);
                    at += piece;
                    p.landed(piece);
                    if piece == n {
                        let (key, crc32c, data) = cur.take().expect("a block");
                        entries.push(PutEntry {
                            key,
                            crc32c,
                            data: data.into(),
                        });
                    }
                }
                PutStep::Done { ns, durability } => {
                    return (Ok((ns, durability, entries)), at);
                }
                PutStep::Bad { error, skip } => return (Err(error), at + skip),
            }
        }
    }

    /// Every body, well formed or not, parses the same in pieces of any size as whole,
    /// and the parser never asks for a byte past the body.
    #[test]
    fn pieces_of_any_size_parse_as_the_whole() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(18);
        for case in 0..5000 {
            let n = rng.gen_range(0..5usize);
            let keys: Vec<Vec<u8>> = (0..n)
                .map(|_| (0..rng.gen_range(1..20)).map(|_| rng.gen()).collect())
                .collect();
            let datas: Vec<Vec<u8>> = (0..n)
                .map(|_| (0..rng.gen_range(1..300)).map(|_| rng.gen()).collect())
                .collect();
            let entries: Vec<(&[u8], u32, &[u8])> = keys
                .iter()
                .zip(&datas)
                .map(|(k, d)| (&k[..], rng.gen(), &d[..]))
                .collect();
            let mut b = body(b"acme/kv", rng.gen_range(0..2), &entries);
            // Damage a third of them: a byte changed, cut short, or extended.
            match case % 6 {
                0 if !b.is_empty() => {
                    let i = rng.gen_range(0..b.len());
                    b[i] = rng.gen();
                }
                1 => b.truncate(rng.gen_range(0..b.len())),
                2 => b.push(rng.gen()),
                _ => {}
            }
            let whole = decode_put_body(&Bytes::from(b.clone()));
            let seed: u64 = rng.gen();
            let mut r = rand::rngs::StdRng::seed_from_u64(seed);
            let mut sizes = std::iter::from_fn(move || Some(r.gen_range(1..9usize)));
            let (pieces, consumed) = chunked(&b, &mut sizes);
            assert_eq!(pieces, whole, "case {case}");
            assert_eq!(consumed, b.len(), "case {case}: fed + landed + skipped");
            if case % 6 >= 3 {
                let (ns, _, got) = whole.expect("well formed");
                assert_eq!(ns, "acme/kv");
                assert_eq!(got.len(), n);
                for (e, d) in got.iter().zip(&datas) {
                    assert_eq!(&e.data[..], &d[..]);
                }
            }
        }
    }

    #[test]
    fn each_malformation_has_its_error() {
        let ok: &[(&[u8], u32, &[u8])] = &[(b"k", 7, b"data")];
        let cases: Vec<(Vec<u8>, ProtoError)> = vec![
            (vec![], ProtoError::Truncated(Op::Put)),
            (vec![0], ProtoError::BadNamespace(0)),
            (vec![64], ProtoError::BadNamespace(64)),
            (
                vec![2, 0xff, 0xfe, 0, 0, 0, 0, 0],
                ProtoError::BadNamespace(2),
            ),
            (body(b"n", 2, ok), ProtoError::BadDurability(2)),
            (
                {
                    let mut b = vec![1, b'n', 0];
                    b.extend_from_slice(&1025u32.to_le_bytes());
                    b
                },
                ProtoError::TooManyEntries(1025),
            ),
            (
                body(b"n", 0, &[(b"", 1, b"x")]),
                ProtoError::BadKeyLength(0),
            ),
            (body(b"n", 0, &[(b"k", 1, b"")]), ProtoError::EmptyBlock),
            (
                {
                    let mut b = body(b"n", 0, &[(b"k", 1, b"x")]);
                    let at = b.len() - 5;
                    b[at..at + 4].copy_from_slice(&(9u32 << 20).to_le_bytes());
                    b
                },
                ProtoError::BlockTooLarge(9 << 20),
            ),
            (
                {
                    let mut b = body(b"n", 0, ok);
                    b.pop();
                    b
                },
                ProtoError::Truncated(Op::Put),
            ),
            (
                {
                    let mut b = body(b"n", 0, ok);
                    b.extend_from_slice(b"xy");
                    b
                },
                ProtoError::Trailing(Op::Put, 2),
            ),
        ];
        for (b, want) in cases {
            assert_eq!(
                decode_put_body(&Bytes::from(b.clone())).unwrap_err(),
                want,
                "{b:?}"
            );
        }
        let (ns, d, e) = decode_put_body(&Bytes::from(body(b"n", 1, ok))).expect("ok");
        assert_eq!((ns.as_str(), d, e.len()), ("n", Durability::Fast, 1));
        // The codec's Put decoder is this parser.
        let r = Request::Put {
            ns: "n".into(),
            durability: Durability::Fast,
            entries: e,
        };
        let f = r.encode(9);
        let mut dec = crate::proto::FrameDecoder::new(1 << 20);
        dec.push(&f);
        let frame = dec.next_frame().expect("frame").expect("whole");
        assert_eq!(Request::decode(&frame).expect("decode"), r);
    }
}
