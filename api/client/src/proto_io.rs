//! The read side of a CXP1 connection, shared by the node and the client: a buffer in front
//! of the socket from which frame headers are parsed and bodies are taken whole or received
//! straight into their destination (a record's buffer on the node, a memory region on the
//! client), so block data is copied once.

use bytes::{Buf, Bytes, BytesMut};
use ctxpod_wire::proto::{
    frame_body_len, Durability, Header, ProtoError, PutBodyParser, PutStep, HEADER_BYTES,
};
use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bodies at least this large are taken into recycled buffers instead of the connection's
/// buffer. glibc serves allocations of this size and up with fresh `mmap`s, so each large
/// body cost page faults and the kernel zeroing every page: a fifth of a client's CPU on
/// 1 MiB GETs (docs/PERFORMANCE.md, "Where the time goes").
const RECYCLE_MIN_BYTES: usize = 128 << 10;
/// Recycled buffers come in capacities of whole multiples of this.
const RECYCLE_CLASS_BYTES: usize = 64 << 10;
/// The most this process keeps in idle recycled buffers, all connections together;
/// a buffer given back beyond it is freed.
pub const RECYCLE_KEEP_BYTES: usize = 64 << 20;

/// Idle recycled buffers by capacity, and their total capacity.
struct Idle {
    by_cap: BTreeMap<usize, Vec<Vec<u8>>>,
    bytes: usize,
}

static RECYCLED: Mutex<Idle> = Mutex::new(Idle {
    by_cap: BTreeMap::new(),
    bytes: 0,
});

/// A buffer of capacity `n` rounded up to its class: an idle one if there is one (its
/// contents are stale; every byte handed out is overwritten first), a new one otherwise.
pub(crate) fn recycled_buf(n: usize) -> Vec<u8> {
    let cap = n.next_multiple_of(RECYCLE_CLASS_BYTES);
    let mut idle = RECYCLED.lock().expect("recycled buffers");
    if let Some(buf) = idle.by_cap.get_mut(&cap).and_then(Vec::pop) {
        idle.bytes -= cap;
        return buf;
    }
    drop(idle);
    vec![0; cap]
}

/// A taken body in a recycled buffer; dropping the last `Bytes` that views it gives the
/// buffer back, or frees it when the idle buffers already hold [`RECYCLE_KEEP_BYTES`].
pub(crate) struct Recycled {
    buf: Vec<u8>,
    len: usize,
}

impl Recycled {
    /// The first `len` bytes of `buf` (from [`recycled_buf`]), given back when the last
    /// `Bytes` viewing them is dropped.
    pub(crate) fn bytes(buf: Vec<u8>, len: usize) -> Bytes {
        Bytes::from_owner(Recycled { buf, len })
    }
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        let cap = buf.len();
        let Ok(mut idle) = RECYCLED.lock() else {
            return;
        };
        if idle.bytes + cap <= RECYCLE_KEEP_BYTES {
            idle.bytes += cap;
            idle.by_cap.entry(cap).or_default().push(buf);
        }
    }
}

/// Bytes held in idle recycled buffers now (for tests and metrics).
pub fn recycled_idle_bytes() -> usize {
    RECYCLED.lock().map(|idle| idle.bytes).unwrap_or(0)
}

pub struct FrameInput<R> {
    rd: R,
    buf: BytesMut,
    max_frame_bytes: u32,
}

use ctxpod_wire::proto::Landing;

/// A `Put` body read by [`FrameInput::read_put_body`]: each entry's key, the CRC32C the
/// client gave, and where its bytes landed.
pub struct PutBody<B> {
    pub ns: String,
    pub durability: Durability,
    pub entries: Vec<(Bytes, u32, B)>,
}

/// Why reading the next frame failed: the socket, or framing that cannot be trusted any more
/// (over the limit, shorter than its header, unknown op). Either ends the connection.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("framing: {0}")]
    Framing(#[from] ProtoError),
}

impl<R: AsyncRead + Unpin> FrameInput<R> {
    pub fn new(rd: R, max_frame_bytes: u32) -> FrameInput<R> {
        FrameInput {
            rd,
            buf: BytesMut::with_capacity(256 << 10),
            max_frame_bytes,
        }
    }

    /// The reader under the buffer (to adjust it between frames; reading from it directly
    /// would lose the buffer's place).
    pub fn reader_mut(&mut self) -> &mut R {
        &mut self.rd
    }

