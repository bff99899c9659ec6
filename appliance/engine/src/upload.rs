//! Multipart uploads (S3's CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
//! AbortMultipartUpload, ListParts, ListMultipartUploads): each part is written as extents
//! the moment it arrives, in any order and at once with other parts, sealed under the
//! upload's sequence number and `part << 16 | place in the part`; completing the upload
//! publishes one manifest that lists the chosen parts' extents in order (no byte is copied),
//! visible whole or not at all, like any large value.
//!
//! An upload lives in node memory: its parts' extents are dead space until it completes
//! (eviction frees them with their regions, and then the completion is refused as the
//! device turned over), an upload idle for [`UPLOAD_IDLE`] is dropped, and a restart drops
//! every upload (its client sees `NoSuchUpload` and starts over). At most [`UPLOADS_MAX`]
//! run at once.

use super::*;
use crate::index::ExtentLoc;
use crate::value::{settle, Extents};
use ctxpod_wire::EXTENT_BYTES;
use std::collections::BTreeMap;
use std::time::Instant;

/// Multipart uploads in progress on a node at once; more are refused as busy.
pub const UPLOADS_MAX: usize = 1024;
/// Highest part number (S3's).
pub const UPLOAD_PARTS_MAX: u32 = 10_000;
/// An upload no part or listing touched for this long is dropped.
pub const UPLOAD_IDLE: Duration = Duration::from_secs(3600);

/// One multipart upload in progress.
pub(crate) struct Upload {
    ns: Arc<Namespace>,
    key: Vec<u8>,
    /// The upload's sequence number: its id, and the value sequence every extent of its
    /// parts is sealed under.
    seq: u64,
    key_id: u32,
    dek: Option<Arc<AeadKey>>,
    started_ms: u64,
    state: Mutex<UploadState>,
}

struct UploadState {
    touched: Instant,
    parts: BTreeMap<u32, Part>,
}

/// An extent written, with the epoch of its region then.
type Placed = (ExtentLoc, u64);

/// A part written: its extents, length and CRC32C, and its bytes counted against its
/// namespace's quota (pending) until the upload ends.
struct Part {
    extents: Vec<Placed>,
    len: u64,
    crc: u32,
    _pending: Option<put::Pending>,
}

/// A part as ListParts gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartInfo {
    pub number: u32,
    pub len: u64,
    pub crc32c: u32,
}

/// An upload as ListMultipartUploads gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadInfo {
    pub id: u64,
    pub key: Vec<u8>,
    pub started_ms: u64,
}

/// A part of `len` bytes of an upload into `ns`, counted against its quota from now on
/// (`None` without a quota); refused when the namespace's written and pending bytes (other
/// parts, values being written) and the part's would be over it. Parts take device space
/// before any completion: without this, uploads could fill the device past any quota.
fn part_pending(ns: &Arc<Namespace>, len: u64) -> Result<Option<put::Pending>> {
    let Some(q) = ns.quota_bytes() else {
        return Ok(None);
    };
    let held = ns.used_bytes.load(Ordering::Relaxed) + ns.pending_bytes.load(Ordering::SeqCst);
    if held + len > q {
        return Err(EngineError::Quota(format!(
            "namespace {} is at its quota (its uploads' parts count from when they are written)",
            ns.name
        )));
    }
    Ok(Some(put::Pending::new(ns.clone(), len)))
}

/// A part being written: [`Engine::upload_part`], its pieces (each
/// [`PartWriter::next_piece_len`] bytes), then [`PartWriter::finish`].
pub struct PartWriter<'a> {
    engine: &'a Engine,
    upload: Arc<Upload>,
    number: u32,
    len: u64,
    received: u64,
    crc: u32,
    x: Extents,
}

impl Engine {
    /// Starts a multipart upload of `key`; its id.
    pub async fn create_upload(&self, ns: &str, key: &[u8]) -> Result<u64> {
        Self::check_key(key)?;
        self.check_not_failed()?;
        let ns = self.ns(ns)?;
        self.reap_uploads();
        if self.uploads.lock().len() >= UPLOADS_MAX {
            return Err(EngineError::Busy("multipart uploads"));
        }
        let seq = self.core.next_seq()?;
        self.rotate_if_worn(&ns, seq).await?;
        let (key_id, dek) = ns
            .current_key()
            .ok_or_else(|| anyhow::anyhow!("namespace {} has no current data key", ns.name))?;
        let upload = Upload {
            ns,
            key: key.to_vec(),
            seq,
            key_id,
            dek: (!self.core.geometry.plaintext_at_rest).then_some(dek),
            started_ms: now_ms(),
            state: Mutex::new(UploadState {
                touched: Instant::now(),
                parts: BTreeMap::new(),
            }),
        };
        self.uploads.lock().insert(seq, Arc::new(upload));
        self.count_uploads();
        Ok(seq)
    }

