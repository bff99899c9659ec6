//! Direct calls: a small read answered on the thread that waits for it.
//!
//! On the shared connection an answer costs two thread wake-ups: the runtime worker that
//! the socket wakes, which reads the frame and hands it over, then the caller. A caller that
//! blocks until its answer anyway (the Python SDK's thread, waiting with the GIL released)
//! can instead write its request on a connection of its own and read the answer itself,
//! blocked in `recv`: one wake-up, as redis-py's calls are. That is what a [`Lane`] does:
//! a few extra connections to the same node, each carrying one call at a time, taken from
//! an idle list and given back.
//!
//! Only where it cannot hurt:
//! - on threads marked by [`on_caller_thread`] (never a runtime worker: the call blocks its
//!   thread), and not inside [`side_by_side`] (calls that run together in one future, one
//!   per member of a round, must not wait for each other);
//! - `Get` requests only (reads: asking again on a fresh connection is harmless), over plain
//!   TCP (a TLS connection keeps the shared path);
//! - while a lane has a connection free (at most
//!   [`Connect::direct_connections`](crate::connect::Connect), default
//!   [`DIRECT_CONNECTIONS`](crate::connect::DIRECT_CONNECTIONS)); otherwise, or while
//!   opening one fails, the call takes the shared connection as before.
//!
//! Deadlines are the shared connection's: opening within the connect deadline, each call
//! within the request deadline (every `send` and `recv` bounded by what is left of it);
//! a call past it fails [`TransferError::TimedOut`] and its connection is dropped. A
//! connection the node closed while it sat idle (its idle timeout) is noticed by the next
//! call on it before any of its answer arrived, and that call is made once more on a new
//! connection.

use super::*;
use std::cell::Cell;
use std::io::Write;
use std::net::ToSocketAddrs;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::AtomicUsize;
use std::task::{Context, Poll};
use std::time::Instant;

/// How long a lane whose connection could not be opened sends every call the shared way.
const OFF_AFTER_FAILURE: Duration = Duration::from_secs(10);

thread_local! {
    static CALLER: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with direct calls allowed on this thread: a thread that is not a runtime worker
/// and waits for `f` anyway (it runs `Runtime::block_on` inside). A direct call blocks it.
pub fn on_caller_thread<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALLER.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CALLER.with(|c| c.replace(true)));
    f()
}

/// Whether a call made now may go direct.
pub(crate) fn allowed() -> bool {
    CALLER.with(Cell::get)
}

/// `f` polled with direct calls not allowed: for futures that run several calls at once
/// (a blocking one would hold the others back).
pub(crate) async fn side_by_side<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| {
        let was = CALLER.with(|c| c.replace(false));
        let r = f.as_mut().poll(cx);
        CALLER.with(|c| c.set(was));
        r
    })
    .await
}

/// The extra connections of one [`TransferClient`] for direct calls.
pub(crate) struct Lane {
    addr: String,
    token: Option<String>,
    deadlines: crate::connect::Deadlines,
    idle: Mutex<Vec<Conn>>,
    /// Connections open, idle or in a call, and the most there may be.
    open: AtomicUsize,
    max: usize,
    /// Until when calls go the shared way (a connection could not be opened).
    off_until: Mutex<Option<Instant>>,
    /// Calls answered directly (a count that may be shared with other lanes).
    pub(crate) calls: Arc<AtomicU64>,
}

/// A socket used from the calling thread: reads and writes block (never `Pending`), each
/// bounded by what is left until `deadline`.
struct Blocking {
    sock: std::net::TcpStream,
    deadline: Instant,
    /// The timeout this side's `recv`s (or `send`s) have now, if set.
    armed: Option<Duration>,
}

/// How far from its deadline a blocked call may end: a socket timeout that ends within it
/// is left as it is (no system call to set it again on every call).
const ARM_SLACK: Duration = Duration::from_millis(5);

impl Blocking {
    fn new(sock: std::net::TcpStream, deadline: Instant) -> Blocking {
        Blocking {
            sock,
            deadline,
            armed: None,
        }
    }