    /// The next frame's header and body length; `None` when the peer closed cleanly between
    /// frames. The body is still unread: take it with [`Self::take`], [`Self::read_into`] or
    /// [`Self::skip`].
    pub async fn next_header(&mut self) -> Result<Option<(Header, usize)>, InputError> {
        if !self.fill(4).await? {
            return Ok(None);
        }
        // The codec's own checks (the fuzz targets run them): the length before waiting
        // for the header.
        let body = frame_body_len(
            self.buf[..4].try_into().expect("4 bytes"),
            self.max_frame_bytes,
        )?;
        self.need(4 + HEADER_BYTES).await?;
        let header = Header::decode(self.buf[4..4 + HEADER_BYTES].try_into().expect("a header"))?;
        self.buf.advance(4 + HEADER_BYTES);
        Ok(Some((header, body)))
    }

    /// Reads a `Put` body of `len` bytes with the codec's [`PutBodyParser`]: each block is
    /// landed straight into the destination `stage(len)` gives (from the buffer, then from
    /// the socket). `Ok(Err(_))`: the body was consumed but is malformed (answer 400; the
    /// connection goes on).
    pub async fn read_put_body<B: Landing>(
        &mut self,
        len: usize,
        mut stage: impl FnMut(usize) -> Result<B, ProtoError>,
    ) -> std::io::Result<Result<PutBody<B>, ProtoError>> {
        let mut p = PutBodyParser::new(len);
        let mut entries = Vec::new();
        loop {
            match p.step() {
                PutStep::Need(_) => {
                    self.need(1).await?;
                    let k = p.feed(&self.buf);
                    self.buf.advance(k);
                }
                PutStep::Block { key, crc32c, len } => {
                    let mut dst = match stage(len) {
                        Ok(d) => d,
                        Err(e) => {
                            self.skip(p.left()).await?;
                            return Ok(Err(e));
                        }
                    };
                    self.read_into(&mut dst.unfilled_mut()[..len]).await?;
                    dst.advance(len);
                    p.landed(len);
                    entries.push((key, crc32c, dst));
                }
                PutStep::Land(_) => unreachable!("blocks are landed whole"),
                PutStep::Done { ns, durability } => {
                    return Ok(Ok(PutBody {
                        ns,
                        durability,
                        entries,
                    }))
                }
                PutStep::Bad { error, skip } => {
                    self.skip(skip).await?;
                    return Ok(Err(error));
                }
            }
        }
    }

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

    async fn need(&mut self, n: usize) -> std::io::Result<()> {
        if self.fill(n).await? {
            Ok(())
        } else {
            Err(std::io::ErrorKind::UnexpectedEof.into())
        }
    }

    /// The next `n` bytes. A large body (from 128 KiB) is received into a recycled buffer,
    /// given back when the last view of it is dropped.
    pub async fn take(&mut self, n: usize) -> std::io::Result<Bytes> {
        if n >= RECYCLE_MIN_BYTES {
            let mut buf = recycled_buf(n);
            self.read_into(&mut buf[..n]).await?;
            return Ok(Bytes::from_owner(Recycled { buf, len: n }));
        }
        self.need(n).await?;
        Ok(self.buf.split_to(n).freeze())
    }

    /// Fills `dst`: first from the buffer, then from the socket directly into `dst`.
    pub async fn read_into(&mut self, dst: &mut [u8]) -> std::io::Result<()> {
        let n = self.buf.len().min(dst.len());
        dst[..n].copy_from_slice(&self.buf[..n]);
        self.buf.advance(n);
        if n < dst.len() {
            self.rd.read_exact(&mut dst[n..]).await?;
        }
        Ok(())
    }

    /// Discards the next `n` bytes (in bounded pieces).
    pub async fn skip(&mut self, mut n: usize) -> std::io::Result<()> {
        let k = self.buf.len().min(n);
        self.buf.advance(k);
        n -= k;
        let mut sink = vec![0u8; (64 << 10).min(n)];
        while n > 0 {
            let k = n.min(sink.len());
            self.rd.read_exact(&mut sink[..k]).await?;
            n -= k;
        }
        Ok(())
    }
}

/// The most slices one `writev` is given (Linux takes 1024).
const WRITE_SLICES_MAX: usize = 64;

