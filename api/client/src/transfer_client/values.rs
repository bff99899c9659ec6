//! Values of any size (`api/PROTOCOL.md`, "Values"): [`TransferClient::put_value`] sends a
//! value as `PutValue` pieces (frames of at most one extent, written from the caller's
//! buffer), [`TransferClient::get_value`] receives a `GetValue` answer piece by piece, each
//! read from the socket straight into its place in the value and checked (its CRC32C, and
//! the whole value's when the whole value was asked).

use super::*;
use ctxpod_wire::proto::{ValuePiece, FLAG_MORE, VALUE_PIECE_HEAD_BYTES};

/// A `GetValue` answer being received: its bytes so far and who waits for them.
pub(crate) struct ValueSink {
    state: Mutex<SinkState>,
    /// Bytes landed so far: what the waiter's deadline counts as progress.
    landed: AtomicU64,
}

struct SinkState {
    /// The range asked: its start, its end (`u64::MAX`: to the value's end).
    start: u64,
    end: u64,
    /// The most bytes this client takes in one value.
    limit: u64,
    /// The value's bytes (allocated at its first piece), out while a piece lands.
    buf: Option<Vec<u8>>,
    next: u64,
    /// CRC32C of what landed so far.
    crc: u32,
    done: Option<oneshot::Sender<Result<Landed, TransferError>>>,
}

/// A value received whole: its buffer and how many of its first bytes are the value.
type Landed = (Vec<u8>, usize);

impl ValueSink {
    /// A sink for bytes `start..end` of a value, landed in `buf` (the caller's; grown when
    /// it is shorter than the value) or, when `None`, in a recycled buffer.
    fn new(
        (start, end): (u64, u64),
        limit: u64,
        buf: Option<Vec<u8>>,
    ) -> (
        Arc<ValueSink>,
        oneshot::Receiver<Result<Landed, TransferError>>,
    ) {
        let (tx, rx) = oneshot::channel();
        let sink = ValueSink {
            state: Mutex::new(SinkState {
                start,
                end,
                limit,
                buf,
                next: start,
                crc: 0,
                done: Some(tx),
            }),
            landed: AtomicU64::new(0),
        };
        (Arc::new(sink), rx)
    }

    /// Ends the answer with an error (a refusal, the connection gone).
    pub(crate) fn fail(&self, e: TransferError) {
        if let Some(tx) = self.state.lock().expect("sink").done.take() {
            let _ = tx.send(Err(e));
        }
    }

    fn finish(&self, r: Result<Landed, TransferError>) {
        if let Some(tx) = self.state.lock().expect("sink").done.take() {
            let _ = tx.send(r);
        }
    }
}

/// The head of a `GetValue` answer's frame.
struct PieceHead {
    value_len: u64,
    value_crc: u32,
    offset: u64,
    crc: u32,
    len: usize,
}

/// Reads a `GetValue` answer's frame: its data straight into its place in the value (or
/// skipped when nobody waits for it any more).
pub(crate) async fn read_piece(
    input: &mut FrameInput<Rd>,
    shared: &Shared,
    header: proto::Header,
    body_len: usize,
) -> Result<(), InputError> {
    if body_len < VALUE_PIECE_HEAD_BYTES {
        return Err(proto::ProtoError::Truncated(Op::GetValue).into());
    }
    let h = input.take(VALUE_PIECE_HEAD_BYTES).await?;
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4"));
    let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8"));
    let head = PieceHead {
        value_len: u64_at(0),
        value_crc: u32_at(8),
        offset: u64_at(12),
        crc: u32_at(20),
        len: u32_at(24) as usize,
    };
    if body_len != VALUE_PIECE_HEAD_BYTES + head.len {
        return Err(proto::ProtoError::Trailing(Op::GetValue, body_len).into());
    }
    let id = header.request_id;
    let sink = match shared.streams.lock().expect("streams").get(&id) {
        Some(Stream::Value(v)) => Some(v.clone()),
        _ => None,
    };
    let Some(sink) = sink else {
        input.skip(head.len).await?;
        return Ok(());
    };
    let more = header.flags & FLAG_MORE != 0;
    let r = land(input, &sink, &head, more).await?;
    if let Some(r) = r {
        shared.streams.lock().expect("streams").remove(&id);
        sink.finish(r);
    }
    Ok(())
}

