//! A CXP1 client (first part of issue #4): requests pipelined by id on one connection and
//! answered in any order, a request refused BUSY retried with exponential backoff, CRC32C
//! computed on puts and checked on gets; [`TransferPool`] spreads requests over several
//! connections. Memory regions and prefetch come later.

use crate::proto::{
    self, status, Durability, FrameDecoder, GetEntry, Hello, Op, PutEntry, Request, Response,
    HELLO_BYTES,
};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] proto::ProtoError),
    #[error("the connection closed")]
    Closed,
    #[error("the node refused the request (status {status}): {message}")]
    Refused { status: u16, message: String },
    #[error("block {0} came back with a CRC32C that does not match its bytes")]
    Corrupt(usize),
    #[error("unexpected response {0:?}")]
    Unexpected(Op),
}

type Pending = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<(u16, Response)>>>>>;

pub struct TransferClient {
    wr: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
    busy_retries: AtomicU64,
}

/// Attempts of a request the node answers BUSY (with backoff 1, 2, 4, … 256 ms between:
/// about 4 s in all).
pub const BUSY_ATTEMPTS: u32 = 20;

impl Drop for TransferClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl TransferClient {
    pub async fn connect(addr: &str) -> Result<TransferClient, TransferError> {
        let sock = TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        let (mut rd, mut wr) = sock.into_split();
        let ours = Hello {
            version: proto::VERSION,
            flags: 0,
            max_frame_bytes: proto::FRAME_BYTES_MAX,
        };
        wr.write_all(&ours.encode()).await?;
        let mut h = [0u8; HELLO_BYTES];
        rd.read_exact(&mut h).await?;
        Hello::decode(&h)?;
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let p2 = pending.clone();
        let reader = tokio::spawn(async move {
            let mut dec = FrameDecoder::new(proto::FRAME_BYTES_MAX);
            let mut buf = vec![0u8; 256 << 10];
            'read: loop {
                loop {
                    match dec.next_frame() {
                        Ok(Some(f)) => {
                            let Ok(resp) = Response::decode(&f) else {
                                break 'read;
                            };
                            let tx = p2
                                .lock()
                                .expect("pending map")
                                .as_mut()
                                .and_then(|m| m.remove(&f.header.request_id));
                            if let Some(tx) = tx {
                                let _ = tx.send((f.header.status, resp));
                            }
                        }
                        Ok(None) => break,
                        Err(_) => break 'read,
                    }
                }
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => dec.push(&buf[..n]),
                }
            }
            // Every request still waiting learns that the connection is gone.
            p2.lock().expect("pending map").take();
        });
        Ok(TransferClient {
            wr: tokio::sync::Mutex::new(wr),
            pending,
            next_id: AtomicU64::new(1),
            reader,
            busy_retries: AtomicU64::new(0),
        })
    }

    /// Requests sent again because the node answered BUSY.
    pub fn busy_retries(&self) -> u64 {
        self.busy_retries.load(Ordering::Relaxed)
    }

    /// One request, retried with exponential backoff while the node answers BUSY.
    async fn call(&self, req: &Request) -> Result<Response, TransferError> {
        let mut backoff = std::time::Duration::from_millis(1);
        for attempt in 1..=BUSY_ATTEMPTS {
            match self.call_once(req).await {
                Err(TransferError::Refused { status, .. })
                    if status == status::BUSY && attempt < BUSY_ATTEMPTS =>
                {
                    self.busy_retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(std::time::Duration::from_millis(256));
                }
                r => return r,
            }
        }
        unreachable!("the last attempt returns")
    }

    async fn call_once(&self, req: &Request) -> Result<Response, TransferError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match self.pending.lock().expect("pending map").as_mut() {
            Some(m) => m.insert(id, tx),
            None => return Err(TransferError::Closed),
        };
        // Block data is written from the caller's buffers, not copied into a frame.
        let parts = req.encode_parts(id);
        let mut wr = self.wr.lock().await;
        for p in &parts {
            wr.write_all(p).await?;
        }
        drop(wr);
        let (st, resp) = rx.await.map_err(|_| TransferError::Closed)?;
        match resp {
            Response::Error(message) => Err(TransferError::Refused {
                status: st,
                message,
            }),
            r => Ok(r),
        }
    }

    pub async fn ping(&self) -> Result<(), TransferError> {
        match self.call(&Request::Ping).await? {
            Response::Pong => Ok(()),
            r => Err(TransferError::Unexpected(r.op())),
        }
    }

    /// Stores blocks; per block, the status (201 stored, 200 already there, 409, 422, 503,
    /// 507, …).
    pub async fn put(
        &self,
        ns: &str,
        blocks: &[(Bytes, Bytes)],
        durability: Durability,
    ) -> Result<Vec<u16>, TransferError> {
        let entries = blocks
            .iter()
            .map(|(k, d)| PutEntry {
                key: k.clone(),
                crc32c: crate::crc32c(d),
                data: d.clone(),
            })
            .collect();
        let req = Request::Put {
            ns: ns.into(),
            durability,
            entries,
        };
        match self.call(&req).await? {
            Response::Put(es) => Ok(es.into_iter().map(|(s, _)| s).collect()),
            r => Err(TransferError::Unexpected(r.op())),
        }
    }

    /// Blocks by key: `Some(bytes)` (CRC32C checked) or `None` for a miss.
    pub async fn get(&self, ns: &str, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, TransferError> {
        let req = Request::Get {
            ns: ns.into(),
            keys: keys.to_vec(),
        };
        let es = match self.call(&req).await? {
            Response::Get(es) => es,
            r => return Err(TransferError::Unexpected(r.op())),
        };
        es.into_iter()
            .enumerate()
            .map(
                |(
                    i,
                    GetEntry {
                        status: s,
                        crc32c,
                        data,
                    },
                )| match s {
                    status::OK if crate::crc32c(&data) == crc32c => Ok(Some(data)),
                    status::OK => Err(TransferError::Corrupt(i)),
                    status::NOT_FOUND => Ok(None),
                    s => Err(TransferError::Refused {
                        status: s,
                        message: format!("block {i}"),
                    }),
                },
            )
            .collect()
    }

    /// How many leading keys of the chain the node holds.
    pub async fn match_prefix(&self, ns: &str, chain: &[Bytes]) -> Result<u32, TransferError> {
        let req = Request::Match {
            ns: ns.into(),
            keys: chain.to_vec(),
        };
        match self.call(&req).await? {
            Response::Count(n) => Ok(n),
            r => Err(TransferError::Unexpected(r.op())),
        }
    }
}

/// Several connections to one node, used round robin.
pub struct TransferPool {
    conns: Vec<TransferClient>,
    next: AtomicU64,
}

impl TransferPool {
    pub async fn connect(addr: &str, connections: usize) -> Result<TransferPool, TransferError> {
        let mut conns = Vec::with_capacity(connections.max(1));
        for _ in 0..connections.max(1) {
            conns.push(TransferClient::connect(addr).await?);
        }
        Ok(TransferPool {
            conns,
            next: AtomicU64::new(0),
        })
    }

    /// The next connection, round robin.
    pub fn conn(&self) -> &TransferClient {
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize % self.conns.len();
        &self.conns[i]
    }

    pub fn busy_retries(&self) -> u64 {
        self.conns.iter().map(|c| c.busy_retries()).sum()
    }
}
