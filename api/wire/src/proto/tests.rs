//! Property and fuzz tests of the CXP1 codec: round trips through a decoder fed in random
//! pieces, every truncation, and random bytes (never a panic, never unbounded buffering).
//! `CTXPOD_PROTO_FUZZ_ITERS` (default 20 000) sets the fuzz length; docs/RELIABILITY.md
//! gives the long run.

use super::*;
use rand::{Rng, SeedableRng};

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

fn key(r: &mut impl Rng) -> Bytes {
    let n = r.gen_range(1..=crate::KEY_BYTES_MAX);
    Bytes::from((0..n).map(|_| r.gen()).collect::<Vec<u8>>())
}

fn keys(r: &mut impl Rng) -> Vec<Bytes> {
    (0..r.gen_range(0..20)).map(|_| key(r)).collect()
}

fn data(r: &mut impl Rng) -> Bytes {
    let n = if r.gen_bool(0.1) {
        r.gen_range(0..200_000)
    } else {
        r.gen_range(0..300)
    };
    Bytes::from((0..n).map(|_| r.gen()).collect::<Vec<u8>>())
}

fn ns(r: &mut impl Rng) -> String {
    let n = r.gen_range(1..=NAMESPACE_BYTES_MAX);
    (0..n).map(|_| r.gen_range(b'a'..=b'z') as char).collect()
}

/// A `PutValue` piece: a whole small value, or the last piece of a large one.
fn value_piece(r: &mut impl Rng) -> ValuePiece {
    let d = Some(data(r))
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| Bytes::from_static(b"x"));
    let (len, offset) = if r.gen() {
        (d.len() as u64, 0)
    } else {
        let at = (crate::EXTENT_BYTES * r.gen_range(2..200)) as u64;
        (at + d.len() as u64, at)
    };
    ValuePiece {
        ns: ns(r),
        key: key(r),
        durability: Durability::Fast,
        len,
        crc32c: r.gen(),
        offset,
        data: d,
    }
}

fn request(r: &mut impl Rng) -> Request {
    match r.gen_range(0..13) {
        10 => Request::PutValue(value_piece(r)),
        11 => Request::GetValue {
            ns: ns(r),
            key: key(r),
            offset: r.gen(),
            len: r.gen(),
        },
        0 => Request::Ping,
        1 => Request::Put {
            ns: ns(r),
            durability: if r.gen() {
                Durability::Durable
            } else {
                Durability::Fast
            },
            entries: (0..r.gen_range(0..6))
                .map(|_| {
                    // A stored block is 1 byte at least (an empty one is refused).
                    let d = Some(data(r))
                        .filter(|d| !d.is_empty())
                        .unwrap_or_else(|| Bytes::from_static(b"x"));
                    PutEntry {
                        key: key(r),
                        crc32c: crate::crc32c(&d),
                        data: d,
                    }
                })
                .collect(),
        },
        2 => Request::Get {
            ns: ns(r),
            keys: keys(r),
        },
        3 => Request::Match {
            ns: ns(r),
            keys: keys(r),
        },
        4 => Request::Pin {
            ns: ns(r),
            ttl_ms: r.gen(),
            keys: keys(r),
        },
        5 => Request::Unpin {
            ns: ns(r),
            keys: keys(r),
        },
        6 => Request::RegisterRegion {
            region_id: r.gen(),
            bytes: r.gen(),
        },
        7 => Request::Prefetch(PrefetchRequest {
            ns: ns(r),
            region_id: r.gen(),
            policy: [Policy::BestEffort, Policy::WaitComplete, Policy::Timeout][r.gen_range(0..3)],
            deadline_ms: r.gen(),
            lease_ms: r.gen(),
            entries: (0..r.gen_range(0..20))
                .map(|_| PrefetchEntry {
                    key: key(r),
                    offset: r.gen(),
                    max_len: r.gen(),
                })
                .collect(),
        }),
        8 => Request::Subscribe { ns: ns(r) },
        9 => Request::Auth {
            token: Bytes::from(format!("tok-{}.{:064x}", r.gen::<u16>(), r.gen::<u128>())),
        },
        _ => Request::Cancel { ticket: r.gen() },
    }
}

