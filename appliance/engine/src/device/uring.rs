//! io_uring engine: one thread owns the ring; callers hand it operations through a queue and
//! an eventfd, and get their buffer back through a oneshot channel when the I/O completes.
//!
//! The thread keeps every buffer alive until its completion arrives (the kernel writes into
//! it), resubmits short transfers for the remainder, and keeps up to [`RING_DEPTH`]` - 1`
//! operations in flight; more wait in a backlog.

use super::{
    check_aligned, check_vectored, iovecs_from, AlignedBuf, Device, DeviceInfo, FlushFuture,
    IoFuture, VecIoFuture,
};
use io_uring::{opcode, types, IoUring};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::oneshot;

/// Submission queue entries of the ring; one slot is the eventfd read.
pub const RING_DEPTH: u32 = 256;
const EVENTFD_TOKEN: u64 = u64::MAX;

enum Kind {
    Read,
    Write,
    /// A write with `RWF_DSYNC`: durable on completion.
    WriteDurable,
    Flush,
}

/// What an operation reads into or writes from, and where its answer goes.
enum Payload {
    One(AlignedBuf, oneshot::Sender<(AlignedBuf, io::Result<()>)>),
    /// A vectored write: the buffers back to back.
    Many(
        Vec<AlignedBuf>,
        oneshot::Sender<(Vec<AlignedBuf>, io::Result<()>)>,
    ),
}

struct Op {
    kind: Kind,
    payload: Payload,
    offset: u64,
    /// Bytes transferred so far (a short transfer is resubmitted for the rest).
    done: usize,
}

impl Op {
    fn len(&self) -> usize {
        match &self.payload {
            Payload::One(buf, _) => buf.len(),
            Payload::Many(bufs, _) => bufs.iter().map(|b| b.len()).sum(),
        }
    }

    /// Answers the caller, handing the buffers back.
    fn finish(self, r: io::Result<()>) {
        match self.payload {
            Payload::One(buf, tx) => drop(tx.send((buf, r))),
            Payload::Many(bufs, tx) => drop(tx.send((bufs, r))),
        }
    }
}

struct Shared {
    queue: Mutex<Vec<Op>>,
    eventfd: OwnedFd,
    shutdown: AtomicBool,
}

impl Shared {
    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to an eventfd we own.
        unsafe {
            libc::write(
                self.eventfd.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

pub struct UringDevice {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    info: DeviceInfo,
}

impl UringDevice {
    pub fn new(file: Arc<File>, len: u64, direct: bool) -> io::Result<Self> {
        let ring = IoUring::new(RING_DEPTH)?;
        // SAFETY: plain eventfd creation; the result is checked before use.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: efd is a fresh descriptor that nothing else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(efd) };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Vec::new()),
            eventfd,
            shutdown: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ctxpod-uring".into())
            .spawn(move || run(ring, file, s))?;
        Ok(UringDevice {
            shared,
            thread: Some(thread),
            info: DeviceInfo {
                len,
                engine: "io_uring",
                direct,
            },
        })
    }

    /// Queues `op` for the ring's thread, waking it when the queue was empty.
    fn enqueue(&self, op: Op) {
        let was_empty = {
            let mut q = self.shared.queue.lock();
            q.push(op);
            q.len() == 1
        };
        if was_empty {
            self.shared.wake();
        }
    }

    fn submit(&self, kind: Kind, buf: AlignedBuf, offset: u64) -> IoFuture {
        let (tx, rx) = oneshot::channel();
        self.enqueue(Op {
            kind,
            payload: Payload::One(buf, tx),
            offset,
            done: 0,
        });
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                (
                    AlignedBuf::zeroed(0),
                    Err(io::Error::other("io_uring thread stopped")),
                )
            })
        })
    }
}

impl Drop for UringDevice {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Device for UringDevice {
    fn read_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        if let Err(e) = check_aligned(&buf, offset) {
            return Box::pin(async move { (buf, Err(e)) });
        }
        self.submit(Kind::Read, buf, offset)
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        if let Err(e) = check_aligned(&buf, offset) {
            return Box::pin(async move { (buf, Err(e)) });
        }
        self.submit(Kind::Write, buf, offset)
    }

    fn write_durable_at(&self, buf: AlignedBuf, offset: u64) -> IoFuture {
        if let Err(e) = check_aligned(&buf, offset) {
            return Box::pin(async move { (buf, Err(e)) });
        }
        self.submit(Kind::WriteDurable, buf, offset)
    }

    fn write_vectored_at(&self, bufs: Vec<AlignedBuf>, offset: u64, durable: bool) -> VecIoFuture {
        match check_vectored(&bufs, offset) {
            Err(e) => return Box::pin(async move { (bufs, Err(e)) }),
            Ok(0) => return Box::pin(async move { (bufs, Ok(())) }),
            Ok(_) => {}
        }
        let (tx, rx) = oneshot::channel();
        self.enqueue(Op {
            kind: if durable {
                Kind::WriteDurable
            } else {
                Kind::Write
            },
            payload: Payload::Many(bufs, tx),
            offset,
            done: 0,
        });
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| (Vec::new(), Err(io::Error::other("io_uring thread stopped"))))
        })
    }

    fn flush(&self) -> FlushFuture {
        let fut = self.submit(Kind::Flush, AlignedBuf::zeroed(0), 0);
        Box::pin(async move { fut.await.1 })
    }

    fn info(&self) -> DeviceInfo {
        self.info
    }
}

