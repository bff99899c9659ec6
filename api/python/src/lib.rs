//! `ctxpod._ctxpod`, the native half of the Python SDK: the CXP1 pod client
//! ([`ctxpod_client::transfer_pod::TransferPod`]) behind a small, argument-checked surface
//! that the pure-Python `ctxpod` package wraps (keys, buffers and errors are normalised
//! there). Every call that waits on the network releases the GIL (`Python::detach`) and
//! runs on one shared tokio runtime; caller memory registered as a buffer becomes a CXP1
//! region ([`ctxpod_client::region::Region::from_raw`]) that prefetches push into, kept
//! alive by a reference to the Python object (and its buffer export) for as long as the
//! client may write to it.

use ctxpod_client::transfer_client::direct::on_caller_thread;
use ctxpod_client::transfer_client::TransferError;
use pyo3::prelude::*;
use std::sync::OnceLock;

mod buffers;
mod l2;
mod store;
mod ticket;

/// Worker threads of the SDK's runtime: the I/O of every store in the process.
const WORKERS: usize = 2;

pub(crate) fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .thread_name("ctxpod-io")
            .enable_all()
            .build()
            .expect("the ctxpod I/O runtime starts")
    })
}

/// Runs `f` on the runtime with the GIL released. This thread waits for it, so small
/// reads are answered on it directly (`transfer_client::direct`): one wake-up instead of
/// two.
pub(crate) fn block<F>(py: Python<'_>, f: F) -> F::Output
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    py.detach(|| on_caller_thread(|| rt().block_on(f)))
}

/// The exception class (in `ctxpod.errors`) for an HTTP-like status.
fn class_of_status(status: u16) -> &'static str {
    match status {
        400 => "InvalidRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        413 => "TooLarge",
        422 => "Corrupt",
        429 => "RateLimited",
        499 => "Cancelled",
        503 => "Busy",
        504 => "DeadlineExceeded",
        507 => "NoSpace",
        _ => "CtxpodError",
    }
}

/// The `ctxpod.errors` exception for an SDK failure, with its status (or `None`).
pub(crate) fn error(e: TransferError) -> PyErr {
    use ctxpod_client::client::ClientError;
    let (class, status) = match &e {
        TransferError::Refused { status, .. } => (class_of_status(*status), Some(*status)),
        TransferError::Http(ClientError::Status { status, .. }) => {
            (class_of_status(*status), Some(*status))
        }
        TransferError::Io(_)
        | TransferError::Closed
        | TransferError::TimedOut { .. }
        | TransferError::Tls(_)
        | TransferError::Http(ClientError::Transport(_)) => ("Unavailable", None),
        TransferError::AuthRequired => ("Unauthorized", Some(401)),
        TransferError::Corrupt(_) | TransferError::Http(ClientError::Integrity { .. }) => {
            ("Corrupt", Some(422))
        }
        TransferError::TooLarge { .. } => ("TooLarge", Some(413)),
        TransferError::Region(_)
        | TransferError::UnknownRegion(_)
        | TransferError::Http(ClientError::Invalid(_)) => ("InvalidRequest", None),
        TransferError::Proto(_)
        | TransferError::Unexpected(_)
        | TransferError::Http(ClientError::Malformed(_)) => ("ProtocolError", None),
    };
    raise(class, &e.to_string(), status)
}

/// An instance of `ctxpod.errors.<class>(message, status)`.
pub(crate) fn raise(class: &str, message: &str, status: Option<u16>) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("ctxpod.errors")
            .and_then(|m| m.getattr(class))
            .and_then(|c| c.call1((message, status)));
        match made {
            Ok(v) => PyErr::from_value(v),
            Err(e) => e,
        }
    })
}

pub(crate) fn invalid(message: impl AsRef<str>) -> PyErr {
    raise("InvalidRequest", message.as_ref(), None)
}

/// Dynamo's sequence hashes of every complete block of `tokens` (see
/// `ctxpod_wire::block_hash`).
#[pyfunction]
#[pyo3(signature = (tokens, block_size, salt=None, lora=None))]
fn dynamo_block_hashes(
    tokens: Vec<u32>,
    block_size: usize,
    salt: Option<&str>,
    lora: Option<&str>,
) -> PyResult<Vec<u64>> {
    if block_size == 0 {
        return Err(invalid("block_size must be at least 1"));
    }
    let seed = ctxpod_wire::block_hash::salt_hash(salt, lora);
    Ok(ctxpod_wire::block_hash::sequence_hashes(
        &tokens, block_size, seed,
    ))
}

#[pymodule]
fn _ctxpod(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Store>()?;
    m.add_class::<l2::L2>()?;
    m.add_class::<buffers::Buffer>()?;
    m.add_class::<ticket::Ticket>()?;
    m.add_class::<ticket::Events>()?;
    m.add_function(wrap_pyfunction!(dynamo_block_hashes, m)?)?;
    m.add("KEY_BYTES_MAX", ctxpod_wire::KEY_BYTES_MAX)?;
    use ctxpod_client::connect::{CONNECT_DEADLINE, DOWN_FOR, REQUEST_DEADLINE};
    m.add("CONNECT_TIMEOUT_S", CONNECT_DEADLINE.as_secs_f64())?;
    m.add("REQUEST_TIMEOUT_S", REQUEST_DEADLINE.as_secs_f64())?;
    m.add("DOWN_FOR_S", DOWN_FOR.as_secs_f64())?;
    m.add(
        "DIRECT_CONNECTIONS",
        ctxpod_client::connect::DIRECT_CONNECTIONS,
    )?;
    m.add("DIRECT_CONNECTIONS_MAX", store::DIRECT_CONNECTIONS_MAX)?;
    m.add("BLOCK_BYTES_MAX", ctxpod_wire::BLOCK_BYTES_MAX)?;
    m.add("MATCH_KEYS_MAX", ctxpod_wire::MATCH_KEYS_MAX)?;
    m.add("LIST_KEYS_MAX", ctxpod_wire::LIST_KEYS_MAX)?;
    m.add("PREFETCH_LEASE_MS_MAX", ctxpod_wire::PREFETCH_LEASE_MS_MAX)?;
    m.add("LEASE_MS_MAX", ctxpod_wire::LEASE_MS_MAX)?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