fn response(r: &mut impl Rng) -> (Response, Op) {
    let resp = match r.gen_range(0..14) {
        12 => Response::ValueStored { crc32c: r.gen() },
        13 => Response::ValuePiece {
            value_len: r.gen(),
            value_crc32c: r.gen(),
            offset: r.gen(),
            crc32c: r.gen(),
            data: data(r),
        },
        0 => Response::Pong,
        1 => Response::Put(
            (0..r.gen_range(0..10))
                .map(|_| (r.gen(), r.gen()))
                .collect(),
        ),
        2 => Response::Get(
            (0..r.gen_range(0..5))
                .map(|_| GetEntry {
                    status: r.gen(),
                    crc32c: r.gen(),
                    data: data(r),
                })
                .collect(),
        ),
        3 => Response::Count(r.gen()),
        4 => Response::RegionRegistered,
        5 => Response::Ticket(r.gen()),
        6 => Response::Push {
            index: r.gen(),
            status: r.gen(),
            crc32c: r.gen(),
            offset: r.gen(),
            data: data(r),
        },
        7 => Response::PrefetchDone {
            pushed: r.gen(),
            missed: r.gen(),
        },
        8 => Response::Cancelled,
        9 => Response::Events {
            lost: r.gen(),
            events: (0..r.gen_range(0..8))
                .map(|_| {
                    let kind = [EventKind::Stored, EventKind::Evicted, EventKind::Deleted];
                    (kind[r.gen_range(0..3)], key(r))
                })
                .collect(),
        },
        10 => Response::Authenticated {
            role: [Role::Admin, Role::TenantRw, Role::TenantRo][r.gen_range(0..3)],
            tenant: if r.gen() { String::new() } else { ns(r) },
        },
        _ => Response::Error("busy: the offload queue is full".into()),
    };
    let op = match &resp {
        Response::Count(_) => [Op::Match, Op::Pin, Op::Unpin][r.gen_range(0..3)],
        other => other.op(),
    };
    (resp, op)
}

/// Feeds `wire` to a decoder in random pieces and returns every frame.
fn frames(wire: &[u8], r: &mut impl Rng) -> Vec<Frame> {
    let mut d = FrameDecoder::new(FRAME_BYTES_MAX);
    let mut out = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        let n = r.gen_range(1..=wire.len() - at).min(r.gen_range(1..70_000));
        d.push(&wire[at..at + n]);
        at += n;
        while let Some(f) = d.next_frame().expect("valid frames decode") {
            out.push(f);
        }
    }
    assert_eq!(d.buffered(), 0);
    out
}

#[test]
fn hello_round_trips_and_checks_magic_and_version() {
    let h = Hello {
        version: VERSION,
        flags: 3,
        max_frame_bytes: 1 << 20,
        value_bytes_max: 256 << 20,
    };
    assert_eq!(Hello::decode(&h.encode()), Ok(h));
    let mut b = h.encode();
    b[0] = b'X';
    assert_eq!(Hello::decode(&b), Err(ProtoError::BadMagic));
    let mut b = h.encode();
    b[4] = 9;
    assert_eq!(Hello::decode(&b), Err(ProtoError::BadVersion(9)));
}

#[test]
fn requests_and_responses_round_trip_through_a_streaming_decoder() {
    let mut r = rng(1);
    for round in 0..200 {
        let reqs: Vec<Request> = (0..5).map(|_| request(&mut r)).collect();
        let resps: Vec<(Response, Op)> = (0..5).map(|_| response(&mut r)).collect();
        let mut wire = Vec::new();
        for (i, q) in reqs.iter().enumerate() {
            wire.extend_from_slice(&q.encode(round * 10 + i as u64));
        }
        for (i, (p, op)) in resps.iter().enumerate() {
            wire.extend_from_slice(&p.encode(*op, status::OK, 1000 + i as u64));
        }
        let fs = frames(&wire, &mut r);
        assert_eq!(fs.len(), 10);
        for (i, (f, q)) in fs.iter().zip(&reqs).enumerate() {
            assert_eq!(f.header.request_id, round * 10 + i as u64);
            assert_eq!(&Request::decode(f).expect("request decodes"), q);
        }
        for (f, (p, _)) in fs[5..].iter().zip(&resps) {
            assert_eq!(&Response::decode(f).expect("response decodes"), p);
        }
    }
}

#[test]
fn encoding_in_parts_gives_the_same_frame() {
    let mut r = rng(4);
    for _ in 0..200 {
        let q = request(&mut r);
        let whole = q.encode(5);
        let parts: Vec<u8> = q.encode_parts(5).iter().flat_map(|p| p.to_vec()).collect();
        assert_eq!(parts, whole.to_vec(), "{:?}", q.op());
        let (p, op) = response(&mut r);
        let whole = p.encode(op, 200, 9);
        let parts: Vec<u8> = p
            .encode_parts(op, 200, 9)
            .iter()
            .flat_map(|p| p.to_vec())
            .collect();
        assert_eq!(parts, whole.to_vec(), "{:?}", p.op());
    }
}