/// The submission entry for what is left of `op`; a vectored write's iovecs go into `iov`,
/// the slot's own, which must stay untouched until the completion for `token` arrives.
fn entry_for(
    op: &mut Op,
    fd: types::Fd,
    token: u64,
    iov: &mut Vec<libc::iovec>,
) -> io_uring::squeue::Entry {
    let len = op.len();
    let remaining = (len - op.done) as u32;
    let off = op.offset + op.done as u64;
    debug_assert!(op.done <= len, "an op never moves past its buffers");
    let flags = if matches!(op.kind, Kind::WriteDurable) {
        libc::RWF_DSYNC
    } else {
        0
    };
    let entry = match &mut op.payload {
        Payload::Many(bufs, _) => {
            iovecs_from(bufs, op.done, iov);
            // SAFETY: the iovecs point into `bufs`, which live in `op` (in its slot until the
            // completion for `token` arrives), as does `iov`, the slot's own vector; the
            // kernel reads both before then.
            opcode::Writev::new(fd, iov.as_ptr(), iov.len() as u32)
                .offset(off)
                .rw_flags(flags)
                .build()
        }
        Payload::One(buf, _) => {
            // SAFETY: `op.done <= buf.len()`, so the pointer is within the buffer or one past
            // its end; the buffer lives in `op`, which stays in its slot until the completion
            // for `token` arrives, so the kernel is done with it before it can be freed.
            let at = unsafe { buf.as_mut_ptr().add(op.done) };
            match op.kind {
                Kind::Read => opcode::Read::new(fd, at, remaining).offset(off).build(),
                Kind::Write | Kind::WriteDurable => {
                    opcode::Write::new(fd, at.cast_const(), remaining)
                        .offset(off)
                        .rw_flags(flags)
                        .build()
                }
                Kind::Flush => opcode::Fsync::new(fd)
                    .flags(types::FsyncFlags::DATASYNC)
                    .build(),
            }
        }
    };
    entry.user_data(token)
}

fn run(mut ring: IoUring, file: Arc<File>, shared: Arc<Shared>) {
    let fd = types::Fd(file.as_raw_fd());
    let efd = types::Fd(shared.eventfd.as_raw_fd());
    let slots_n = RING_DEPTH as usize - 1;
    let mut slots: Vec<Option<Op>> = (0..slots_n).map(|_| None).collect();
    let mut free: Vec<usize> = (0..slots_n).rev().collect();
    // Per slot: the iovecs of the vectored write in it, kept until its completion.
    let mut iovs: Vec<Vec<libc::iovec>> = (0..slots_n).map(|_| Vec::new()).collect();
    let mut backlog: VecDeque<Op> = VecDeque::new();
    let mut efd_buf = Box::new([0u8; 8]);
    let arm = |ring: &mut IoUring, efd_buf: &mut [u8; 8]| {
        let e = opcode::Read::new(efd, efd_buf.as_mut_ptr(), 8)
            .build()
            .user_data(EVENTFD_TOKEN);
        // SAFETY: efd_buf is boxed and outlives the ring's use of it (the thread owns both).
        unsafe { ring.submission().push(&e) }.expect("the eventfd slot is always free");
    };
    arm(&mut ring, &mut efd_buf);
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "io_uring submit failed; failing every pending I/O");
                for op in slots
                    .iter_mut()
                    .filter_map(Option::take)
                    .chain(backlog.drain(..))
                {
                    op.finish(Err(io::Error::new(e.kind(), e.to_string())));
                }
                return;
            }
        }
        let cqes: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        let mut rearm = false;
        for (token, res) in cqes {
            if token == EVENTFD_TOKEN {
                rearm = true;
                backlog.extend(shared.queue.lock().drain(..));
                continue;
            }
            let idx = token as usize;
            let mut op = slots[idx]
                .take()
                .expect("a completion matches an in-flight slot");
            if res == -libc::EINTR || res == -libc::EAGAIN {
                backlog.push_front(op);
            } else if res < 0 {
                op.finish(Err(io::Error::from_raw_os_error(-res)));
            } else if matches!(op.kind, Kind::Flush) {
                op.finish(Ok(()));
            } else if res == 0 {
                let kind = if matches!(op.kind, Kind::Read) {
                    io::ErrorKind::UnexpectedEof
                } else {
                    io::ErrorKind::WriteZero
                };
                op.finish(Err(kind.into()));
            } else {
                op.done += res as usize;
                if op.done < op.len() {
                    backlog.push_front(op);
                } else {
                    op.finish(Ok(()));
                }
            }
            free.push(idx);
        }
        let in_flight = slots_n - free.len();
        if shared.shutdown.load(Ordering::SeqCst)
            && in_flight == 0
            && backlog.is_empty()
            && shared.queue.lock().is_empty()
        {
            return;
        }
        if rearm {
            arm(&mut ring, &mut efd_buf);
        }
        while !backlog.is_empty() {
            let Some(idx) = free.pop() else { break };
            let mut op = backlog.pop_front().expect("backlog is not empty");
            let e = entry_for(&mut op, fd, idx as u64, &mut iovs[idx]);
            slots[idx] = Some(op);
            // SAFETY: see entry_for; at most slots_n + 1 entries exist, the ring's size.
            unsafe { ring.submission().push(&e) }.expect("one SQ entry per free slot");
        }
    }
}
