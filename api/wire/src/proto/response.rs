//! Responses: their encoding (block data referenced, not copied) and decoding.

use super::codec::{Reader, Writer};
use super::*;

impl Response {
    pub fn op(&self) -> Op {
        match self {
            Response::Pong => Op::Ping,
            Response::Put(_) => Op::Put,
            Response::Get(_) => Op::Get,
            Response::Count(_) => Op::Match,
            Response::RegionRegistered => Op::RegisterRegion,
            Response::Ticket(_) => Op::Prefetch,
            Response::Push { .. } => Op::Push,
            Response::PrefetchDone { .. } => Op::PrefetchDone,
            Response::Cancelled => Op::Cancel,
            Response::Events { .. } => Op::Event,
            Response::Error(_) => Op::Error,
            Response::Authenticated { .. } => Op::Auth,
            Response::ValueStored { .. } => Op::PutValue,
            Response::ValuePiece { .. } => Op::GetValue,
        }
    }

    /// The whole frame. `op` is the request's op (it tells `Count` answers to `Match`, `Pin`
    /// and `Unpin` apart; an `Error` is always sent as op `Error`); `status` is the frame's
    /// (OK, or why the request failed as a whole).
    pub fn encode(&self, op: Op, status: u16, request_id: u64) -> Bytes {
        self.writer(op, status, request_id, false).finish()
    }

    /// [`Response::encode_parts`] with header flags ([`FLAG_MORE`]).
    pub fn encode_parts_flagged(
        &self,
        op: Op,
        status: u16,
        request_id: u64,
        flags: u8,
    ) -> Vec<Bytes> {
        let mut w = self.writer(op, status, request_id, true);
        match w.first.as_mut() {
            Some(first) => first[5] = flags,
            None => w.b[5] = flags,
        }
        w.finish_parts()
    }

    /// The same frame as [`Response::encode`], in pieces that reference block data instead
    /// of copying it.
    pub fn encode_parts(&self, op: Op, status: u16, request_id: u64) -> Vec<Bytes> {
        self.writer(op, status, request_id, true).finish_parts()
    }

    fn writer(&self, op: Op, status: u16, request_id: u64, by_ref: bool) -> Writer {
        let hint = match self {
            Response::Get(es) => es.iter().map(|e| e.data.len() + 10).sum(),
            Response::Push { data, .. } | Response::ValuePiece { data, .. } => data.len() + 32,
            _ => 64,
        };
        // An error travels as op `Error` whatever the request was.
        let op = if matches!(self, Response::Error(_)) {
            Op::Error
        } else {
            op
        };
        let mut w = Writer::frame(op, status, request_id, if by_ref { 64 } else { hint });
        w.by_ref = by_ref;
        match self {
            Response::Pong | Response::RegionRegistered | Response::Cancelled => {}
            Response::Put(es) => {
                w.b.put_u32_le(es.len() as u32);
                for (s, crc) in es {
                    w.b.put_u16_le(*s);
                    w.b.put_u32_le(*crc);
                }
            }
            Response::Get(es) => {
                w.b.put_u32_le(es.len() as u32);
                for e in es {
                    w.b.put_u16_le(e.status);
                    w.b.put_u32_le(e.crc32c);
                    w.b.put_u32_le(e.data.len() as u32);
                    w.data(&e.data);
                }
            }
            Response::Count(n) => w.b.put_u32_le(*n),
            Response::Ticket(t) => w.b.put_u64_le(*t),
            Response::Push {
                index,
                status,
                crc32c,
                offset,
                data,
            } => {
                w.b.put_u32_le(*index);
                w.b.put_u16_le(*status);
                w.b.put_u32_le(*crc32c);
                w.b.put_u64_le(*offset);
                w.b.put_u32_le(data.len() as u32);
                w.data(data);
            }
            Response::PrefetchDone { pushed, missed } => {
                w.b.put_u32_le(*pushed);
                w.b.put_u32_le(*missed);
            }
            Response::Events { lost, events } => {
                w.b.put_u64_le(*lost);
                w.b.put_u32_le(events.len() as u32);
                for (kind, key) in events {
                    w.b.put_u8(*kind as u8);
                    w.key(key);
                }
            }
            Response::Error(msg) => {
                let m = &msg.as_bytes()[..msg.len().min(1024)];
                w.b.put_u16_le(m.len() as u16);
                w.b.put_slice(m);
            }
            Response::Authenticated { role, tenant } => {
                w.b.put_u8(*role as u8);
                w.ns(tenant);
            }
            Response::ValueStored { crc32c } => w.b.put_u32_le(*crc32c),
            Response::ValuePiece {
                value_len,
                value_crc32c,
                offset,
                crc32c,
                data,
            } => {
                w.b.put_u64_le(*value_len);
                w.b.put_u32_le(*value_crc32c);
                w.b.put_u64_le(*offset);
                w.b.put_u32_le(*crc32c);
                w.b.put_u32_le(data.len() as u32);
                w.data(data);
            }
        }
        w
    }

    pub fn decode(frame: &Frame) -> Result<Response, ProtoError> {
        let op = frame.header.op;
        let mut r = Reader::new(frame);
        let resp = match op {
            Op::Ping => Response::Pong,
            Op::RegisterRegion => Response::RegionRegistered,
            Op::Cancel => Response::Cancelled,
            Op::Put => Response::Put(r.list(|r| Ok((r.u16()?, r.u32()?)))?),
            Op::Get => Response::Get(r.list(|r| {
                Ok(GetEntry {
                    status: r.u16()?,
                    crc32c: r.u32()?,
                    data: r.block()?,
                })
            })?),
            Op::Match | Op::Pin | Op::Unpin => Response::Count(r.u32()?),
            Op::Prefetch | Op::Subscribe => Response::Ticket(r.u64()?),
            Op::Push => Response::Push {
                index: r.u32()?,
                status: r.u16()?,
                crc32c: r.u32()?,
                offset: r.u64()?,
                data: r.block()?,
            },
            Op::PrefetchDone => Response::PrefetchDone {
                pushed: r.u32()?,
                missed: r.u32()?,
            },
            Op::Event => Response::Events {
                lost: r.u64()?,
                events: r.list(|r| {
                    let k = r.u8()?;
                    let kind = EventKind::from_u8(k).ok_or(ProtoError::BadEventKind(k))?;
                    Ok((kind, r.key()?))
                })?,
            },
            Op::Error => {
                let n = r.u16()? as usize;
                let m = r.bytes(n)?;
                Response::Error(String::from_utf8_lossy(&m).into_owned())
            }
            Op::Auth => {
                let r8 = r.u8()?;
                Response::Authenticated {
                    role: Role::from_u8(r8).ok_or(ProtoError::BadRole(r8))?,
                    tenant: r.name()?,
                }
            }
            Op::PutValue => Response::ValueStored { crc32c: r.u32()? },
            Op::GetValue => Response::ValuePiece {
                value_len: r.u64()?,
                value_crc32c: r.u32()?,
                offset: r.u64()?,
                crc32c: r.u32()?,
                data: r.block()?,
            },
        };
        r.end()?;
        Ok(resp)
    }
}
