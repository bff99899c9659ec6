//! Who may do what over CXP1: the access each op needs, namespaces scoped to the caller's
//! tenant, and the `Auth` exchange (nothing else is read before it succeeds).

use crate::auth::{Access, Principal};
use bytes::Bytes;
use ctxpod_client::proto_io::FrameInput;
use ctxpod_wire::proto::{
    status, Frame, Header, Op, PrefetchRequest, Request, Response, TOKEN_BYTES_MAX,
};

use super::conn::{Conn, Rd};

/// What each request op needs.
pub fn access_of_op(op: Op) -> Access {
    match op {
        Op::Put | Op::PutValue | Op::Pin | Op::Unpin => Access::Write,
        _ => Access::Read,
    }
}

/// Puts a request's namespace in the caller's tenant ([`Principal::scope`]).
pub(crate) fn scope_request(req: &mut Request, p: &Principal) -> Result<(), String> {
    let ns = match req {
        Request::Get { ns, .. }
        | Request::Match { ns, .. }
        | Request::Pin { ns, .. }
        | Request::Unpin { ns, .. }
        | Request::Put { ns, .. }
        | Request::PutValue(ctxpod_wire::proto::ValuePiece { ns, .. })
        | Request::GetValue { ns, .. }
        | Request::Prefetch(PrefetchRequest { ns, .. })
        | Request::Subscribe { ns } => ns,
        Request::Ping
        | Request::RegisterRegion { .. }
        | Request::Cancel { .. }
        | Request::Auth { .. } => return Ok(()),
    };
    *ns = p.scope(ns).map_err(|e| e.to_string())?;
    Ok(())
}

/// Answers one frame with an error after discarding its body.
pub(crate) async fn refuse(
    conn: &Conn,
    input: &mut FrameInput<Rd>,
    body_len: usize,
    op: Op,
    id: u64,
    st: u16,
    msg: &str,
) -> anyhow::Result<bool> {
    input.skip(body_len).await?;
    Ok(conn
        .send_one(Response::Error(msg.into()).encode(op, st, id))
        .await)
}

/// The `Auth` exchange: the principal, or `None` once a refusal is queued (the connection
/// then closes).
pub(crate) async fn authenticate(
    conn: &Conn,
    input: &mut FrameInput<Rd>,
    header: Header,
    body_len: usize,
) -> anyhow::Result<Option<Principal>> {
    let id = header.request_id;
    if body_len > 2 + TOKEN_BYTES_MAX {
        conn.send_one(Response::Error("token too long".into()).encode(
            Op::Auth,
            status::BAD_REQUEST,
            id,
        ))
        .await;
        return Ok(None);
    }
    let frame = Frame {
        header,
        body: input.take(body_len).await?,
    };
    let token = match Request::decode(&frame) {
        Ok(Request::Auth { token }) => token,
        _ => Bytes::new(),
    };
    match conn.auth.bearer(&token) {
        Ok(p) => {
            let ok = Response::Authenticated {
                role: p.role,
                tenant: p.tenant.as_deref().unwrap_or("").to_string(),
            };
            conn.send_one(ok.encode(Op::Auth, status::OK, id)).await;
            Ok(Some(p))
        }
        Err(e) => {
            conn.send_one(Response::Error(format!("unauthorized: {e}")).encode(
                Op::Auth,
                status::UNAUTHORIZED,
                id,
            ))
            .await;
            Ok(None)
        }
    }
}