/// Writes `parts` in order, gathered into vectored writes: a frame's header, its entries'
/// framing and their blocks leave in as few system calls (and, with `TCP_NODELAY`, as few
/// segments) as the socket takes, instead of one write each. A small frame written alone
/// wakes the peer once per part: on loopback that was most of a one-block call's cost.
/// A writer without vectored writes gets the parts one at a time, as before.
pub async fn write_parts<W: AsyncWrite + Unpin + ?Sized>(
    wr: &mut W,
    parts: &[&[u8]],
) -> std::io::Result<()> {
    if !wr.is_write_vectored() {
        for p in parts {
            wr.write_all(p).await?;
        }
        return Ok(());
    }
    // The first part not yet wholly written, and how much of it is.
    let (mut at, mut done) = (0, 0);
    while at < parts.len() {
        if parts[at].len() == done {
            (at, done) = (at + 1, 0);
            continue;
        }
        let slices: Vec<std::io::IoSlice<'_>> = std::iter::once(&parts[at][done..])
            .chain(parts[at + 1..].iter().copied())
            .filter(|p| !p.is_empty())
            .take(WRITE_SLICES_MAX)
            .map(std::io::IoSlice::new)
            .collect();
        let mut n = wr.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let left = parts[at].len() - done;
            if n < left {
                done += n;
                n = 0;
            } else {
                n -= left;
                (at, done) = (at + 1, 0);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn large_bodies_come_back_whole_and_their_buffers_are_reused() {
        // A class no other test uses: 3 MiB and a bit.
        let n = (3 << 20) + 12_345;
        let data = pattern(10 + 2 * n + 5);
        let mut input = FrameInput::new(&data[..], u32::MAX);
        let small = input.take(10).await.unwrap();
        assert_eq!(&small[..], &data[..10]);
        let a = input.take(n).await.unwrap();
        assert_eq!(&a[..], &data[10..10 + n]);
        let first = a.as_ptr();
        // A slice keeps the buffer out of the pool until it is dropped too.
        let part = a.slice(100..200);
        drop(a);
        assert_eq!(recycled_idle_bytes(), 0);
        drop(part);
        assert_eq!(
            recycled_idle_bytes(),
            n.next_multiple_of(RECYCLE_CLASS_BYTES)
        );
        let b = input.take(n).await.unwrap();
        assert_eq!(&b[..], &data[10 + n..10 + 2 * n]);
        assert_eq!(b.as_ptr(), first, "the buffer given back is used again");
        assert_eq!(recycled_idle_bytes(), 0);
        assert_eq!(&input.take(5).await.unwrap()[..], &data[10 + 2 * n..]);
    }

    #[tokio::test]
    async fn idle_buffers_are_bounded() {
        let n = 30 << 20;
        let data = pattern(3 * n);
        let mut input = FrameInput::new(&data[..], u32::MAX);
        let mut held = Vec::new();
        for i in 0..3 {
            let b = input.take(n).await.unwrap();
            assert_eq!(&b[..], &data[i * n..(i + 1) * n]);
            held.push(b);
        }
        drop(held);
        // Two 30 MiB buffers fit under the 64 MiB bound; the third was freed.
        assert_eq!(recycled_idle_bytes(), 2 * n);
        assert!(recycled_idle_bytes() <= RECYCLE_KEEP_BYTES);
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error() {
        let data = pattern(200 << 10);
        let mut input = FrameInput::new(&data[..], u32::MAX);
        let e = input.take(300 << 10).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    /// A writer that takes at most `cap` bytes per call, vectored, and counts its calls.
    struct Trickle {
        got: Vec<u8>,
        cap: usize,
        calls: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.calls += 1;
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(self.cap - n);
                self.got.extend_from_slice(&b[..k]);
                n += k;
                if n == self.cap {
                    break;
                }
            }
            std::task::Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn parts_are_written_whole_and_in_order_through_short_writes() {
        let data = pattern(5000);
        // Empty parts, parts cut by short writes, and more parts than one call takes.
        let mut parts: Vec<&[u8]> = vec![&data[..0], &data[..7], &data[7..7], &data[7..3000]];
        parts.extend(data[3000..].chunks(10));
        for cap in [1, 3, 64, 1000, 1 << 20] {
            let mut w = Trickle {
                got: Vec::new(),
                cap,
                calls: 0,
            };
            write_parts(&mut w, &parts).await.unwrap();
            assert_eq!(w.got, data, "cap {cap}");
            if cap == 1 << 20 {
                // 203 non-empty parts, 64 slices a call.
                assert_eq!(w.calls, 4);
            }
        }
    }
}
