//! ListObjectsV2 over the key listing (`meta=true`), delimiters folded into common prefixes.

use super::*;

/// What a listing gathered: its objects and common prefixes, the last key (or skipped
/// common prefix) it passed, and whether it ran out of keys (else it stopped at
/// `max_keys`).
struct Listing {
    contents: Vec<Object>,
    prefixes: Vec<String>,
    last: Option<Vec<u8>>,
    done: bool,
}

/// The listing's cursor: the continuation token (hex of the last key or common prefix
/// answered), else StartAfter.
fn cursor_of(i: &ListObjectsV2Input) -> S3Result<Option<Vec<u8>>> {
    Ok(match (&i.continuation_token, &i.start_after) {
        (Some(t), _) => Some(
            hex::decode(t)
                .map_err(|_| s3_error!(InvalidArgument, "a malformed continuation token"))?,
        ),
        (None, Some(s)) if !s.is_empty() => Some(s.as_bytes().to_vec()),
        _ => None,
    })
}

/// The S3 object of key `name`, from its block's entry in the listing.
fn object_of(name: &str, b: &ctxpod_wire::types::ListedBlock) -> Object {
    let crc = ctxpod_wire::parse_crc32c_hex(&b.crc32c).unwrap_or_default();
    Object {
        key: Some(name.to_string()),
        size: Some(b.len as i64),
        e_tag: Some(ETag::Strong(hex::encode(crc.to_be_bytes()))),
        last_modified: Some(Timestamp::from(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(b.stored_ms),
        )),
        ..Default::default()
    }
}

impl Door {
    pub(super) async fn list(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let i = &req.input;
        let ns = namespace(&i.bucket)?;
        let max_keys = i.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let prefix = i.prefix.clone().unwrap_or_default();
        if prefix.len() > ctxpod_wire::KEY_BYTES_MAX {
            return Err(s3_error!(InvalidArgument, "a prefix longer than any key"));
        }
        let delimiter = i.delimiter.clone().filter(|d| !d.is_empty());
        let after = cursor_of(i)?;
        let Listing {
            contents,
            prefixes,
            last,
            done,
        } = self
            .walk(&req, ns, &prefix, delimiter.as_deref(), after, max_keys)
            .await?;
        let truncated = !done
            && max_keys > 0
            && match last.as_deref() {
                Some(l) if l.len() > ctxpod_wire::KEY_BYTES_MAX => false,
                l => !self
                    .list_page(&req, ns, prefix.as_bytes(), l, 1)
                    .await?
                    .keys
                    .is_empty(),
            };
        let next = if truncated {
            last.as_ref().map(hex::encode)
        } else {
            None
        };
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket.clone()),
            prefix: i.prefix.clone(),
            delimiter: i.delimiter.clone(),
            max_keys: Some(max_keys as i32),
            key_count: Some((contents.len() + prefixes.len()) as i32),
            is_truncated: Some(truncated),
            continuation_token: i.continuation_token.clone(),
            next_continuation_token: next,
            start_after: i.start_after.clone(),
            contents: Some(contents),
            common_prefixes: (!prefixes.is_empty()).then(|| {
                prefixes
                    .into_iter()
                    .map(|p| CommonPrefix { prefix: Some(p) })
                    .collect()
            }),
            ..Default::default()
        }))
    }

    /// Walks the keys under `prefix` past `after`, page by page, until `max_keys` objects
    /// and common prefixes are gathered or the keys run out; keys under a common prefix
    /// (up to `delimiter`) are skipped past at once.
    async fn walk<T>(
        &self,
        req: &S3Request<T>,
        ns: &str,
        prefix: &str,
        delimiter: Option<&str>,
        mut after: Option<Vec<u8>>,
        max_keys: usize,
    ) -> S3Result<Listing> {
        let mut contents = Vec::new();
        let mut prefixes: Vec<String> = Vec::new();
        let mut last: Option<Vec<u8>> = None;
        // Whether the listing ran out of keys (else it stopped at max_keys).
        let mut done = false;
        'pages: while contents.len() + prefixes.len() < max_keys {
            if after
                .as_ref()
                .is_some_and(|a| a.len() > ctxpod_wire::KEY_BYTES_MAX)
            {
                // Past every key a cursor this long could precede.
                done = true;
                break;
            }
            let want = max_keys - contents.len() - prefixes.len();
            let page = self
                .list_page(req, ns, prefix.as_bytes(), after.as_deref(), want)
                .await?;
            for (k, b) in page.keys.iter().zip(page.blocks.unwrap_or_default()) {
                last = Some(k.clone());
                // Keys that are not UTF-8 (stored through the other APIs) have no S3 name.
                let Ok(name) = std::str::from_utf8(k) else {
                    continue;
                };
                if let Some(d) = delimiter {
                    if let Some(at) = name[prefix.len()..].find(d) {
                        let cp = &name[..prefix.len() + at + d.len()];
                        prefixes.push(cp.to_string());
                        // Skip the rest of the common prefix: every key under it sorts
                        // before the prefix followed by 0xff bytes up to the longest key.
                        let mut skip = cp.as_bytes().to_vec();
                        skip.resize(ctxpod_wire::KEY_BYTES_MAX.max(skip.len()), 0xff);
                        last = Some(skip);
                        after = last.clone();
                        continue 'pages;
                    }
                }
                contents.push(object_of(name, &b));
            }
            if page.next.is_none() {
                done = true;
                break;
            }
            after = last.clone();
        }
        Ok(Listing {
            contents,
            prefixes,
            last,
            done,
        })
    }

    /// One page of the bucket's keys with their blocks' entries (the HTTP listing).
    async fn list_page<T>(
        &self,
        req: &S3Request<T>,
        ns: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> S3Result<ctxpod_client::client::KeyPage> {
        let path = format!(
            "/v1/namespaces/{ns}/blocks?{}&meta=true",
            ctxpod_client::client::list_query(prefix, after, limit)
        );
        let page: ctxpod_wire::types::KeyList = self.get_json(req, path, 4 << 20).await?;
        ctxpod_client::client::KeyPage::from_wire(page, limit)
            .map_err(|e| s3_error!(InternalError, "{e}"))
    }
}
