//! The key-encryption key at rest (the `kek` file) and the re-wrap of every data key under
//! a new one.

use crate::crypto::{self, AeadKey};
use crate::index::{self, Index};
use anyhow::Context;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The KEK file holds 64 hex digits (or 32 raw bytes). Created 0600 on first start.
pub(super) fn load_or_create_kek(path: &Path) -> anyhow::Result<crypto::KeyBytes> {
    if !path.exists() {
        let key = crypto::random_key();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("create key-encryption key {}", path.display()))?;
        writeln!(
            f,
            "{}",
            zeroize::Zeroizing::new(hex::encode(key.as_slice())).as_str()
        )?;
        f.sync_all()?;
        tracing::info!(path = %path.display(), "created a new key-encryption key (mode 0600)");
    }
    read_kek(path)
}

/// Reads a KEK file: 64 hex digits or 32 raw bytes.
pub(crate) fn read_kek(path: &Path) -> anyhow::Result<crypto::KeyBytes> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("key-encryption key {}", path.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!(path = %path.display(), "key-encryption key file is readable by group or others");
    }
    let raw = zeroize::Zeroizing::new(
        std::fs::read(path)
            .with_context(|| format!("read key-encryption key {}", path.display()))?,
    );
    let text = zeroize::Zeroizing::new(String::from_utf8_lossy(&raw).into_owned());
    let key: [u8; 32] = if let Ok(k) = hex::decode(text.trim()).map(zeroize::Zeroizing::new) {
        k.as_slice()
            .try_into()
            .map_err(|_| anyhow::anyhow!("key-encryption key {} is not 32 bytes", path.display()))?
    } else {
        raw.as_slice().try_into().map_err(|_| {
            anyhow::anyhow!(
                "key-encryption key {} must be 64 hex digits or 32 bytes",
                path.display()
            )
        })?
    };
    Ok(crypto::KeyBytes::new(key))
}

/// Re-wraps under `kek`, in one synced write, every data key that only `previous` unwraps
/// (a KEK rotation, online or finished at start); how many.
pub(crate) fn rewrap_deks(
    index: &Index,
    kek: &AeadKey,
    previous: Option<&AeadKey>,
) -> anyhow::Result<usize> {
    let Some(previous) = previous else {
        return Ok(0);
    };
    let cf_keys = index.cf(index::CF_KEYS);
    let mut wb = rocksdb::WriteBatch::default();
    let mut n = 0;
    for item in index.db.iterator_cf(cf_keys, rocksdb::IteratorMode::Start) {
        let (k, wrapped) = item?;
        if k.len() != 8 {
            continue;
        }
        let ns_id = u32::from_be_bytes(k[..4].try_into()?);
        let key_id = u32::from_be_bytes(k[4..8].try_into()?);
        if crypto::unwrap_dek(kek, ns_id, key_id, &wrapped).is_ok() {
            continue;
        }
        let dek = crypto::unwrap_dek(previous, ns_id, key_id, &wrapped).map_err(|_| {
            anyhow::anyhow!(
                "data key {key_id} of namespace id {ns_id} unwraps with neither the \
                 key-encryption key nor the previous one"
            )
        })?;
        wb.put_cf(cf_keys, &k, crypto::wrap_dek(kek, ns_id, key_id, &dek));
        n += 1;
    }
    if n > 0 {
        index.write(wb, index::WriteMode::Wal { sync: true })?;
    }
    Ok(n)
}
