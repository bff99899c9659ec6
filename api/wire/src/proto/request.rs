//! Requests: their op, and their encoding and decoding (each length checked before use).

use super::codec::{Reader, Writer};
use super::*;

impl Request {
    pub fn op(&self) -> Op {
        match self {
            Request::Ping => Op::Ping,
            Request::Put { .. } => Op::Put,
            Request::Get { .. } => Op::Get,
            Request::Match { .. } => Op::Match,
            Request::Pin { .. } => Op::Pin,
            Request::Unpin { .. } => Op::Unpin,
            Request::RegisterRegion { .. } => Op::RegisterRegion,
            Request::Prefetch(_) => Op::Prefetch,
            Request::Cancel { .. } => Op::Cancel,
            Request::Subscribe { .. } => Op::Subscribe,
            Request::Auth { .. } => Op::Auth,
            Request::PutValue(_) => Op::PutValue,
            Request::GetValue { .. } => Op::GetValue,
        }
    }

    /// The whole frame, length prefix included.
    pub fn encode(&self, request_id: u64) -> Bytes {
        let hint = match self {
            Request::Put { entries, .. } => entries.iter().map(|e| e.data.len() + 140).sum(),
            Request::PutValue(v) => v.data.len() + 256,
            _ => 256,
        };
        let mut w = Writer::frame(self.op(), 0, request_id, hint);
        match self {
            Request::Ping => {}
            Request::Put {
                ns,
                durability,
                entries,
            } => {
                w.ns(ns);
                w.b.put_u8(*durability as u8);
                w.b.put_u32_le(entries.len() as u32);
                for e in entries {
                    w.key(&e.key);
                    w.b.put_u32_le(e.crc32c);
                    w.b.put_u32_le(e.data.len() as u32);
                    w.data(&e.data);
                }
            }
            Request::Get { ns, keys }
            | Request::Match { ns, keys }
            | Request::Unpin { ns, keys } => {
                w.ns(ns);
                w.keys(keys);
            }
            Request::Pin { ns, ttl_ms, keys } => {
                w.ns(ns);
                w.b.put_u64_le(*ttl_ms);
                w.keys(keys);
            }
            Request::RegisterRegion { region_id, bytes } => {
                w.b.put_u32_le(*region_id);
                w.b.put_u64_le(*bytes);
            }
            Request::Prefetch(p) => {
                w.ns(&p.ns);
                w.b.put_u32_le(p.region_id);
                w.b.put_u8(p.policy as u8);
                w.b.put_u32_le(p.deadline_ms);
                w.b.put_u32_le(p.lease_ms);
                w.b.put_u32_le(p.entries.len() as u32);
                for e in &p.entries {
                    w.key(&e.key);
                    w.b.put_u64_le(e.offset);
                    w.b.put_u32_le(e.max_len);
                }
            }
            Request::Cancel { ticket } => w.b.put_u64_le(*ticket),
            Request::Subscribe { ns } => w.ns(ns),
            Request::Auth { token } => {
                w.b.put_u16_le(token.len() as u16);
                w.b.put_slice(token);
            }
            Request::PutValue(v) => {
                w.b.put_u64_le(v.offset);
                w.b.put_u64_le(v.len);
                w.b.put_u32_le(v.crc32c);
                w.b.put_u8(v.durability as u8);
                w.ns(&v.ns);
                w.key(&v.key);
                w.b.put_slice(&v.data);
            }
            Request::GetValue {
                ns,
                key,
                offset,
                len,
            } => {
                w.ns(ns);
                w.key(key);
                w.b.put_u64_le(*offset);
                w.b.put_u64_le(*len);
            }
        }
        w.finish()
    }

    /// The same frame as [`Request::encode`], in pieces that reference block data instead
    /// of copying it: written one after the other (or vectored), they are the frame.
    pub fn encode_parts(&self, request_id: u64) -> Vec<Bytes> {
        if let Request::PutValue(v) = self {
            let head = Request::PutValue(ValuePiece {
                data: Bytes::new(),
                ..v.clone()
            })
            .encode(request_id);
            let mut head = BytesMut::from(&head[..]);
            let len = (head.len() - 4 + v.data.len()) as u32;
            head[..4].copy_from_slice(&len.to_le_bytes());
            return vec![head.freeze(), v.data.clone()];
        }
        let Request::Put {
            ns,
            durability,
            entries,
        } = self
        else {
            return vec![self.encode(request_id)];
        };
        let body: usize = 1
            + ns.len()
            + 1
            + 4
            + entries
                .iter()
                .map(|e| 1 + e.key.len() + 8 + e.data.len())
                .sum::<usize>();
        let mut w = BytesMut::with_capacity(4 + HEADER_BYTES + 64);
        w.put_u32_le((HEADER_BYTES + body) as u32);
        w.put_u8(Op::Put as u8);
        w.put_u8(0);
        w.put_u16_le(0);
        w.put_u64_le(request_id);
        w.put_u8(ns.len() as u8);
        w.put_slice(ns.as_bytes());
        w.put_u8(*durability as u8);
        w.put_u32_le(entries.len() as u32);
        let mut parts = Vec::with_capacity(2 * entries.len() + 1);
        for e in entries {
            w.put_u8(e.key.len() as u8);
            w.put_slice(&e.key);
            w.put_u32_le(e.crc32c);
            w.put_u32_le(e.data.len() as u32);
            parts.push(w.split().freeze());
            parts.push(e.data.clone());
        }
        if !w.is_empty() {
            parts.push(w.freeze());
        }
        parts
    }

