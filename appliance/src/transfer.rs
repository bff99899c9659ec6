//! The CXP1 transfer listener (`api/PROTOCOL.md`): pipelined PUT / GET / MATCH / PIN /
//! UNPIN over one TCP connection, answered out of order. Memory regions, prefetch and push
//! are not served yet (answered with an error; issue #4).
//!
//! Bounds: one connection decodes at most one frame of `max_frame_bytes` at a time, runs at
//! most [`INFLIGHT_PER_CONNECTION`] requests (more are answered BUSY), and stops reading its
//! socket while its responses wait to be written — a client that never reads only stalls
//! itself. Request bodies count against the node's ingest byte budget, like HTTP bodies.

use crate::engine::{Engine, EngineError, PutStatus, StagedBlock};
use bytes::Bytes;
use bytes::{Buf, BytesMut};
use ctxpod_api::proto::{
    status, Frame, GetEntry, Header, Hello, Op, ProtoError, Request, Response, HEADER_BYTES,
    HELLO_BYTES, NAMESPACE_BYTES_MAX, VERSION,
};
use ctxpod_api::Durability;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// Requests one connection runs at once; more are answered BUSY.
pub const INFLIGHT_PER_CONNECTION: usize = 32;
/// Largest frame this node accepts and announces.
pub const MAX_FRAME_BYTES: u32 = ctxpod_api::proto::FRAME_BYTES_MAX;
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections until the task is dropped.
pub async fn serve(listener: TcpListener, engine: Arc<Engine>, ingest: Arc<Semaphore>) {
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("transfer listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (engine, ingest) = (engine.clone(), ingest.clone());
        tokio::spawn(async move {
            if let Err(e) = connection(sock, engine, ingest).await {
                tracing::debug!(%peer, "transfer connection closed: {e}");
            }
        });
    }
}

async fn connection(
    sock: TcpStream,
    engine: Arc<Engine>,
    ingest: Arc<Semaphore>,
) -> anyhow::Result<()> {
    sock.set_nodelay(true)?;
    let (mut rd, mut wr) = sock.into_split();
    let mut hello = [0u8; HELLO_BYTES];
    tokio::time::timeout(HELLO_TIMEOUT, rd.read_exact(&mut hello)).await??;
    let peer = Hello::decode(&hello)?;
    let ours = Hello {
        version: VERSION,
        flags: 0,
        max_frame_bytes: MAX_FRAME_BYTES,
    };
    wr.write_all(&ours.encode()).await?;
    let peer_max = peer.max_frame_bytes.min(MAX_FRAME_BYTES) as usize;
    let (tx, mut rx) = mpsc::channel::<Bytes>(INFLIGHT_PER_CONNECTION);
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if wr.write_all(&frame).await.is_err() {
                break;
            }
        }
    });
    let inflight = Arc::new(Semaphore::new(INFLIGHT_PER_CONNECTION));
    let mut input = Input {
        rd,
        buf: BytesMut::with_capacity(256 << 10),
    };
    let result: anyhow::Result<()> = loop {
        // A framing error (over the limit, unknown op) ends the connection: its byte stream
        // can no longer be trusted.
        match input.fill(4).await {
            Ok(true) => {}
            Ok(false) => break Ok(()),
            Err(e) => break Err(e.into()),
        }
        let len = u32::from_le_bytes(input.buf[..4].try_into().expect("4 bytes"));
        if len > MAX_FRAME_BYTES {
            break Err(ProtoError::FrameTooLarge(len, MAX_FRAME_BYTES).into());
        }
        if (len as usize) < HEADER_BYTES {
            break Err(ProtoError::FrameTooShort(len).into());
        }
        if let Err(e) = input.fill(4 + HEADER_BYTES).await {
            break Err(e.into());
        }
        let Some(op) = Op::from_u8(input.buf[4]) else {
            break Err(ProtoError::UnknownOp(input.buf[4]).into());
        };
        let id = u64::from_le_bytes(input.buf[8..16].try_into().expect("8 bytes"));
        input.buf.advance(4 + HEADER_BYTES);
        let body_len = len as usize - HEADER_BYTES;
        let slot = inflight.clone().try_acquire_owned();
        let budget = ingest
            .clone()
            .try_acquire_many_owned(body_len.max(1) as u32);
        let (Ok(slot), Ok(budget)) = (slot, budget) else {
            if let Err(e) = input.skip(body_len).await {
                break Err(e.into());
            }
            let f = Response::Error("busy: too many requests in flight, retry later".into())
                .encode(op, status::BUSY, id);
            if tx.send(f).await.is_err() {
                break Ok(());
            }
            continue;
        };
        // PUT bodies are received straight into their records' buffers; other requests
        // are small and decoded whole.
        let req = if op == Op::Put {
            match read_put(&mut input, body_len).await {
                Ok(Ok(put)) => Parsed::Put(put),
                Ok(Err(e)) => Parsed::Bad(e),
                Err(e) => break Err(e.into()),
            }
        } else {
            if let Err(e) = input.fill(body_len).await {
                break Err(e.into());
            }
            let frame = Frame {
                header: Header {
                    op,
                    flags: 0,
                    status: 0,
                    request_id: id,
                },
                body: input.buf.split_to(body_len).freeze(),
            };
            match Request::decode(&frame) {
                Ok(r) => Parsed::Other(r),
                Err(e) => Parsed::Bad(e),
            }
        };
        let (engine, tx) = (engine.clone(), tx.clone());
        tokio::spawn(async move {
            let f = match req {
                Parsed::Put(p) => handle_put(&engine, p, op, id).await,
                Parsed::Other(r) => handle(&engine, r, op, id, peer_max).await,
                Parsed::Bad(e) => {
                    Response::Error(e.to_string()).encode(op, status::BAD_REQUEST, id)
                }
            };
            drop(budget);
            let _ = tx.send(f).await;
            drop(slot);
        });
    };
    drop(tx);
    let _ = writer.await;
    result
}

