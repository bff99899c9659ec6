//! Connections: how many each listener holds (in all and per peer address), how long one
//! may sit idle, how long an HTTP request's head may take, how many TLS handshakes run at
//! once; and the HTTP server loop that applies them (hyper, with axum's router as the
//! service).
//!
//! Over a cap a connection is accepted and closed at once (refused fast, never queued),
//! and counted in `ctxpod_connections_refused_total{listener, why}`; the connections held
//! are `ctxpod_connections{listener}`.

use crate::metrics::NodeMetrics;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;

/// A connection's byte stream, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The limits of one listener (from `Config`: `connections_max`, …).
#[derive(Clone, Debug)]
pub struct Limits {
    pub max: usize,
    pub per_peer_max: usize,
    /// A connection that moves no byte either way for this long is closed.
    pub idle: Duration,
    /// An HTTP request head (request line and headers) must arrive within this.
    pub header_read: Duration,
}

impl Limits {
    pub fn from_config(cfg: &ctxpod_format::config::Config) -> Limits {
        Limits {
            max: cfg.connections_max,
            per_peer_max: cfg.connections_per_peer_max,
            idle: Duration::from_secs(cfg.idle_timeout_s.max(1)),
            header_read: Duration::from_secs(cfg.header_read_timeout_s.max(1)),
        }
    }
}

/// Admission of connections to one listener.
pub struct Gate {
    pub name: &'static str,
    pub limits: Limits,
    state: parking_lot::Mutex<(usize, HashMap<IpAddr, usize>)>,
    /// The node's series: its connection gauges and refusals, and the rest of the node's
    /// for the connections it admits.
    pub metrics: Arc<NodeMetrics>,
}

/// A connection's place in its [`Gate`], given back when dropped.
pub struct Admitted {
    gate: Arc<Gate>,
    peer: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut s = self.gate.state.lock();
        s.0 -= 1;
        if let Some(n) = s.1.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                s.1.remove(&self.peer);
            }
        }
        self.gate
            .metrics
            .connections
            .with_label_values(&[self.gate.name])
            .set(s.0 as i64);
    }
}

impl Gate {
    pub fn new(name: &'static str, limits: Limits, metrics: Arc<NodeMetrics>) -> Arc<Gate> {
        Arc::new(Gate {
            name,
            limits,
            state: parking_lot::Mutex::new((0, HashMap::new())),
            metrics,
        })
    }

    /// A place for a connection from `peer`, or why not (`listener` or `peer`: which cap),
    /// counted.
    pub fn admit(self: &Arc<Gate>, peer: IpAddr) -> Result<Admitted, &'static str> {
        let mut s = self.state.lock();
        let why = if s.0 >= self.limits.max {
            Some("listener")
        } else if s.1.get(&peer).copied().unwrap_or(0) >= self.limits.per_peer_max {
            Some("peer")
        } else {
            None
        };
        if let Some(why) = why {
            self.metrics
                .connections_refused
                .with_label_values(&[self.name, why])
                .inc();
            return Err(why);
        }
        s.0 += 1;
        *s.1.entry(peer).or_default() += 1;
        self.metrics
            .connections
            .with_label_values(&[self.name])
            .set(s.0 as i64);
        Ok(Admitted {
            gate: self.clone(),
            peer,
        })
    }

    /// The next connection `listener` accepts within the caps, with its place; those over a
    /// cap are closed at once (dropped) and counted. Accept errors (out of descriptors, …)
    /// are logged and retried after a pause.
    pub async fn accept(
        self: &Arc<Gate>,
        listener: &tokio::net::TcpListener,
    ) -> (tokio::net::TcpStream, std::net::SocketAddr, Admitted) {
        loop {
            let (sock, addr) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(listener = self.name, "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if let Ok(place) = self.admit(addr.ip()) {
                let _ = sock.set_nodelay(true);
                return (sock, addr, place);
            }
        }
    }

    /// Counts a connection refused or closed for `why` (`idle`, `handshakes`).
    pub fn count(&self, why: &str) {
        self.metrics
            .connections_refused
            .with_label_values(&[self.name, why])
            .inc();
    }
}

