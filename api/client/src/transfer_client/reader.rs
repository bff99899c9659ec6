//! The connection's reader task: responses matched to their requests, PUSH frames landed
//! in their region at the ticket's offset, events handed to their subscription.

use super::*;

/// Reads frames until the connection ends: responses go to their callers, `Push` payloads
/// straight into their region, events to their subscription.
pub(crate) async fn read_loop(mut input: FrameInput<Rd>, shared: Arc<Shared>) {
    while let Ok(true) = read_one(&mut input, &shared).await {}
    // Every request still waiting learns that the connection is gone; tickets end.
    shared.pending.lock().expect("pending map").take();
    let streams: Vec<Stream> = shared
        .streams
        .lock()
        .expect("streams")
        .drain()
        .map(|(_, s)| s)
        .collect();
    for s in streams {
        match s {
            Stream::Prefetch(t) => t.finish(),
            Stream::Value(v) => v.fail(TransferError::Closed),
            Stream::Events(..) => {}
        }
    }
}

/// Bytes of a `Push` body before its data.
pub(crate) const PUSH_HEAD_BYTES: usize = 4 + 2 + 4 + 8 + 4;

/// Reads one frame and hands it on: `false` when the connection ended cleanly.
pub(crate) async fn read_one(
    input: &mut FrameInput<Rd>,
    shared: &Shared,
) -> Result<bool, InputError> {
    let Some((header, body_len)) = input.next_header().await? else {
        return Ok(false);
    };
    let id = header.request_id;
    if header.op == Op::Push {
        let more = header.flags & proto::FLAG_MORE != 0;
        read_push(input, shared, (id, more), body_len).await?;
        return Ok(true);
    }
    if header.op == Op::GetValue {
        super::values::read_piece(input, shared, header, body_len).await?;
        return Ok(true);
    }
    let body = input.take(body_len).await?;
    let frame = proto::Frame { header, body };
    let resp = Response::decode(&frame)?;
    match resp {
        Response::PrefetchDone { .. } => {
            let t = shared.streams.lock().expect("streams").remove(&id);
            if let Some(Stream::Prefetch(t)) = t {
                t.finish();
            }
        }
        Response::Events { lost, events } => {
            if let Some(Stream::Events(tx, dropped)) =
                shared.streams.lock().expect("streams").get(&id)
            {
                let n = events.len() as u64;
                if tx.try_send(EventBatch { lost, events }).is_err() {
                    dropped.fetch_add(n + lost, Ordering::Relaxed);
                }
            }
        }
        resp => {
            let tx = shared
                .pending
                .lock()
                .expect("pending map")
                .as_mut()
                .and_then(|m| m.remove(&id));
            match tx {
                Some(tx) => {
                    let _ = tx.send((header.status, resp));
                }
                // An error under a live stream's id ends it (a subscription whose
                // namespace was deleted, a value that could not be read).
                None => {
                    let s = shared.streams.lock().expect("streams").remove(&id);
                    if let (Some(Stream::Value(v)), Response::Error(message)) = (s, resp) {
                        v.fail(TransferError::Refused {
                            status: header.status,
                            message,
                        });
                    }
                }
            }
        }
    }
    Ok(true)
}

/// The head of a `Push` body: which entry of the ticket, its status, the CRC32C of its
/// data, where in the region it goes, and how many bytes follow.
#[derive(Clone, Copy)]
struct PushHead {
    index: usize,
    st: u16,
    crc: u32,
    offset: u64,
    len: usize,
}

/// Reads a `Push` frame of request `id` (the head already read): its data straight into
/// the ticket's region when it is what the entry asked for, else skipped; the entry's
/// state set when it was still pending.
async fn read_push(
    input: &mut FrameInput<Rd>,
    shared: &Shared,
    (id, more): (u64, bool),
    body_len: usize,
) -> Result<(), InputError> {
    if body_len < PUSH_HEAD_BYTES {
        return Err(proto::ProtoError::Truncated(Op::Push).into());
    }
    let h = input.take(PUSH_HEAD_BYTES).await?;
    let head = PushHead {
        index: u32::from_le_bytes(h[0..4].try_into().expect("4")) as usize,
        st: u16::from_le_bytes(h[4..6].try_into().expect("2")),
        crc: u32::from_le_bytes(h[6..10].try_into().expect("4")),
        offset: u64::from_le_bytes(h[10..18].try_into().expect("8")),
        len: u32::from_le_bytes(h[18..22].try_into().expect("4")) as usize,
    };
    if body_len != PUSH_HEAD_BYTES + head.len {
        return Err(proto::ProtoError::Trailing(Op::Push, body_len).into());
    }
    let ticket = match shared.streams.lock().expect("streams").get(&id) {
        Some(Stream::Prefetch(t)) => Some(t.clone()),
        _ => None,
    };
    let Some(t) = ticket else {
        input.skip(head.len).await?;
        return Ok(());
    };
    let pending = t
        .progress
        .borrow()
        .blocks
        .get(head.index)
        .is_some_and(|b| !b.is_final());
    let state = land_push(input, &t, &head, (pending, more)).await?;
    if let (true, Some(state)) = (pending, state) {
        t.landing.lock().expect("landing").remove(&head.index);
        t.progress.send_modify(|p| p.set(head.index, state));
    }
    Ok(())
}

/// The data of a push: read into the region when the entry is `pending` and the push
/// matches its slot (status OK, at the entry's offset plus what landed of it already,
/// within its length) and checked against the CRC32C, else skipped. The entry's new
/// state; `None` while more pieces of its value follow (`more`).
async fn land_push(
    input: &mut FrameInput<Rd>,
    t: &TicketState,
    head: &PushHead,
    (pending, more): (bool, bool),
) -> Result<Option<BlockState>, InputError> {
    let PushHead {
        index,
        st,
        crc,
        offset,
        len,
    } = *head;
    let slot = t.ranges.get(index).copied();
    let got = t
        .landing
        .lock()
        .expect("landing")
        .get(&index)
        .copied()
        .unwrap_or(0);
    Ok(Some(match slot {
        Some((off, max))
            if pending && st == status::OK && off + got == offset && got + len as u64 <= max =>
        {
            // SAFETY: the range is reserved by this live ticket and the entry has not
            // landed, so nobody holds a slice of it (module docs of `region`).
            let dst = unsafe { t.region.slice_mut(offset, len) };
            input.read_into(dst).await?;
            let total = got + len as u64;
            match (ctxpod_wire::crc32c(dst) == crc, more) {
                (true, true) => {
                    t.landing.lock().expect("landing").insert(index, total);
                    return Ok(None);
                }
                (true, false) => BlockState::Landed { len: total as u32 },
                (false, _) => BlockState::Corrupt,
            }
        }
        _ => {
            input.skip(len).await?;
            if st == status::OK {
                // Data that does not match what was asked for is not used.
                BlockState::Corrupt
            } else {
                BlockState::Missed { status: st }
            }
        }
    }))
}
