//! KV extras on the S3 door: what an object store cannot say, asked with a signed S3
//! request that S3 tools never send (a query parameter of ctxpod's own), so a KVBM-like
//! client finds a chain's cached prefix and holds it without leaving its S3 credentials.
//!
//! - `POST /{bucket}?x-ctxpod-match`, body `{"keys": [object keys…]}` (at most 4096): how many
//!   leading keys of the chain the pod holds, `{"matched": n}` (HTTP API v1's `match`).
//! - `POST /{bucket}?x-ctxpod-pin`, body `{"keys": […], "ttl_ms": n}`: lease those blocks
//!   against eviction until read (`pin`); `{"pinned": n}`.
//!
//! No PREFETCH: a prefetch pushes blocks into memory the client registered on its CXP1
//! connection, and an S3 client has no such memory or connection; its reads are GETs (ranged
//! or whole), which the door serves. A client that wants pushes uses the SDK or CXP1 with
//! the same blocks.

use super::door::Door;
use http::{HeaderMap, Method};
use s3s::{s3_error, Body, S3Request, S3Response, S3Result};

/// Which extra a request asks for.
fn extra_of(uri: &http::Uri) -> Option<&'static str> {
    let q = uri.query()?;
    q.split('&').find_map(|p| match p.split('=').next() {
        Some("x-ctxpod-match") => Some("match"),
        Some("x-ctxpod-pin") => Some("pin"),
        _ => None,
    })
}

/// The extras' route, checked by `s3s` after the request's signature.
pub struct Extras {
    pub door: Door,
    pub auth_enabled: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Body_ {
    keys: Vec<String>,
    #[serde(default)]
    ttl_ms: Option<u64>,
}

#[async_trait::async_trait]
impl s3s::route::S3Route for Extras {
    fn is_match(
        &self,
        method: &Method,
        uri: &http::Uri,
        _headers: &HeaderMap,
        _extensions: &mut http::Extensions,
    ) -> bool {
        let one_segment = uri.path().trim_start_matches('/').split('/').count() == 1;
        *method == Method::POST && one_segment && extra_of(uri).is_some()
    }

    /// The door's own rule (`s3s` does not apply its access check to a custom route): a
    /// SigV4 signature, presigned for at most 7 days; SigV2 refused.
    async fn check_access(&self, req: &mut S3Request<Body>) -> S3Result<()> {
        if self.auth_enabled {
            super::sigv4_only(&req.headers, &req.uri, req.credentials.is_some())?;
        }
        Ok(())
    }

    async fn call(&self, mut req: S3Request<Body>) -> S3Result<S3Response<Body>> {
        let what = extra_of(&req.uri).ok_or_else(|| s3_error!(InvalidRequest))?;
        let bucket = req.uri.path().trim_start_matches('/').to_string();
        let bucket = super::door::namespace(&bucket)?.to_string();
        let body = std::mem::take(&mut req.input);
        let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(
            body,
            super::S3_XML_BYTES_MAX * 2,
        ))
        .await
        .map_err(|e| s3_error!(InvalidRequest, "the body: {e}"))?
        .to_bytes();
        let b: Body_ = serde_json::from_slice(&body)
            .map_err(|e| s3_error!(InvalidArgument, "a JSON body {{\"keys\": [...]}}: {e}"))?;
        if b.keys.len() > ctxpod_wire::MATCH_KEYS_MAX {
            return Err(s3_error!(
                InvalidArgument,
                "at most {} keys",
                ctxpod_wire::MATCH_KEYS_MAX
            ));
        }
        let keys = b
            .keys
            .iter()
            .map(|k| super::door::block_key(k))
            .collect::<S3Result<Vec<String>>>()?;
        let json = match (what, b.ttl_ms) {
            ("pin", Some(ttl)) => serde_json::json!({ "keys": keys, "ttl_ms": ttl }),
            ("pin", None) => return Err(s3_error!(InvalidArgument, "a pin needs ttl_ms")),
            _ => serde_json::json!({ "keys": keys }),
        };
        let mut h = HeaderMap::new();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        let path = format!("/v1/namespaces/{bucket}/{what}");
        let resp = self
            .door
            .send(
                &req,
                Method::POST,
                path,
                h,
                axum::body::Body::from(json.to_string()),
            )
            .await?;
        let r = if resp.status().is_success() {
            let body = axum::body::to_bytes(resp.into_body(), 64 << 10)
                .await
                .map_err(|e| s3_error!(InternalError, "{e}"))?;
            let mut out = S3Response::new(Body::from(body));
            out.headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            Ok(out)
        } else {
            Err(super::door::refusal(resp, false).await)
        };
        self.door.count(
            if what == "pin" {
                "x-ctxpod-pin"
            } else {
                "x-ctxpod-match"
            },
            &r,
        );
        r
    }
}