/// TLS handshakes running at once, node-wide (both listeners); more are refused.
pub struct Handshakes(Arc<Semaphore>);

impl Handshakes {
    pub fn new(max: usize) -> Arc<Handshakes> {
        Arc::new(Handshakes(Arc::new(Semaphore::new(max.max(1)))))
    }

    pub fn try_start(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.0.clone().try_acquire_owned().ok()
    }
}

/// A byte stream that fails with `TimedOut` once it has moved no byte, either way, for
/// `idle` while someone waits on it: a client that stops sending and stops reading is let
/// go, and what its requests held with it. Holds the connection's place in its gate.
pub struct IdleIo<T> {
    inner: T,
    idle: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    gate: Arc<Gate>,
    timed_out: bool,
    _place: Admitted,
}

impl<T> IdleIo<T> {
    pub fn new(inner: T, place: Admitted) -> IdleIo<T> {
        let idle = place.gate.limits.idle;
        IdleIo {
            inner,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            gate: place.gate.clone(),
            timed_out: false,
            _place: place,
        }
    }

    fn moved(&mut self) {
        let at = tokio::time::Instant::now() + self.idle;
        self.deadline.as_mut().reset(at);
    }

    /// While waiting: has the deadline passed?
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.timed_out || self.deadline.as_mut().poll(cx).is_ready() {
            if !self.timed_out {
                self.timed_out = true;
                self.gate.count("idle");
            }
            return true;
        }
        false
    }
}

impl<T> IdleIo<T> {
    /// A write's outcome: bytes written are progress; a write that waits past the
    /// deadline fails.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.moved();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection idle too long")
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        self.after_write(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.after_write(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(timed_out())),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves `app` on the connections `conns` yields (plain or TLS, each with its
/// [`PeerInfo`], already admitted by their gate), each under its idle timeout
/// and the HTTP/1 header-read timeout, until `shutdown` completes; then lets the
/// connections finish their requests (30 s at most).
pub async fn serve_http(
    mut conns: tokio::sync::mpsc::Receiver<(BoxIo, PeerInfo, Admitted)>,
    app: axum::Router,
    header_read: Duration,
    shutdown: impl Future<Output = ()>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read);
    builder.http2().timer(TokioTimer::new());
    tokio::pin!(shutdown);
    loop {
        let (io, peer, place) = tokio::select! {
            c = conns.recv() => match c {
                Some(c) => c,
                None => break,
            },
            _ = &mut shutdown => break,
        };
        let app = app.clone();
        let svc =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer.clone()));
                let app = app.clone();
                async move {
                    use tower::ServiceExt;
                    app.oneshot(req.map(axum::body::Body::new)).await
                }
            });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(IdleIo::new(io, place)), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!("HTTP connection ended: {e}");
            }
        });
    }
    // In-flight requests are answered; idle connections are closed.
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(30)) => {
            tracing::warn!("connections still open 30 s after shutdown began; closing");
        }
    }
}

/// Who is at the other end of a connection.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    pub addr: SocketAddr,
    /// The common name of the client certificate the handshake verified, if any.
    pub subject: Option<Arc<str>>,
    /// The connection's TCP socket, open as long as the connection is served (its
    /// requests' handlers run inside it): what [`client_gone`] asks.
    pub fd: std::os::fd::RawFd,
}

/// Whether the client has closed or reset the connection (its FIN or RST arrived), though
/// what it sent before may still wait to be read. A client gives up on a request at its
/// deadline by closing (HTTP: a forwarding node's member request past its stall bound) or
/// resetting (CXP1) the connection; a write it sent then must not be applied late: a put
/// that waited in a frozen node's socket buffers would land after a delete the client made
/// since (api/PROTOCOL.md, "Deadlines"). `fd` must be the connection's open socket.
pub(crate) fn client_gone(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout; `fd` is open (the caller holds the socket).
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// A connection's byte stream, plain or TLS.
pub type BoxIo = Box<dyn Io>;
