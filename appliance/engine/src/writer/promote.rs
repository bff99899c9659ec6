//! Promotion: records moved from `dense` to `fast` ahead of use (issue #36, docs/design/0003
//! step 3). Asked by `Engine::promote` (answered at once, within the move budget) and hinted
//! by pins, prefetch holds and a second read from `dense` (queued in `Core::promote_hints`,
//! moved when the writer is idle and the budget allows; a hint that finds no room is
//! dropped). Once `fast` has filled, a hint promotes a block only if it was read more often
//! than the blocks of `fast`'s oldest region are on average (`Core::heat`, a TinyLFU
//! frequency sketch), since every byte promoted brings that region's demotion closer:
//! otherwise a hot set larger than `fast` turns it over and over for nothing. The move is reclaim's: the record read and checked, copied byte for byte into
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
    /// Not moved (or, for a large value, not all of its extents): over the move budget,
    /// no room in `fast`, or a record that did not read back intact.
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
    pub(super) fn take(&mut self, bytes: u64) -> bool {
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

/// How a promotion finds room in `fast`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    /// Only the room `fast` has, for blocks read more often than its oldest region's (a
    /// second read's hint).
    Avail,
    /// `fast`'s oldest regions demoted as needed (an asked promotion).
    Make,
    /// `fast`'s oldest regions demoted as needed, for blocks read more often than the
    /// oldest one's (a pin's or prefetch hold's hint).
    MakeForHotter,
}