    pub fn decode(frame: &Frame) -> Result<Request, ProtoError> {
        let op = frame.header.op;
        let mut r = Reader::new(frame);
        let req = match op {
            Op::Ping => Request::Ping,
            Op::Put => {
                // The node's own parser ([`PutBodyParser`]), over the body in memory.
                let (ns, durability, entries) = decode_put_body(&frame.body)?;
                r.b.advance(frame.body.len());
                Request::Put {
                    ns,
                    durability,
                    entries,
                }
            }
            Op::Get | Op::Match | Op::Unpin => {
                let (ns, keys) = (r.ns()?, r.keys()?);
                match op {
                    Op::Get => Request::Get { ns, keys },
                    Op::Match => Request::Match { ns, keys },
                    _ => Request::Unpin { ns, keys },
                }
            }
            Op::Pin => Request::Pin {
                ns: r.ns()?,
                ttl_ms: r.u64()?,
                keys: r.keys()?,
            },
            Op::RegisterRegion => Request::RegisterRegion {
                region_id: r.u32()?,
                bytes: r.u64()?,
            },
            // Fields in wire order: a struct literal evaluates them as written.
            Op::Prefetch => Request::Prefetch(PrefetchRequest {
                ns: r.ns()?,
                region_id: r.u32()?,
                policy: {
                    let p = r.u8()?;
                    Policy::from_u8(p).ok_or(ProtoError::BadPolicy(p))?
                },
                deadline_ms: r.u32()?,
                lease_ms: r.u32()?,
                entries: r.list(|r| {
                    Ok(PrefetchEntry {
                        key: r.key()?,
                        offset: r.u64()?,
                        max_len: r.u32()?,
                    })
                })?,
            }),
            Op::Cancel => Request::Cancel { ticket: r.u64()? },
            Op::Subscribe => Request::Subscribe { ns: r.ns()? },
            Op::Auth => {
                let n = r.u16()? as usize;
                if n == 0 || n > TOKEN_BYTES_MAX {
                    return Err(ProtoError::BadToken(n));
                }
                Request::Auth { token: r.bytes(n)? }
            }
            Op::PutValue => Request::PutValue(decode_value_piece(&mut r)?),
            Op::GetValue => Request::GetValue {
                ns: r.ns()?,
                key: r.key()?,
                offset: r.u64()?,
                len: r.u64()?,
            },
            op => return Err(ProtoError::NotARequest(op)),
        };
        r.end()?;
        Ok(req)
    }
}

/// A `PutValue` body: its fixed fields, namespace and key, then the piece's bytes (the
/// rest of the body), which must be the piece the value has at that offset.
fn decode_value_piece(r: &mut Reader) -> Result<ValuePiece, ProtoError> {
    let offset = r.u64()?;
    let len = r.u64()?;
    let crc32c = r.u32()?;
    let d = r.u8()?;
    let durability = Durability::from_u8(d).ok_or(ProtoError::BadDurability(d))?;
    let ns = r.ns()?;
    let key = r.key()?;
    check_value_piece(len, offset, r.b.remaining())?;
    let data = r.bytes(r.b.remaining())?;
    Ok(ValuePiece {
        ns,
        key,
        durability,
        len,
        crc32c,
        offset,
        data,
    })
}

/// Whether `got` bytes at `offset` are the piece a value of `len` bytes has there.
pub fn check_value_piece(len: u64, offset: u64, got: usize) -> Result<(), ProtoError> {
    if len == 0 || len > crate::VALUE_BYTES_MAX {
        return Err(ProtoError::BadValueLength(len));
    }
    let want = crate::value_piece_len(len, offset);
    let aligned = offset.is_multiple_of(crate::EXTENT_BYTES as u64) || offset == 0;
    if want == 0 || got != want || !aligned {
        return Err(ProtoError::BadPiece {
            len,
            offset,
            got,
            want,
        });
    }
    Ok(())
}