#[test]
fn every_truncation_waits_for_more_or_fails_cleanly() {
    let mut r = rng(2);
    let mut tried = 0;
    while tried < 50 {
        let wire = request(&mut r).encode(7);
        if wire.len() > 8192 {
            continue; // every cut of a small frame, to keep this quadratic test short
        }
        tried += 1;
        for cut in 0..wire.len() {
            // A prefix of a frame: the decoder waits for the rest.
            let mut d = FrameDecoder::new(FRAME_BYTES_MAX);
            d.push(&wire[..cut]);
            assert_eq!(d.next_frame(), Ok(None), "prefix of {cut} bytes");
            // A frame whose length claims only `cut` body bytes: decoding the body fails
            // (or, for an op without body, reports trailing bytes), never panics.
            if cut >= HEADER_BYTES && cut + 4 < wire.len() {
                let mut short = wire[..4 + cut].to_vec();
                short[..4].copy_from_slice(&(cut as u32).to_le_bytes());
                let mut d = FrameDecoder::new(FRAME_BYTES_MAX);
                d.push(&short);
                let f = d
                    .next_frame()
                    .expect("a well-formed frame")
                    .expect("complete");
                assert!(
                    Request::decode(&f).is_err(),
                    "body cut at {cut} must not decode"
                );
            }
        }
    }
}

#[test]
fn limits_are_errors_before_anything_is_allocated() {
    let mut d = FrameDecoder::new(1 << 20);
    d.push(&((2u32 << 20).to_le_bytes()));
    assert_eq!(
        d.next_frame(),
        Err(ProtoError::FrameTooLarge(2 << 20, 1 << 20))
    );
    let mut d = FrameDecoder::new(1 << 20);
    d.push(&5u32.to_le_bytes());
    assert_eq!(d.next_frame(), Err(ProtoError::FrameTooShort(5)));
    let frame = |op: u8, body: &[u8]| {
        let mut w = Vec::new();
        w.extend_from_slice(&((HEADER_BYTES + body.len()) as u32).to_le_bytes());
        w.push(op);
        w.extend_from_slice(&[0; 11]);
        w.extend_from_slice(body);
        let mut d = FrameDecoder::new(FRAME_BYTES_MAX);
        d.push(&w);
        d.next_frame()
    };
    assert_eq!(frame(99, &[]), Err(ProtoError::UnknownOp(99)));
    let get = |body: &[u8]| Request::decode(&frame(Op::Get as u8, body).unwrap().unwrap());
    assert_eq!(get(&[0]), Err(ProtoError::BadNamespace(0)));
    assert_eq!(
        get(&[1, b'a', 1, 0, 0, 0, 0]),
        Err(ProtoError::BadKeyLength(0))
    );
    assert_eq!(
        get(&[1, b'a', 1, 0, 0, 0, 129]),
        Err(ProtoError::BadKeyLength(129))
    );
    assert_eq!(
        get(&[1, b'a', 0xff, 0xff, 0, 0]),
        Err(ProtoError::TooManyEntries(0xffff))
    );
    assert_eq!(
        get(&[1, b'a', 0, 0, 0, 0, 9]),
        Err(ProtoError::Trailing(Op::Get, 1))
    );
    // A put entry announcing a block over the limit.
    let mut body = vec![1, b'a', 0, 1, 0, 0, 0, 1, b'k', 0, 0, 0, 0];
    body.extend_from_slice(&((crate::BLOCK_BYTES_MAX as u32 + 1).to_le_bytes()));
    let put = Request::decode(&frame(Op::Put as u8, &body).unwrap().unwrap());
    assert_eq!(
        put,
        Err(ProtoError::BlockTooLarge(crate::BLOCK_BYTES_MAX as u32 + 1))
    );
    let push = Request::decode(&frame(Op::Push as u8, &[]).unwrap().unwrap());
    assert_eq!(push, Err(ProtoError::NotARequest(Op::Push)));
}