/// Records of `fast`'s oldest region (the first, by offset) the admission bar is taken over.
const VICTIM_SAMPLE: usize = 256;

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
                for (keys, room) in [(strong, Room::MakeForHotter), (weak, Room::Avail)] {
                    let keys: Vec<Vec<u8>> = keys.into_iter().map(|h| h.0).collect();
                    if keys.is_empty() {
                        continue;
                    }
                    if let Err(e) = self.promote_now(&keys, room).await {
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
    /// `fast`'s room allow (`room`: whether and for which blocks its oldest regions are
    /// demoted to make room); each key's fate.
    pub(crate) async fn promote_now(
        &mut self,
        bkeys: &[Vec<u8>],
        room: Room,
    ) -> anyhow::Result<Vec<Fate>> {
        let core = self.core.clone();
        // Over committed state only: the index as the committer left it.
        self.drain_committer().await;
        let (mut fates, mut todo) = self.promotion_fates(bkeys)?;
        if todo.is_empty() {
            return Ok(fates);
        }
        let bytes = |todo: &[(usize, BlockLoc)]| -> u64 {
            todo.iter().map(|(_, l)| l.record_len as u64).sum()
        };
        // Admission: once `fast` has filled (no free region beyond its reserve), every byte
        // promoted brings the demotion of its oldest region closer, so a hint promotes only
        // blocks read more often than that region's are; an asked promotion is not judged.
        if room != Room::Make && !self.fast_has_free(bytes(&todo)) {
            let bar = self.victim_heat()?;
            let before = todo.len();
            todo.retain(|(i, _)| self.heat_of(&bkeys[*i]) as f64 > bar);
            core.metrics
                .tier
                .promotions_not_admitted
                .inc_by((before - todo.len()) as u64);
        }
        let room = match room {
            Room::Avail => self.fast_avail(),
            Room::Make | Room::MakeForHotter => self.fast_room(bytes(&todo)).await?,
        };
        let mut st = Moves::default();
        for (i, _) in todo {
            // Asked again: making room may have demoted or evicted since the first look.
            let loc = match core.index.get_block(&bkeys[i])? {
                None => {
                    fates[i] = Fate::Absent;
                    continue;
                }
                Some(l) if l.extents > 0 => {
                    let left = room.saturating_sub(st.written);
                    fates[i] = self.promote_value(&core, &bkeys[i], left, &mut st).await?;
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
                Some(_) if self.tiers.len() < 2 => Fate::Fast,
                Some(loc) if loc.extents > 0 => match self.core.index.get_manifest(bkey)? {
                    None => Fate::Absent,
                    Some(m) if m.extents.iter().all(|x| g.tier_of(x.region) == 0) => Fate::Fast,
                    Some(m) => {
                        // Only the bytes still to move count against the room.
                        let record_len = m
                            .extents
                            .iter()
                            .filter(|x| g.tier_of(x.region) > 0)
                            .map(|x| x.record_len)
                            .sum();
                        todo.push((fates.len(), BlockLoc { record_len, ..loc }));
                        Fate::Deferred
                    }
                },
                Some(loc) if g.tier_of(loc.region) == 0 => Fate::Fast,
                Some(loc) => {
                    todo.push((fates.len(), loc));
                    Fate::Deferred
                }
            };
            fates.push(fate);
        }
        Ok((fates, todo))
    }

    /// How often block `bkey` was read, as the frequency sketch estimates it.
    fn heat_of(&self, bkey: &[u8]) -> u8 {
        self.core
            .heat
            .as_ref()
            .map_or(0, |h| h.lock().estimate(bkey))
    }

    /// How often, on average, the live blocks of `fast`'s oldest sealed region (the next to
    /// be demoted for room) were read, over those among its first [`VICTIM_SAMPLE`] records
    /// (`live_records`, as reclaim finds them): a promotion that would push them out must
    /// beat it. Below the counters' ceiling, so
    /// that a block read as often as the sketch can count is admitted even against a
    /// region of such blocks.
    fn victim_heat(&self) -> anyhow::Result<f64> {
        let (Some(h), Some(&r)) = (&self.core.heat, self.tiers[0].sealed.front()) else {
            return Ok(0.0);
        };
        let (lo, hi) = (by_region_key(r, 0), by_region_key(r + 1, 0));
        let (live, _) =
            super::eviction::live_records(&self.core.index, r, (&lo, &hi), VICTIM_SAMPLE)?;
        let hashes: Vec<(u64, u64)> = live
            .iter()
            .map(|(bkey, _)| crate::heat::Sketch::hashes(bkey))
            .collect();
        if hashes.is_empty() {
            return Ok(0.0);
        }
        let sum: u64 = {
            let h = h.lock();
            hashes
                .iter()
                .map(|&x| u64::from(h.estimate_hashed(x)))
                .sum()
        };
        let ceiling = f64::from(crate::heat::COUNTER_MAX - 1);
        Ok((sum as f64 / hashes.len() as f64).min(ceiling))
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

    /// Whether `fast` has free regions beyond its reserve for `bytes` (it has not filled
    /// since it was formatted, or emptied since).
    fn fast_has_free(&self, bytes: u64) -> bool {
        let t = &self.tiers[0];
        t.free.len().saturating_sub(t.reserve) as u64 * self.core.geometry.region_bytes >= bytes
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

    /// The extents of the large value `bkey` still in `dense` moved into `fast`, as the
    /// move budget and `room` (bytes) allow: `Promoted` when all of them are in `fast` now,
    /// `Fast` when they were, `Deferred` when some are left (the next promotion moves them
    /// on; a value in both tiers reads as any other) or an extent did not read back intact
    /// (a read of it quarantines the value).
    async fn promote_value(
        &mut self,
        core: &Core,
        bkey: &[u8],
        room: u64,
        st: &mut Moves,
    ) -> anyhow::Result<Fate> {
        let g = &core.geometry;
        let Some(mut m) = core.index.get_manifest(bkey)? else {
            return Ok(Fate::Absent);
        };
        if m.extents.iter().all(|x| g.tier_of(x.region) == 0) {
            return Ok(Fate::Fast);
        }
        let how = super::extent_moves::ExtentMove {
            to: 0,
            fallback: None,
            room,
            budgeted: true,
            compress: false,
        };
        let done = self
            .move_extents(
                core,
                bkey,
                &mut m,
                |x| g.tier_of(x.region) > 0,
                how,
                &mut st.wb,
            )
            .await?;
        if done.moved > 0 {
            st.wb
                .put_cf(core.index.cf(index::CF_BLOCKS), bkey, m.encode());
            st.moved += done.moved;
            st.written += done.written;
        }
        Ok(if done.left == 0 && !done.damaged {
            Fate::Promoted
        } else {
            Fate::Deferred
        })
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
        let place = (loc.region, loc.offset);
        let (buf, res) = super::extent_moves::read_place(core, place, loc.record_len).await;
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