fn code(e: &EngineError) -> u16 {
    crate::server::status_of(e).0.as_u16()
}

async fn handle(engine: &Engine, req: Request, op: Op, id: u64, peer_max: usize) -> Bytes {
    let fail = |e: &EngineError| Response::Error(e.to_string()).encode(op, code(e), id);
    match req {
        Request::Ping => Response::Pong.encode(op, status::OK, id),
        // PUT bodies never get here: `read_put` stages them as they arrive.
        Request::Put { .. } => {
            Response::Error("internal: PUT decoded whole".into()).encode(op, status::INTERNAL, id)
        }
        Request::Get { ns, keys } => {
            let results = futures::future::join_all(keys.iter().map(|k| engine.get(&ns, k))).await;
            // The response must fit the client's frame limit: blocks past it answer 413 and
            // are fetched again in a smaller batch.
            let mut room = peer_max.saturating_sub(64 + keys.len() * 10);
            let out = results
                .into_iter()
                .map(|r| match r {
                    Ok(Some((b, crc))) if b.len() <= room => {
                        room -= b.len();
                        GetEntry {
                            status: status::OK,
                            crc32c: crc,
                            data: b,
                        }
                    }
                    Ok(Some(_)) => entry(status::TOO_LARGE),
                    Ok(None) => entry(status::NOT_FOUND),
                    Err(e) => entry(code(&e)),
                })
                .collect();
            Response::Get(out).encode(op, status::OK, id)
        }
        Request::Match { ns, keys } => {
            match engine
                .match_prefix(&ns, keys.iter().map(|k| k.to_vec()).collect())
                .await
            {
                Ok(n) => Response::Count(n as u32).encode(op, status::OK, id),
                Err(e) => fail(&e),
            }
        }
        Request::Pin { ns, ttl_ms, keys } => {
            let ttl = Duration::from_millis(ttl_ms.min(ctxpod_api::LEASE_MS_MAX));
            match engine
                .pin(&ns, keys.iter().map(|k| k.to_vec()).collect(), ttl)
                .await
            {
                Ok(n) => Response::Count(n as u32).encode(op, status::OK, id),
                Err(e) => fail(&e),
            }
        }
        Request::Unpin { ns, keys } => {
            match engine
                .unpin(&ns, keys.iter().map(|k| k.to_vec()).collect())
                .await
            {
                Ok(n) => Response::Count(n as u32).encode(op, status::OK, id),
                Err(e) => fail(&e),
            }
        }
        Request::RegisterRegion { .. } | Request::Prefetch { .. } | Request::Cancel { .. } => {
            Response::Error("memory regions and prefetch are not served by this node yet".into())
                .encode(op, status::BAD_REQUEST, id)
        }
    }
}

fn entry(status: u16) -> GetEntry {
    GetEntry {
        status,
        crc32c: 0,
        data: Bytes::new(),
    }
}

/// The read side of a connection: a buffer in front of the socket, from which bodies can
/// also be received straight into their destination.
struct Input {
    rd: OwnedReadHalf,
    buf: BytesMut,
}

impl Input {
    /// At least `n` bytes buffered; false if the peer closed cleanly before any of them.
    async fn fill(&mut self, n: usize) -> std::io::Result<bool> {
        while self.buf.len() < n {
            self.buf.reserve(n - self.buf.len());
            let empty = self.buf.is_empty();
            if self.rd.read_buf(&mut self.buf).await? == 0 {
                return if empty {
                    Ok(false)
                } else {
                    Err(std::io::ErrorKind::UnexpectedEof.into())
                };
            }
        }
        Ok(true)
    }

