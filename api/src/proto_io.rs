//! The read side of a CXP1 connection, shared by the node and the client: a buffer in front
//! of the socket from which frame headers are parsed and bodies are taken whole or received
//! straight into their destination (a record's buffer on the node, a memory region on the
//! client), so block data is copied once.

use crate::proto::{Header, Op, ProtoError, HEADER_BYTES};
use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

pub struct FrameInput<R> {
    rd: R,
    buf: BytesMut,
    max_frame_bytes: u32,
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

    /// The next frame's header and body length; `None` when the peer closed cleanly between
    /// frames. The body is still unread: take it with [`Self::take`], [`Self::read_into`] or
    /// [`Self::skip`].
    pub async fn next_header(&mut self) -> Result<Option<(Header, usize)>, InputError> {
        if !self.fill(4).await? {
            return Ok(None);
        }
        let len = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes"));
        if len > self.max_frame_bytes {
            return Err(ProtoError::FrameTooLarge(len, self.max_frame_bytes).into());
        }
        if (len as usize) < HEADER_BYTES {
            return Err(ProtoError::FrameTooShort(len).into());
        }
        self.need(4 + HEADER_BYTES).await?;
        let op = Op::from_u8(self.buf[4]).ok_or(ProtoError::UnknownOp(self.buf[4]))?;
        let header = Header {
            op,
            flags: self.buf[5],
            status: u16::from_le_bytes([self.buf[6], self.buf[7]]),
            request_id: u64::from_le_bytes(self.buf[8..16].try_into().expect("8 bytes")),
        };
        self.buf.advance(4 + HEADER_BYTES);
        Ok(Some((header, len as usize - HEADER_BYTES)))
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

    /// The next `n` bytes.
    pub async fn take(&mut self, n: usize) -> std::io::Result<Bytes> {
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