/// Lands one piece; the value's outcome once it is complete or wrong.
async fn land(
    input: &mut FrameInput<Rd>,
    sink: &ValueSink,
    head: &PieceHead,
    more: bool,
) -> Result<Option<Result<Landed, TransferError>>, InputError> {
    let plan = plan_landing(sink, head);
    let (buf, at, end) = match plan {
        Ok(p) => p,
        Err(e) => {
            input.skip(head.len).await?;
            return Ok(Some(Err(e)));
        }
    };
    let mut buf = buf;
    let dst = &mut buf[at..at + head.len];
    input.read_into(dst).await?;
    let good = ctxpod_wire::crc32c(dst) == head.crc;
    let mut s = sink.state.lock().expect("sink");
    if !good {
        return Ok(Some(Err(TransferError::Corrupt(0))));
    }
    s.crc = ctxpod_wire::crc32c_combine(s.crc, head.crc, head.len);
    s.next += head.len as u64;
    sink.landed.fetch_add(head.len as u64, Ordering::Relaxed);
    if more {
        s.buf = Some(buf);
        return Ok(None);
    }
    let whole = s.start == 0 && end == head.value_len;
    Ok(Some(
        if s.next != end || (whole && s.crc != head.value_crc) {
            Err(TransferError::Corrupt(0))
        } else {
            Ok((buf, (end - s.start) as usize))
        },
    ))
}

/// Where a piece lands: the value's buffer (taken out while it lands; allocated at the
/// first piece), the piece's place in it, and the end of the range; or why it cannot.
fn plan_landing(
    sink: &ValueSink,
    head: &PieceHead,
) -> Result<(Vec<u8>, usize, u64), TransferError> {
    let mut s = sink.state.lock().expect("sink");
    let end = s.end.min(head.value_len);
    let want = end.saturating_sub(s.start);
    if s.next == s.start {
        if want > s.limit {
            return Err(TransferError::TooLarge {
                bytes: want as usize,
                max: s.limit as usize,
            });
        }
        match &mut s.buf {
            // The caller's buffer, grown only when it is short: its stale bytes are
            // overwritten piece by piece.
            Some(b) if b.len() < want as usize => b.resize(want as usize, 0),
            Some(_) => {}
            // A recycled buffer: engines read values of the same size over and over, and a
            // fresh one costs a page fault and a zeroed page every 4 KiB.
            None => s.buf = Some(crate::proto_io::recycled_buf(want as usize)),
        }
    }
    let fits = head.offset == s.next && head.offset + head.len as u64 <= end;
    match s.buf.take() {
        Some(b) if fits => Ok((b, (head.offset - s.start) as usize, end)),
        _ => Err(TransferError::Unexpected(Op::GetValue)),
    }
}

impl TransferClient {
    /// The largest value the node stores (its `value_bytes_max`, from its hello); 0 from a
    /// node that takes blocks of at most [`ctxpod_wire::BLOCK_BYTES_MAX`] only.
    pub fn value_bytes_max(&self) -> u64 {
        self.inner.value_bytes_max
    }

    /// Stores one value of any size up to the node's [`TransferClient::value_bytes_max`],
    /// sent piece by piece from `data` (no copy): the status, 201 stored, 200 there already
    /// with the same bytes, or the node's refusal (409, 413, 422, 403, 507, …; 503 once
    /// BUSY answers outlast the retries). Nothing of a value refused or cut short is stored.
    pub async fn put_value(
        &self,
        ns: &str,
        key: &Bytes,
        data: &Bytes,
        durability: Durability,
    ) -> Result<u16, TransferError> {
        let crc32c = ctxpod_wire::crc32c(data);
        let r = self
            .inner
            .retry_busy(|id| self.put_value_as(id, (ns, key), data, crc32c, durability))
            .await;
        match r {
            Ok(st) => Ok(st),
            Err(TransferError::Refused { status, .. }) => Ok(status),
            Err(e) => Err(e),
        }
    }