    /// Fills `dst`: first from the buffer, then from the socket directly into `dst`.
    async fn read_into(&mut self, dst: &mut [u8]) -> std::io::Result<()> {
        let n = self.buf.len().min(dst.len());
        dst[..n].copy_from_slice(&self.buf[..n]);
        self.buf.advance(n);
        if n < dst.len() {
            self.rd.read_exact(&mut dst[n..]).await?;
        }
        Ok(())
    }

    async fn skip(&mut self, mut n: usize) -> std::io::Result<()> {
        let mut sink = vec![0u8; (64 << 10).min(n)];
        while n > 0 {
            let k = n.min(sink.len());
            self.read_into(&mut sink[..k]).await?;
            n -= k;
        }
        Ok(())
    }

    async fn take(&mut self, n: usize) -> std::io::Result<Bytes> {
        self.fill(n).await?;
        Ok(self.buf.split_to(n).freeze())
    }
}

enum Parsed {
    Put(StagedPut),
    Other(Request),
    Bad(ProtoError),
}

struct StagedPut {
    ns: String,
    durability: Durability,
    entries: Vec<(Bytes, u32, StagedBlock)>,
}

/// Receives a PUT body of `len` bytes, each block straight into the buffer its record will
/// be written from. `Ok(Err(_))`: the body was consumed but is malformed (the connection
/// goes on); `Err(_)`: the connection failed, or the body does not fit its frame.
async fn read_put(input: &mut Input, len: usize) -> std::io::Result<Result<StagedPut, ProtoError>> {
    let bad = |e: ProtoError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let mut left = len;
    let take = async |input: &mut Input, n: usize, left: &mut usize| {
        if n > *left {
            return Err(bad(ProtoError::Truncated(Op::Put)));
        }
        *left -= n;
        input.take(n).await
    };
    let n = take(input, 1, &mut left).await?[0] as usize;
    if n == 0 || n > NAMESPACE_BYTES_MAX {
        input.skip(left).await?;
        return Ok(Err(ProtoError::BadNamespace(n)));
    }
    let Ok(ns) = String::from_utf8(take(input, n, &mut left).await?.to_vec()) else {
        input.skip(left).await?;
        return Ok(Err(ProtoError::BadNamespace(n)));
    };
    let durability = match take(input, 1, &mut left).await?[0] {
        0 => Durability::Durable,
        1 => Durability::Fast,
        d => {
            input.skip(left).await?;
            return Ok(Err(ProtoError::BadDurability(d)));
        }
    };
    let count = take(input, 4, &mut left).await?.get_u32_le() as usize;
    if count > ctxpod_api::BATCH_ENTRIES_MAX {
        input.skip(left).await?;
        return Ok(Err(ProtoError::TooManyEntries(count)));
    }
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        let k = take(input, 1, &mut left).await?[0] as usize;
        if k == 0 || k > ctxpod_api::KEY_BYTES_MAX {
            input.skip(left).await?;
            return Ok(Err(ProtoError::BadKeyLength(k)));
        }
        let key = take(input, k, &mut left).await?;
        let mut h = take(input, 8, &mut left).await?;
        let (crc, n) = (h.get_u32_le(), h.get_u32_le());
        if n as usize > left {
            return Err(bad(ProtoError::Truncated(Op::Put)));
        }
        let mut staged = match StagedBlock::new(n as usize) {
            Ok(s) => s,
            Err(_) => {
                input.skip(left).await?;
                return Ok(Err(ProtoError::BlockTooLarge(n)));
            }
        };
        input.read_into(staged.unfilled_mut()).await?;
        staged.advance(n as usize);
        left -= n as usize;
        entries.push((key, crc, staged));
    }
    if left > 0 {
        input.skip(left).await?;
        return Ok(Err(ProtoError::Trailing(Op::Put, left)));
    }
    Ok(Ok(StagedPut {
        ns,
        durability,
        entries,
    }))
}

async fn handle_put(engine: &Engine, p: StagedPut, op: Op, id: u64) -> Bytes {
    let StagedPut {
        ns,
        durability,
        entries,
    } = p;
    let crcs: Vec<u32> = entries.iter().map(|e| e.1).collect();
    let results = futures::future::join_all(entries.into_iter().map(|(key, crc, staged)| {
        let ns = &ns;
        async move {
            engine
                .put_staged(ns, &key, staged, Some(crc), durability)
                .await
        }
    }))
    .await;
    let out = results
        .iter()
        .zip(crcs)
        .map(|(r, crc)| match r {
            Ok(PutStatus::Created) => (status::CREATED, crc),
            Ok(PutStatus::Exists) => (status::OK, crc),
            Err(err) => (code(err), 0),
        })
        .collect();
    Response::Put(out).encode(op, status::OK, id)
}
