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
use ctxpod_api::proto::{
    status, FrameDecoder, GetEntry, Hello, Op, Request, Response, HELLO_BYTES, VERSION,
};
use ctxpod_api::Durability;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
    let mut dec = FrameDecoder::new(MAX_FRAME_BYTES);
    let mut buf = vec![0u8; 256 << 10];
    let result = loop {
        // A framing error (over the limit, unknown op) ends the connection: its byte stream
        // can no longer be trusted.
        let frame = match dec.next_frame() {
            Ok(Some(f)) => f,
            Ok(None) => match rd.read(&mut buf).await {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    dec.push(&buf[..n]);
                    continue;
                }
                Err(e) => break Err(e.into()),
            },
            Err(e) => break Err(e.into()),
        };
        let (op, id) = (frame.header.op, frame.header.request_id);
        let req = match Request::decode(&frame) {
            Ok(r) => r,
            Err(e) => {
                let f = Response::Error(e.to_string()).encode(op, status::BAD_REQUEST, id);
                if tx.send(f).await.is_err() {
                    break Ok(());
                }
                continue;
            }
        };
        let bytes = frame.body.len().max(1) as u32;
        let permits = (
            inflight.clone().try_acquire_owned(),
            ingest.clone().try_acquire_many_owned(bytes),
        );
        let (Ok(slot), Ok(budget)) = permits else {
            let f = Response::Error("busy: too many requests in flight, retry later".into())
                .encode(op, status::BUSY, id);
            if tx.send(f).await.is_err() {
                break Ok(());
            }
            continue;
        };
        drop(frame);
        let (engine, tx) = (engine.clone(), tx.clone());
        tokio::spawn(async move {
            let f = handle(&engine, req, op, id, peer_max).await;
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
        Request::Put {
            ns,
            durability,
            entries,
        } => {
            let d = match durability {
                ctxpod_api::proto::Durability::Durable => Durability::Durable,
                ctxpod_api::proto::Durability::Fast => Durability::Fast,
            };
            let results = futures::future::join_all(entries.iter().map(|e| {
                let ns = &ns;
                async move {
                    let staged = StagedBlock::copy_of(&e.data)?;
                    engine
                        .put_staged(ns, &e.key, staged, Some(e.crc32c), d)
                        .await
                }
            }))
            .await;
            let out = results
                .iter()
                .zip(&entries)
                .map(|(r, e)| match r {
                    Ok(PutStatus::Created) => (status::CREATED, e.crc32c),
                    Ok(PutStatus::Exists) => (status::OK, e.crc32c),
                    Err(err) => (code(err), 0),
                })
                .collect();
            Response::Put(out).encode(op, status::OK, id)
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
