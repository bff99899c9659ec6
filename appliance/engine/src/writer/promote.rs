//! Promotion: records moved from `dense` to `fast` ahead of use (issue #36, docs/design/0003
//! step 3). Asked by `Engine::promote` (answered at once, within the move budget) and hinted
//! by pins, prefetch holds and a second read from `dense` (queued in `Core::promote_hints`,
//! moved when the writer is idle and the budget allows; a hint that finds no room is
//! dropped). The move is reclaim's: the record read and checked, copied byte for byte into
//! `fast`'s open region under its epoch, flushed, then the index repointed in a synced
//! checkpoint. The `dense` copy stays where it was (dead space, reclaimed with its region),
//! so a reader that found it still reads the same generation; nothing is ever in neither.

use super::*;
use std::time::Duration;

/// What a promotion did with one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Moved into `fast` now.
    Promoted,
    /// In `fast` already (or the node has one tier).
    Fast,
    Absent,
    /// Not moved: over the move budget, no room in `fast`, a large value (whose extents
    /// stay in `dense`), or a record that did not read back intact.
    Deferred,
}

/// Bytes a second may move between tiers, with a second's worth of burst.
pub(super) struct MoveBudget {
    per_s: f64,
    tokens: f64,
    at: Instant,
}

impl MoveBudget {
    pub fn new(per_s: u64) -> MoveBudget {
        MoveBudget {
            per_s: per_s as f64,
            tokens: per_s as f64,
            at: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let dt = now.duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.per_s).min(self.per_s);
        self.at = now;
    }

    /// Takes `bytes` if the budget holds them.
    fn take(&mut self, bytes: u64) -> bool {
        self.refill();
        if self.tokens >= bytes as f64 {
            self.tokens -= bytes as f64;
            return true;
        }
        false
    }

    /// How long until the budget holds `bytes`.
    fn wait_for(&mut self, bytes: u64) -> Duration {
        self.refill();
        Duration::from_secs_f64(((bytes as f64 - self.tokens) / self.per_s).max(0.0))
    }
}

/// Hints taken from the queue per idle turn.
const HINTS_PER_TURN: usize = 64;