    /// Drops uploads idle for longer than [`UPLOAD_IDLE`].
    fn reap_uploads(&self) {
        self.uploads
            .lock()
            .retain(|_, u| u.state.lock().touched.elapsed() < UPLOAD_IDLE);
        self.count_uploads();
    }

    /// `ctxpod_uploads`: the uploads in progress now.
    fn count_uploads(&self) {
        let n = self.uploads.lock().len();
        self.core.metrics.uploads.set(n as i64);
    }

    /// The upload `id` of `key` in `ns`, touched; `NotFound` for any other.
    fn upload(&self, ns: &str, key: &[u8], id: u64) -> Result<Arc<Upload>> {
        Self::check_key(key)?;
        let ns = self.ns(ns)?;
        let u = self.uploads.lock().get(&id).cloned();
        match u {
            Some(u) if u.ns.id == ns.id && u.key == key => {
                u.state.lock().touched = Instant::now();
                Ok(u)
            }
            _ => Err(EngineError::NotFound(format!(
                "no upload {id:x} of this key"
            ))),
        }
    }

    /// Starts writing part `number` (1..=[`UPLOAD_PARTS_MAX`]) of `len` bytes of upload
    /// `id`; a part written again replaces the earlier one at completion.
    pub async fn upload_part(
        &self,
        ns: &str,
        key: &[u8],
        id: u64,
        (number, len): (u32, u64),
    ) -> Result<PartWriter<'_>> {
        self.check_not_failed()?;
        let upload = self.upload(ns, key, id)?;
        if !(1..=UPLOAD_PARTS_MAX).contains(&number) {
            return Err(EngineError::Invalid(format!(
                "part number {number} is not within 1..={UPLOAD_PARTS_MAX}"
            )));
        }
        let max = self.core.cfg.value_bytes_max.0;
        if len > max {
            return Err(EngineError::TooLarge(format!(
                "a part of {len} bytes is over the node's value limit of {max} bytes"
            )));
        }
        if len == 0 {
            return Err(EngineError::Invalid("empty part".into()));
        }
        let x = Extents {
            value_seq: upload.seq,
            key_id: upload.key_id,
            dek: upload.dek.clone(),
            done: Vec::new(),
            in_flight: std::collections::VecDeque::new(),
            _pending: part_pending(&upload.ns, len)?,
        };
        Ok(PartWriter {
            engine: self,
            upload,
            number,
            len,
            received: 0,
            crc: 0,
            x,
        })
    }

    /// Completes upload `id` with its parts `numbers` (ascending, each written): the value
    /// they make, in that order, becomes visible (`Created`), or the key holds the same
    /// bytes already (`Exists`) or others (`Conflict`). The upload ends either way, but for
    /// a refusal of its parts (`Invalid`: it may be completed again with others).
    pub async fn complete_upload(
        &self,
        ns: &str,
        key: &[u8],
        id: u64,
        numbers: &[u32],
    ) -> Result<PutStatus> {
        self.check_not_failed()?;
        let upload = self.upload(ns, key, id)?;
        let (extents, len, crc) = upload.chosen(numbers)?;
        let max = self.core.cfg.value_bytes_max.0;
        if len > max {
            return Err(EngineError::TooLarge(format!(
                "the parts make a value of {len} bytes, over the node's value limit of {max} \
                 bytes"
            )));
        }
        let ns = upload.ns.clone();
        let pending = ns
            .quota_bytes()
            .is_some()
            .then(|| put::Pending::new(ns.clone(), len));
        self.check_quota(&ns, len as usize).await?;
        // Taken out first: of two completions at once, one publishes.
        if self.uploads.lock().remove(&id).is_none() {
            return Err(EngineError::NotFound(format!(
                "no upload {id:x} of this key"
            )));
        }
        // The value's bytes are pending now: its parts' are not counted twice.
        upload.state.lock().parts.clear();
        let bkey = block_key(ns.id, key);
        let x = Extents {
            value_seq: upload.seq,
            key_id: upload.key_id,
            dek: None,
            done: extents,
            in_flight: std::collections::VecDeque::new(),
            _pending: pending,
        };
        let status = self.publish_value(ns, bkey.clone(), x, (len, crc)).await?;
        if status == PutStatus::Created {
            self.count_stored(&bkey, len as usize);
        }
        Ok(status)
    }

    /// Ends upload `id` without a value; whether there was one.
    pub fn abort_upload(&self, ns: &str, key: &[u8], id: u64) -> Result<bool> {
        match self.upload(ns, key, id) {
            Ok(_) => {
                let was = self.uploads.lock().remove(&id).is_some();
                self.count_uploads();
                Ok(was)
            }
            Err(EngineError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The parts of upload `id` written so far, by number.
    pub fn list_parts(&self, ns: &str, key: &[u8], id: u64) -> Result<Vec<PartInfo>> {
        let upload = self.upload(ns, key, id)?;
        let st = upload.state.lock();
        Ok(st
            .parts
            .iter()
            .map(|(&number, p)| PartInfo {
                number,
                len: p.len,
                crc32c: p.crc,
            })
            .collect())
    }

    /// The uploads in progress in `ns` whose keys start with `prefix`, by key then id.
    pub fn list_uploads(&self, ns: &str, prefix: &[u8]) -> Result<Vec<UploadInfo>> {
        let ns = self.ns(ns)?;
        self.reap_uploads();
        let mut out: Vec<UploadInfo> = self
            .uploads
            .lock()
            .values()
            .filter(|u| u.ns.id == ns.id && u.key.starts_with(prefix))
            .map(|u| UploadInfo {
                id: u.seq,
                key: u.key.clone(),
                started_ms: u.started_ms,
            })
            .collect();
        out.sort_by(|a, b| (&a.key, a.id).cmp(&(&b.key, b.id)));
        Ok(out)
    }
}

impl Upload {
    /// The extents, length and CRC32C of the value parts `numbers` make.
    fn chosen(&self, numbers: &[u32]) -> Result<(Vec<Placed>, u64, u32)> {
        if numbers.is_empty() || numbers.windows(2).any(|w| w[0] >= w[1]) {
            return Err(EngineError::Invalid(
                "the parts must be listed in ascending order, each once (InvalidPartOrder)".into(),
            ));
        }
        let st = self.state.lock();
        let (mut extents, mut len, mut crc) = (Vec::new(), 0u64, 0u32);
        for n in numbers {
            let p = st.parts.get(n).ok_or_else(|| {
                EngineError::Invalid(format!("part {n} was not uploaded (InvalidPart)"))
            })?;
            extents.extend_from_slice(&p.extents);
            crc = ctxpod_wire::crc32c_combine(crc, p.crc, p.len as usize);
            len += p.len;
        }
        Ok((extents, len, crc))
    }
}

impl PartWriter<'_> {
    /// Bytes of the next piece to stage (0: the part is complete).
    pub fn next_piece_len(&self) -> usize {
        self.len
            .saturating_sub(self.received)
            .min(EXTENT_BYTES as u64) as usize
    }

    /// The part's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never true: an empty part is refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes the next piece of the part, staged whole, and hands it to the writer as an
    /// extent.
    pub async fn write_piece(&mut self, piece: StagedBlock) -> Result<()> {
        let want = self.next_piece_len();
        if !piece.is_complete() || piece.len() != want {
            return Err(EngineError::Invalid(format!(
                "a piece of {} bytes where the part's next piece is {want} bytes",
                piece.len()
            )));
        }
        self.crc = ctxpod_wire::crc32c_combine(self.crc, piece.crc32c(), piece.len());
        let index = self.number << 16 | (self.received / EXTENT_BYTES as u64) as u32;
        self.received += piece.len() as u64;
        let (ns, key) = (&self.upload.ns, &self.upload.key);
        self.engine
            .send_extent(ns, key, &mut self.x, index, piece)
            .await
    }

    /// Completes the part: every byte received, its CRC32C matching `client_crc` when
    /// given, every extent written; then it is part of the upload.
    pub async fn finish(mut self, client_crc: Option<u32>) -> Result<PartInfo> {
        if self.received != self.len {
            return Err(EngineError::Invalid(format!(
                "the part ended after {} of its {} bytes",
                self.received, self.len
            )));
        }
        if client_crc.is_some_and(|c| c != self.crc) {
            return Err(EngineError::Integrity(format!(
                "part CRC32C is {:08x}, not the {:08x} the client sent",
                self.crc,
                client_crc.unwrap_or_default()
            )));
        }
        while let Some(front) = self.x.in_flight.pop_front() {
            self.x.done.push(settle(front).await?);
        }
        let part = Part {
            extents: std::mem::take(&mut self.x.done),
            len: self.len,
            crc: self.crc,
            _pending: self.x._pending.take(),
        };
        let info = PartInfo {
            number: self.number,
            len: self.len,
            crc32c: self.crc,
        };
        let mut st = self.upload.state.lock();
        st.touched = Instant::now();
        st.parts.insert(self.number, part);
        Ok(info)
    }
}

impl crate::value::Pieces for PartWriter<'_> {
    fn next_piece_len(&self) -> usize {
        PartWriter::next_piece_len(self)
    }

    fn write_piece(
        &mut self,
        piece: StagedBlock,
    ) -> impl std::future::Future<Output = Result<()>> + Send {
        PartWriter::write_piece(self, piece)
    }
}