    async fn put_value_as(
        &self,
        id: u64,
        (ns, key): (&str, &Bytes),
        data: &Bytes,
        crc32c: u32,
        durability: Durability,
    ) -> Result<u16, TransferError> {
        let inner = &self.inner;
        let (tx, rx) = oneshot::channel();
        match inner.shared.pending.lock().expect("pending map").as_mut() {
            Some(m) => m.insert(id, tx),
            None => return Err(TransferError::Closed),
        };
        let len = data.len() as u64;
        let mut offset = 0u64;
        while offset < len {
            // Answered already (refused): the rest is not sent.
            if !self.is_pending(id) {
                break;
            }
            let n = ctxpod_wire::value_piece_len(len, offset);
            let piece = Request::PutValue(ValuePiece {
                ns: ns.into(),
                key: key.clone(),
                durability,
                len,
                crc32c,
                offset,
                data: data.slice(offset as usize..offset as usize + n),
            });
            let sent = tokio::time::timeout(inner.request_deadline, self.send_frame(&piece, id));
            match sent.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.forget(id);
                    return Err(e.into());
                }
                Err(_) => return Err(self.timed_out("a CXP1 PutValue piece")),
            }
            offset += n as u64;
        }
        let answer = match tokio::time::timeout(inner.request_deadline, rx).await {
            Ok(a) => a.map_err(|_| TransferError::Closed)?,
            Err(_) => return Err(self.timed_out("a CXP1 PutValue")),
        };
        match answer {
            (st, Response::ValueStored { .. }) => Ok(st),
            (status, Response::Error(message)) => Err(TransferError::Refused { status, message }),
            (_, r) => Err(TransferError::Unexpected(r.op())),
        }
    }

    /// A value (`range`: bytes `lo..hi` of it, `hi` clamped to its end), received piece by
    /// piece into one buffer, every piece's CRC32C checked (and the whole value's when the
    /// whole value was asked): `None` when the node does not hold it. Each piece must come
    /// within the request deadline of the one before.
    pub async fn get_value(
        &self,
        ns: &str,
        key: &Bytes,
        range: Option<(u64, u64)>,
    ) -> Result<Option<Bytes>, TransferError> {
        let recycled = std::sync::Mutex::new(None);
        let r = self
            .inner
            .retry_busy(|id| self.get_value_as(id, (ns, key), range, &recycled))
            .await;
        match r {
            Err(TransferError::Refused { status, .. }) if status == status::NOT_FOUND => Ok(None),
            r => r.map(|(buf, len)| Some(crate::proto_io::Recycled::bytes(buf, len))),
        }
    }

    /// [`TransferClient::get_value`] into the caller's buffer, as an engine reads into its
    /// own pool: the value (or its range) lands in `buf`'s first bytes, `buf` grown (never
    /// shrunk) when it is shorter. Gives `buf` back with how many bytes of it are the value
    /// (`None`: the node does not hold it); a buffer read into over and over costs no page
    /// faults, where a fresh one for every value costs a zeroed page every 4 KiB. On an
    /// error other than a miss the buffer is dropped.
    pub async fn get_value_into(
        &self,
        ns: &str,
        key: &Bytes,
        range: Option<(u64, u64)>,
        buf: Vec<u8>,
    ) -> Result<(Vec<u8>, Option<usize>), TransferError> {
        let slot = std::sync::Mutex::new(Some(buf));
        let r = self
            .inner
            .retry_busy(|id| self.get_value_as(id, (ns, key), range, &slot))
            .await;
        match r {
            Err(TransferError::Refused { status, .. }) if status == status::NOT_FOUND => {
                let buf = slot.lock().expect("buffer").take().unwrap_or_default();
                Ok((buf, None))
            }
            r => r.map(|(buf, len)| (buf, Some(len))),
        }
    }

    /// One try of a `GetValue`, landing in the buffer in `slot` (a recycled one when it is
    /// empty); a try that fails puts the buffer back in `slot` when no piece had it.
    async fn get_value_as(
        &self,
        id: u64,
        (ns, key): (&str, &Bytes),
        range: Option<(u64, u64)>,
        slot: &std::sync::Mutex<Option<Vec<u8>>>,
    ) -> Result<Landed, TransferError> {
        let (lo, hi) = range.unwrap_or((0, u64::MAX));
        let limit = match self.inner.value_bytes_max {
            0 => ctxpod_wire::BLOCK_BYTES_MAX as u64,
            n => n,
        };
        let buf = slot.lock().expect("buffer").take();
        let (sink, rx) = ValueSink::new((lo, hi), limit, buf);
        let r = self.await_value(id, (ns, key), (lo, hi), &sink, rx).await;
        if r.is_err() {
            *slot.lock().expect("buffer") = sink.state.lock().expect("sink").buf.take();
        }
        r
    }

    /// Sends a `GetValue` whose pieces land in `sink` and waits for its outcome, as long
    /// as pieces keep coming within the request deadline.
    async fn await_value(
        &self,
        id: u64,
        (ns, key): (&str, &Bytes),
        (lo, hi): (u64, u64),
        sink: &Arc<ValueSink>,
        mut rx: oneshot::Receiver<Result<Landed, TransferError>>,
    ) -> Result<Landed, TransferError> {
        self.inner
            .shared
            .streams
            .lock()
            .expect("streams")
            .insert(id, Stream::Value(sink.clone()));
        let req = Request::GetValue {
            ns: ns.into(),
            key: key.clone(),
            offset: lo,
            len: if hi == u64::MAX {
                0
            } else {
                hi.saturating_sub(lo)
            },
        };
        let deadline = self.inner.request_deadline;
        let sent = tokio::time::timeout(deadline, self.send_frame(&req, id)).await;
        if !matches!(sent, Ok(Ok(()))) {
            self.end_stream(id);
            return Err(match sent {
                Ok(Err(e)) => e.into(),
                _ => self.timed_out("a CXP1 GetValue"),
            });
        }
        // Progress, not the whole transfer, is what the deadline bounds.
        let mut seen = 0;
        loop {
            match tokio::time::timeout(deadline, &mut rx).await {
                Ok(r) => return r.map_err(|_| TransferError::Closed)?,
                Err(_) => {
                    let now = sink.landed.load(Ordering::Relaxed);
                    if now == seen {
                        self.end_stream(id);
                        return Err(self.timed_out("a CXP1 GetValue piece"));
                    }
                    seen = now;
                }
            }
        }
    }

    /// Writes one request frame (its parts gathered, data referenced).
    async fn send_frame(&self, req: &Request, id: u64) -> std::io::Result<()> {
        let parts = req.encode_parts(id);
        let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        let mut wr = self.inner.wr.lock().await;
        write_parts(&mut *wr, &slices).await?;
        wr.flush().await
    }

    fn end_stream(&self, id: u64) {
        self.inner
            .shared
            .streams
            .lock()
            .expect("streams")
            .remove(&id);
    }

    fn is_pending(&self, id: u64) -> bool {
        let p = self.inner.shared.pending.lock().expect("pending map");
        p.as_ref().is_some_and(|m| m.contains_key(&id))
    }

    fn forget(&self, id: u64) {
        if let Some(m) = self
            .inner
            .shared
            .pending
            .lock()
            .expect("pending map")
            .as_mut()
        {
            m.remove(&id);
        }
    }

    /// A request past its deadline: the connection is closed, as [`ClientInner::call_as`]
    /// does (a frame may be half written).
    fn timed_out(&self, what: &str) -> TransferError {
        self.inner.give_up();
        TransferError::TimedOut {
            what: what.into(),
            which: "request",
            after: self.inner.request_deadline,
        }
    }
}