    /// Sets this side's socket timeout (`set`) so that a blocked call ends at the deadline
    /// (within [`ARM_SLACK`]); an error once the deadline passed. A call that times out
    /// early is simply made again.
    fn arm(
        &mut self,
        set: fn(&std::net::TcpStream, Option<Duration>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let now = Instant::now();
        let left = match self.deadline.checked_duration_since(now) {
            Some(d) if !d.is_zero() => d,
            _ => return Err(std::io::ErrorKind::TimedOut.into()),
        };
        // Left alone when it ends within the slack either side of the deadline.
        if self
            .armed
            .is_some_and(|a| a <= left + ARM_SLACK && left <= a + ARM_SLACK)
        {
            return Ok(());
        }
        set(&self.sock, Some(left))?;
        self.armed = Some(left);
        Ok(())
    }
}

/// A `send`/`recv` that ran into its socket timeout says `WouldBlock`.
fn would_block(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock
}

impl tokio::io::AsyncRead for Blocking {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        Poll::Ready(loop {
            if let Err(e) = this.arm(std::net::TcpStream::set_read_timeout) {
                break Err(e);
            }
            // SAFETY: nothing uninitialised is read: `recv` only writes into it, and exactly
            // the `n` bytes it reports are marked initialised and filled.
            let dst = unsafe { buf.unfilled_mut() };
            let (fd, at, len) = (this.sock.as_raw_fd(), dst.as_mut_ptr().cast(), dst.len());
            // SAFETY: `at` is `len` writable bytes (the unfilled part), `fd` an open socket.
            let n = unsafe { libc::recv(fd, at, len, 0) };
            if n >= 0 {
                let n = n as usize;
                // SAFETY: the kernel wrote these `n` bytes.
                unsafe { buf.assume_init(n) };
                buf.advance(n);
                break Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted && !would_block(&e) {
                break Err(e);
            }
        })
    }
}

impl Blocking {
    fn write_with(
        &mut self,
        f: impl Fn(&mut std::net::TcpStream) -> std::io::Result<usize>,
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(loop {
            if let Err(e) = self.arm(std::net::TcpStream::set_write_timeout) {
                break Err(e);
            }
            match f(&mut self.sock) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted || would_block(&e) => {}
                r => break r,
            }
        })
    }
}

impl tokio::io::AsyncWrite for Blocking {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().write_with(|s| s.write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.get_mut().write_with(|s| s.write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// One direct connection: its frames read with the same [`FrameInput`] as the shared one's.
struct Conn {
    input: FrameInput<Blocking>,
    out: Blocking,
}

/// Why a call on a connection failed: `stale` when nothing of its answer had been read
/// (the node may have closed the connection while it sat idle), so it may be made again.
struct Failure {
    error: TransferError,
    stale: bool,
}

impl Conn {
    fn set_deadline(&mut self, deadline: Instant) {
        self.input.reader_mut().deadline = deadline;
        self.out.deadline = deadline;
    }

    /// Sends one request (its frame's parts) and reads its answer: its status and response.
    async fn round_trip(&mut self, id: u64, parts: &[&[u8]]) -> Result<(u16, Response), Failure> {
        let stale = |e: std::io::Error| Failure {
            stale: e.kind() != std::io::ErrorKind::TimedOut,
            error: e.into(),
        };
        write_parts(&mut self.out, parts).await.map_err(stale)?;
        let (header, body_len) = match self.input.next_header().await {
            Ok(Some(h)) => h,
            Ok(None) => {
                return Err(Failure {
                    error: TransferError::Closed,
                    stale: true,
                })
            }
            Err(InputError::Io(e)) => return Err(stale(e)),
            Err(InputError::Framing(e)) => return Err(failed(e)),
        };
        // One call at a time on this connection, none that streams: its one frame answers it.
        if header.request_id != id || matches!(header.op, Op::Push | Op::GetValue | Op::Event) {
            return Err(failed(TransferError::Unexpected(header.op)));
        }
        let body = self.input.take(body_len).await.map_err(failed)?;
        let frame = proto::Frame { header, body };
        let resp = Response::decode(&frame).map_err(failed)?;
        Ok((header.status, resp))
    }
}

fn failed(e: impl Into<TransferError>) -> Failure {
    Failure {
        error: e.into(),
        stale: false,
    }
}

/// The error for a direct call that ran past its deadline (the shared path's words).
fn deadline_error(e: TransferError, req: &Request, after: Duration) -> TransferError {
    match e {
        TransferError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
            TransferError::TimedOut {
                what: format!("a CXP1 {:?} request", req.op()),
                which: "request",
                after,
            }
        }
        e => e,
    }
}

impl Lane {
    /// A lane to the node at `addr` (its connections open on first use); `None` over TLS
    /// or when `how` allows no direct connection.
    pub(crate) fn new(
        addr: &str,
        how: &crate::connect::Connect,
        calls: Arc<AtomicU64>,
    ) -> Option<Lane> {
        let max = how.direct_connections;
        (how.tls.is_none() && max > 0).then(|| Lane {
            max,
            addr: addr.to_string(),
            token: how.token.clone(),
            deadlines: how.deadlines,
            idle: Mutex::new(Vec::new()),
            open: AtomicUsize::new(0),
            off_until: Mutex::new(None),
            calls,
        })
    }

    /// Whether `req` may go direct from this thread now.
    pub(crate) fn takes(&self, req: &Request) -> bool {
        allowed() && matches!(req, Request::Get { .. })
    }

    /// Makes the call `id` (`req`, encoded as `parts`) on a connection of the lane: its
    /// status and response, or `None` when the lane has no connection for it (the caller
    /// then takes the shared connection).
    pub(crate) async fn call(
        &self,
        id: u64,
        req: &Request,
        parts: &[&[u8]],
    ) -> Option<Result<(u16, Response), TransferError>> {
        let after = self.deadlines.request;
        let deadline = Instant::now() + after;
        let idle = self.idle.lock().expect("lane").pop();
        let (mut conn, mut reused) = match idle {
            Some(c) => (c, true),
            None => match self.open_conn().await {
                Ok(Some(c)) => (c, false),
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            },
        };
        loop {
            conn.set_deadline(deadline);
            match conn.round_trip(id, parts).await {
                Ok(answer) => {
                    self.idle.lock().expect("lane").push(conn);
                    self.calls.fetch_add(1, Ordering::Relaxed);
                    return Some(Ok(answer));
                }
                Err(f) => {
                    self.discard(conn);
                    if !(f.stale && reused) {
                        return Some(Err(deadline_error(f.error, req, after)));
                    }
                    // Closed while idle: once more on a new connection, same deadline.
                    conn = match self.open_conn().await {
                        Ok(Some(c)) => c,
                        Ok(None) => return None,
                        Err(e) => return Some(Err(e)),
                    };
                    reused = false;
                }
            }
        }
    }

    fn discard(&self, conn: Conn) {
        drop(conn);
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    /// A new connection, hello exchanged and token presented, within the connect deadline.
    /// `Ok(None)` when the lane is full or off, or the node closed or refused the
    /// connection once it was open (over its connection limits, a token refused): the lane
    /// is then off for a while and calls take the shared connection. A node that cannot be
    /// reached at all (refused, or no answer within the deadline) is the call's failure, as
    /// on the shared path: it costs one deadline, not two.
    async fn open_conn(&self) -> Result<Option<Conn>, TransferError> {
        let off = *self.off_until.lock().expect("lane");
        if off.is_some_and(|t| Instant::now() < t) {
            return Ok(None);
        }
        if self.open.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.open.fetch_sub(1, Ordering::Relaxed);
            return Ok(None);
        }
        let e = match self.connect().await {
            Ok(c) => return Ok(Some(c)),
            Err(e) => e,
        };
        self.open.fetch_sub(1, Ordering::Relaxed);
        *self.off_until.lock().expect("lane") = Some(Instant::now() + OFF_AFTER_FAILURE);
        match e {
            TransferError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                Err(TransferError::TimedOut {
                    what: format!("connecting to {}", self.addr),
                    which: "connect",
                    after: self.deadlines.connect,
                })
            }
            TransferError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                Err(io.into())
            }
            _ => Ok(None),
        }
    }

