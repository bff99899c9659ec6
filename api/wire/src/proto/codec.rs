//! The bounded byte writer and reader every CXP1 frame is encoded and decoded with.

use super::*;

/// Readers of fixed-size little-endian integers: `name: type = Buf method`.
macro_rules! getters {
    ($($name:ident: $t:ty = $get:ident),+ $(,)?) => {
        $(
            pub(super) fn $name(&mut self) -> Result<$t, ProtoError> {
                self.need(std::mem::size_of::<$t>())?;
                Ok(self.b.$get())
            }
        )+
    };
}

pub(super) struct Writer {
    pub(super) b: BytesMut,
    /// With `by_ref`: the frame so far, as pieces (the first one still open for the
    /// length prefix), block data referenced rather than copied.
    pub(super) first: Option<BytesMut>,
    pub(super) parts: Vec<Bytes>,
    pub(super) by_ref: bool,
}

impl Writer {
    pub(super) fn frame(op: Op, status: u16, request_id: u64, body_hint: usize) -> Writer {
        let mut b = BytesMut::with_capacity(4 + HEADER_BYTES + body_hint);
        b.put_u32_le(0);
        b.put_u8(op as u8);
        b.put_u8(0);
        b.put_u16_le(status);
        b.put_u64_le(request_id);
        Writer {
            b,
            first: None,
            parts: Vec::new(),
            by_ref: false,
        }
    }

    /// Block data: copied into the frame, or (`by_ref`) referenced as a piece of it.
    pub(super) fn data(&mut self, d: &Bytes) {
        if !self.by_ref || d.is_empty() {
            self.b.put_slice(d);
            return;
        }
        let head = self.b.split();
        match self.first {
            None => self.first = Some(head),
            Some(_) => self.parts.push(head.freeze()),
        }
        self.parts.push(d.clone());
    }

    /// The frame as pieces that, written one after the other, are the frame.
    pub(super) fn finish_parts(mut self) -> Vec<Bytes> {
        let Some(mut first) = self.first.take() else {
            return vec![self.finish()];
        };
        let total = first.len() + self.parts.iter().map(|p| p.len()).sum::<usize>() + self.b.len();
        first[..4].copy_from_slice(&((total - 4) as u32).to_le_bytes());
        let mut out = Vec::with_capacity(self.parts.len() + 2);
        out.push(first.freeze());
        out.append(&mut self.parts);
        if !self.b.is_empty() {
            out.push(self.b.freeze());
        }
        out
    }

    pub(super) fn ns(&mut self, ns: &str) {
        self.b.put_u8(ns.len() as u8);
        self.b.put_slice(ns.as_bytes());
    }

    pub(super) fn key(&mut self, k: &[u8]) {
        self.b.put_u8(k.len() as u8);
        self.b.put_slice(k);
    }

    pub(super) fn keys(&mut self, keys: &[Bytes]) {
        self.b.put_u32_le(keys.len() as u32);
        keys.iter().for_each(|k| self.key(k));
    }

    pub(super) fn finish(mut self) -> Bytes {
        let len = (self.b.len() - 4) as u32;
        self.b[..4].copy_from_slice(&len.to_le_bytes());
        self.b.freeze()
    }
}

/// Bounded reads from a frame body: every read checks the bytes are there.
pub(super) struct Reader {
    pub(super) b: Bytes,
    pub(super) op: Op,
}

impl Reader {
    pub(super) fn new(frame: &Frame) -> Reader {
        Reader {
            b: frame.body.clone(),
            op: frame.header.op,
        }
    }

    /// `len: u32` then that many bytes of block data, at most the block limit.
    pub(super) fn block(&mut self) -> Result<Bytes, ProtoError> {
        let len = self.u32()?;
        if len as usize > crate::BLOCK_BYTES_MAX {
            return Err(ProtoError::BlockTooLarge(len));
        }
        self.bytes(len as usize)
    }

    pub(super) fn need(&self, n: usize) -> Result<(), ProtoError> {
        if self.b.remaining() < n {
            Err(ProtoError::Truncated(self.op))
        } else {
            Ok(())
        }
    }

    getters! {
        u8: u8 = get_u8,
        u16: u16 = get_u16_le,
        u32: u32 = get_u32_le,
        u64: u64 = get_u64_le,
    }

    pub(super) fn bytes(&mut self, n: usize) -> Result<Bytes, ProtoError> {
        self.need(n)?;
        Ok(self.b.split_to(n))
    }

    pub(super) fn count(&mut self) -> Result<usize, ProtoError> {
        let n = self.u32()? as usize;
        if n > crate::MATCH_KEYS_MAX.max(crate::BATCH_ENTRIES_MAX) {
            return Err(ProtoError::TooManyEntries(n));
        }
        Ok(n)
    }

    pub(super) fn ns(&mut self) -> Result<String, ProtoError> {
        let n = self.u8()? as usize;
        if n == 0 || n > NAMESPACE_BYTES_MAX {
            return Err(ProtoError::BadNamespace(n));
        }
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::BadNamespace(n))
    }

    /// A tenant name: like a namespace name, but may be empty (an admin has none).
    pub(super) fn name(&mut self) -> Result<String, ProtoError> {
        let n = self.u8()? as usize;
        if n > NAMESPACE_BYTES_MAX {
            return Err(ProtoError::BadNamespace(n));
        }
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::BadNamespace(n))
    }

    pub(super) fn key(&mut self) -> Result<Bytes, ProtoError> {
        let n = self.u8()? as usize;
        if n == 0 || n > crate::KEY_BYTES_MAX {
            return Err(ProtoError::BadKeyLength(n));
        }
        self.bytes(n)
    }

    pub(super) fn keys(&mut self) -> Result<Vec<Bytes>, ProtoError> {
        self.list(|r| r.key())
    }

    /// `count` then that many items read by `item`.
    pub(super) fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Reader) -> Result<T, ProtoError>,
    ) -> Result<Vec<T>, ProtoError> {
        let n = self.count()?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(item(self)?);
        }
        Ok(out)
    }

    pub(super) fn end(&self) -> Result<(), ProtoError> {
        match self.b.remaining() {
            0 => Ok(()),
            n => Err(ProtoError::Trailing(self.op, n)),
        }
    }
}