/// Random bytes, and valid frames with random bytes flipped: the decoder and both body
/// decoders never panic, and the decoder never holds more than one frame's worth.
#[test]
fn fuzz_the_decoder_with_random_and_mutated_frames() {
    let iters: u64 = std::env::var("CTXPOD_PROTO_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let mut r = rng(3);
    let limit = 1 << 20;
    let (mut frames_seen, mut errors) = (0u64, 0u64);
    for _ in 0..iters {
        let mut wire = if r.gen_bool(0.5) {
            request(&mut r).encode(r.gen()).to_vec()
        } else {
            let (p, op) = response(&mut r);
            p.encode(op, r.gen(), r.gen()).to_vec()
        };
        match r.gen_range(0..3) {
            0 => (0..r.gen_range(1..8)).for_each(|_| {
                let i = r.gen_range(0..wire.len());
                wire[i] ^= 1 << r.gen_range(0..8);
            }),
            1 => wire = (0..r.gen_range(0..64)).map(|_| r.gen()).collect(),
            _ => wire.truncate(r.gen_range(0..=wire.len())),
        }
        let mut d = FrameDecoder::new(limit);
        d.push(&wire);
        loop {
            assert!(d.buffered() <= wire.len());
            match d.next_frame() {
                Ok(Some(f)) => {
                    frames_seen += 1;
                    let _ = Request::decode(&f);
                    let _ = Response::decode(&f);
                }
                Ok(None) => break,
                Err(_) => {
                    errors += 1;
                    break;
                }
            }
        }
    }
    eprintln!(
        "{iters} fuzz inputs: {frames_seen} frames decoded, {errors} streams refused, 0 panics"
    );
}

/// The wire values of the enums CXP1 carries as one byte (PROTOCOL.md), and nothing else.
#[test]
fn one_byte_enums_decode_their_documented_values_only() {
    assert_eq!(Durability::from_u8(0), Some(Durability::Durable));
    assert_eq!(Durability::from_u8(1), Some(Durability::Fast));
    assert_eq!(Policy::from_u8(0), Some(Policy::BestEffort));
    assert_eq!(Policy::from_u8(1), Some(Policy::WaitComplete));
    assert_eq!(Policy::from_u8(2), Some(Policy::Timeout));
    assert_eq!(EventKind::from_u8(1), Some(EventKind::Stored));
    assert_eq!(EventKind::from_u8(2), Some(EventKind::Evicted));
    assert_eq!(EventKind::from_u8(3), Some(EventKind::Deleted));
    for v in 4..=255 {
        assert_eq!(Durability::from_u8(v), None);
        assert_eq!(Policy::from_u8(v), None);
        assert_eq!(EventKind::from_u8(v), None);
    }
    assert_eq!((Durability::from_u8(2), Policy::from_u8(3)), (None, None));
    assert_eq!(EventKind::from_u8(0), None);
}

/// The names the HTTP API, the configuration and the token files spell, both ways.
#[test]
fn named_enums_spell_and_parse_their_names() {
    fn spelled<T: Copy + PartialEq + std::fmt::Debug>(
        cases: &[(T, &'static str)],
        name: fn(T) -> &'static str,
        parse: fn(&str) -> Option<T>,
    ) {
        for &(v, n) in cases {
            assert_eq!((name(v), parse(n)), (n, Some(v)));
        }
    }
    use Durability as D;
    spelled(
        &[(D::Durable, "durable"), (D::Fast, "fast")],
        D::name,
        D::parse,
    );
    use EventKind as K;
    let k = [
        (K::Stored, "stored"),
        (K::Evicted, "evicted"),
        (K::Deleted, "deleted"),
    ];
    spelled(&k, K::name, K::parse);
    let r = [
        (Role::Admin, "admin"),
        (Role::TenantRw, "tenant-rw"),
        (Role::TenantRo, "tenant-ro"),
        (Role::Viewer, "viewer"),
    ];
    spelled(&r, Role::name, Role::parse);
    assert_eq!((Durability::parse("Fast"), Role::parse("")), (None, None));
}

#[test]
fn value_pieces_must_be_the_piece_at_their_offset() {
    let mb = 1u64 << 20;
    // A value over one record travels in extent pieces; one of at most 8 MiB in one.
    assert_eq!(check_value_piece(10 * mb + 5, 0, 4 << 20), Ok(()));
    assert_eq!(
        check_value_piece(10 * mb + 5, 8 * mb, (2 << 20) + 5),
        Ok(())
    );
    assert_eq!(check_value_piece(8 * mb, 0, 8 << 20), Ok(()));
    for (len, offset, got) in [
        (10 * mb, 0, 8 << 20), // a piece over an extent
        (10 * mb, 1, 4 << 20), // not at an extent boundary
        (10 * mb, 12 * mb, 1), // past the end
        (2 * mb, 0, 1 << 20),  // a small value in pieces
        (0, 0, 0),             // empty
        (crate::VALUE_BYTES_MAX + 1, 0, 4 << 20),
    ] {
        assert!(
            check_value_piece(len, offset, got).is_err(),
            "{len} {offset} {got}"
        );
    }
    // The flag of a GetValue answer's frame is in its header.
    let piece = Response::ValuePiece {
        value_len: 10,
        value_crc32c: 1,
        offset: 0,
        crc32c: crate::crc32c(b"hello"),
        data: Bytes::from_static(b"hello"),
    };
    let wire: Vec<u8> = piece
        .encode_parts_flagged(Op::GetValue, status::OK, 7, FLAG_MORE)
        .concat();
    let f = frames(&wire, &mut rng(1)).pop().expect("a frame");
    assert_eq!(f.header.flags, FLAG_MORE);
    assert_eq!(Response::decode(&f), Ok(piece));
}