    async fn connect(&self) -> Result<Conn, TransferError> {
        let deadline = Instant::now() + self.deadlines.connect;
        let mut last = None;
        let mut sock = None;
        for a in self.addr.to_socket_addrs()? {
            let left = deadline
                .checked_duration_since(Instant::now())
                .ok_or(std::io::Error::from(std::io::ErrorKind::TimedOut))?;
            match std::net::TcpStream::connect_timeout(&a, left) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let sock = match (sock, last) {
            (Some(s), _) => s,
            (None, Some(e)) => return Err(e.into()),
            (None, None) => return Err(std::io::Error::from(std::io::ErrorKind::NotFound).into()),
        };
        sock.set_nodelay(true)?;
        let mut out = Blocking::new(sock.try_clone()?, deadline);
        let mut rd = Blocking::new(sock, deadline);
        let theirs = exchange_hellos(&mut rd, &mut out).await?;
        let needs_auth = theirs.flags & proto::HELLO_AUTH_REQUIRED != 0;
        let mut conn = Conn {
            input: FrameInput::new(rd, proto::FRAME_BYTES_MAX),
            out,
        };
        match &self.token {
            None if needs_auth => return Err(TransferError::AuthRequired),
            None => {}
            Some(t) => {
                let req = Request::Auth {
                    token: Bytes::copy_from_slice(t.as_bytes()),
                };
                let parts = req.encode_parts(0);
                let parts: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
                match conn.round_trip(0, &parts).await.map_err(|f| f.error)? {
                    (_, Response::Authenticated { .. }) => {}
                    (status, Response::Error(message)) => {
                        return Err(TransferError::Refused { status, message })
                    }
                    (_, r) => return Err(TransferError::Unexpected(r.op())),
                }
            }
        }
        Ok(conn)
    }
}