impl TransferClient {
    /// [`TransferClient::put`] of blocks some of which are over one record: those are sent
    /// as values (at once), the others in one `Put`.
    pub(super) async fn put_mixed(
        &self,
        ns: &str,
        blocks: &[(Bytes, Bytes)],
        durability: Durability,
    ) -> Result<Vec<u16>, TransferError> {
        let large = |d: &Bytes| d.len() > ctxpod_wire::BLOCK_BYTES_MAX;
        let small: Vec<(Bytes, Bytes)> =
            blocks.iter().filter(|(_, d)| !large(d)).cloned().collect();
        let values = futures::future::join_all(
            blocks
                .iter()
                .filter(|(_, d)| large(d))
                .map(|(k, d)| self.put_value(ns, k, d, durability)),
        );
        let (small_st, value_st) = if small.is_empty() {
            (Ok(Vec::new()), values.await)
        } else {
            futures::join!(Box::pin(self.put(ns, &small, durability)), values)
        };
        let (mut small_st, mut value_st) = (small_st?.into_iter(), value_st.into_iter());
        blocks
            .iter()
            .map(|(_, d)| {
                let st = if large(d) {
                    value_st.next()
                } else {
                    small_st.next().map(Ok)
                };
                st.unwrap_or(Err(TransferError::Unexpected(Op::Put)))
            })
            .collect()
    }
}