impl Writer {
    /// The next command; while none is queued and hints are, promotes them as the budget
    /// allows (a command arriving meanwhile is taken at once after the turn).
    pub(super) async fn next_cmd(&mut self, rx: &mut mpsc::Receiver<WriteCmd>) -> Option<WriteCmd> {
        loop {
            if self.core.failed.load(Ordering::SeqCst) {
                return rx.recv().await;
            }
            if self.core.promote_hints.lock().is_empty() {
                let core = self.core.clone();
                tokio::select! {
                    c = rx.recv() => return c,
                    () = core.promote_wake.notified() => continue,
                }
            }
            match rx.try_recv() {
                Ok(c) => return Some(c),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            let wait = self.budget.wait_for(1 << 20);
            if wait.is_zero() {
                let hints: Vec<(Vec<u8>, bool)> = {
                    let mut q = self.core.promote_hints.lock();
                    let n = q.len().min(HINTS_PER_TURN);
                    q.drain(..n).collect()
                };
                let (strong, weak): (Vec<_>, Vec<_>) = hints.into_iter().partition(|h| h.1);
                for (keys, may_demote) in [(strong, true), (weak, false)] {
                    let keys: Vec<Vec<u8>> = keys.into_iter().map(|h| h.0).collect();
                    if keys.is_empty() {
                        continue;
                    }
                    if let Err(e) = self.promote_now(&keys, may_demote).await {
                        self.core.fail("promotion", &e);
                    }
                }
                continue;
            }
            tokio::select! {
                c = rx.recv() => return c,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Moves the records of `bkeys` that live in `dense` into `fast`, as the move budget and
    /// `fast`'s room allow (with `may_demote`, its oldest regions are demoted to make room);
    /// each key's fate.
    pub(crate) async fn promote_now(
        &mut self,
        bkeys: &[Vec<u8>],
        may_demote: bool,
    ) -> anyhow::Result<Vec<Fate>> {
        let core = self.core.clone();
        // Over committed state only: the index as the committer left it.
        self.drain_committer().await;
        let (mut fates, todo) = self.promotion_fates(bkeys)?;
        if todo.is_empty() {
            return Ok(fates);
        }
        let want: u64 = todo.iter().map(|(_, l)| l.record_len as u64).sum();
        let room = if may_demote {
            self.fast_room(want).await?
        } else {
            self.fast_avail()
        };
        let mut st = Moves::default();
        for (i, _) in todo {
            // Asked again: making room may have demoted or evicted since the first look.
            let loc = match core.index.get_block(&bkeys[i])? {
                None => {
                    fates[i] = Fate::Absent;
                    continue;
                }
                Some(l) if core.geometry.tier_of(l.region) == 0 => {
                    fates[i] = Fate::Fast;
                    continue;
                }
                Some(l) => l,
            };
            let len = loc.record_len as u64;
            if st.written + len > room || !self.budget.take(len) {
                continue;
            }
            if self.move_record(&core, &bkeys[i], loc, 0, &mut st).await? {
                fates[i] = Fate::Promoted;
            }
        }
        self.commit_moves(&core, st).await?;
        self.publish();
        Ok(fates)
    }

    /// Each key's fate as far as the index tells (`Deferred` for a record to move), and the
    /// records to move: (index in `bkeys`, place).
    #[allow(clippy::type_complexity)]
    fn promotion_fates(
        &self,
        bkeys: &[Vec<u8>],
    ) -> anyhow::Result<(Vec<Fate>, Vec<(usize, BlockLoc)>)> {
        let g = &self.core.geometry;
        let mut fates = Vec::with_capacity(bkeys.len());
        let mut todo = Vec::new();
        for bkey in bkeys {
            let fate = match self.core.index.get_block(bkey)? {
                None => Fate::Absent,
                Some(loc) if self.tiers.len() < 2 || g.tier_of(loc.region) == 0 => Fate::Fast,
                Some(loc) if loc.extents > 0 => Fate::Deferred,
                Some(loc) => {
                    todo.push((fates.len(), loc));
                    Fate::Deferred
                }
            };
            fates.push(fate);
        }
        Ok((fates, todo))
    }

    /// Bytes `fast` can take without touching its reserve: its open region's rest and its
    /// free regions beyond the reserve.
    fn fast_avail(&self) -> u64 {
        let rb = self.core.geometry.region_bytes;
        let t = &self.tiers[0];
        let open = t
            .open
            .map_or(0, |r| rb - self.regions[r as usize].write_ptr as u64);
        open + t.free.len().saturating_sub(t.reserve) as u64 * rb
    }

    /// [`Writer::fast_avail`], `fast`'s oldest regions demoted (bounded) to reach `want`.
    async fn fast_room(&mut self, want: u64) -> anyhow::Result<u64> {
        let mut tries = RECLAIM_TRIES_MAX;
        while self.fast_avail() < want && tries > 0 && !self.tiers[0].sealed.is_empty() {
            tries -= 1;
            if !self.room_for_demotion(1).await? {
                break;
            }
            self.evict_oldest(0, 1).await?;
        }
        Ok(self.fast_avail())
    }

    /// Copies the record at `loc` into tier `to`'s open region and puts its new place into
    /// `st`; false (nothing written) if it no longer reads back intact or `to` has no room.
    async fn move_record(
        &mut self,
        core: &Core,
        bkey: &[u8],
        loc: BlockLoc,
        to: usize,
        st: &mut Moves,
    ) -> anyhow::Result<bool> {
        let (buf, res) = core
            .device
            .read_at(
                AlignedBuf::reused(loc.record_len as usize),
                core.dev_offset(loc.region, loc.offset),
            )
            .await;
        // A record that does not check out stays where it is: a read quarantines it.
        if res.is_err() || !super::eviction::still_the_record(&buf, &loc, bkey) {
            return Ok(false);
        }
        let Some(place) = self.alloc(to, buf.len())? else {
            return Ok(false);
        };
        st.written += self
            .write_copy(core, bkey, loc, buf, place, &mut st.wb)
            .await?;
        st.moved += 1;
        Ok(true)
    }

    /// The moves of `st` made durable and visible: the copies flushed, then their entries
    /// (and the region table, and every put since the last checkpoint) in one synced write.
    async fn commit_moves(&mut self, core: &Core, st: Moves) -> anyhow::Result<()> {
        let Moves {
            mut wb,
            moved,
            written,
        } = st;
        if moved == 0 {
            return Ok(());
        }
        count_written(core, written);
        core.device.flush().await?;
        core.metrics.device_flushes.inc();
        self.put_touched(&mut wb);
        if let Some(earlier) = self.take_checkpoint() {
            core.index
                .write(earlier, index::WriteMode::Wal { sync: false })?;
        }
        core.index.write(wb, index::WriteMode::Wal { sync: true })?;
        core.metrics.tier.promoted_records.inc_by(moved);
        core.metrics.tier.promoted_bytes.inc_by(written);
        Ok(())
    }
}

/// Moves made so far by one promotion.
#[derive(Default)]
struct Moves {
    wb: WriteBatch,
    moved: u64,
    written: u64,
}
