//! Fuzz target: the node's `Put` body parser (`proto::PutBodyParser`), fed arbitrary bytes
//! in arbitrary pieces, block data landed in arbitrary pieces, as the node's socket reader
//! drives it. Properties: no panic; it never takes more than it asked for, nor a byte past
//! the body (fed + landed + skipped is the body's length); the outcome is the one-shot
//! parse's (`decode_put_body`, which `Request::decode` runs); a body that parses
//! re-encodes to itself.

#![no_main]

use bytes::Bytes;
use ctxpod_wire::proto::{decode_put_body, PutBodyParser, PutEntry, PutStep, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first 8 bytes choose the piece sizes (1..=255, cyclically); the rest is the body.
    if data.len() < 8 {
        return;
    }
    let (seeds, body) = data.split_at(8);
    let mut sizes = seeds.iter().map(|&s| s.max(1) as usize).cycle();
    let mut p = PutBodyParser::new(body.len());
    let (mut at, mut entries) = (0usize, Vec::new());
    let mut cur: Option<(Bytes, u32, Vec<u8>, usize)> = None;
    let pieces = loop {
        match p.step() {
            PutStep::Need(n) => {
                assert!(n >= 1 && n <= p.left(), "asked past the body");
                let end = (at + sizes.next().expect("cycle")).min(body.len());
                let k = p.feed(&body[at..end]);
                assert!(k <= n && k <= end - at && k > 0);
                at += k;
            }
            PutStep::Block { key, crc32c, len } => {
                assert!(cur.is_none() && len >= 1 && len <= p.left());
                assert!((1..=128).contains(&key.len()));
                cur = Some((key, crc32c, Vec::new(), len));
            }
            PutStep::Land(n) => {
                let k = sizes.next().expect("cycle").min(n);
                let c = cur.as_mut().expect("a block");
                c.2.extend_from_slice(&body[at..at + k]);
                at += k;
                p.landed(k);
                if k == n {
                    let (key, crc32c, d, len) = cur.take().expect("a block");
                    assert_eq!(d.len(), len);
                    entries.push(PutEntry {
                        key,
                        crc32c,
                        data: d.into(),
                    });
                }
            }
            PutStep::Done { ns, durability } => {
                assert_eq!(at, body.len());
                break Ok((ns, durability, entries));
            }
            PutStep::Bad { error, skip } => {
                assert_eq!(at + skip, body.len());
                break Err(error);
            }
        }
    };
    let whole = decode_put_body(&Bytes::copy_from_slice(body));
    assert_eq!(pieces, whole);
    if let Ok((ns, durability, entries)) = whole {
        assert!(entries.len() <= ctxpod_wire::BATCH_ENTRIES_MAX);
        let r = Request::Put {
            ns,
            durability,
            entries,
        };
        assert_eq!(&r.encode(1)[16..], body);
    }
});
