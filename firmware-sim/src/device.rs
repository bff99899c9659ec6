//! The simulated device: commands in, completions out, data kept with the durability a real
//! drive gives it, faults from a [`FaultPlan`], timing from the [`Nand`] model.
//!
//! A command is submitted (its data copied in, its faults decided, its completion time
//! computed) and later completed by the caller ([`SimDevice::complete`]), after waiting
//! until its completion time in real-time mode or at once in instant mode (tests). Where
//! the bytes are in between is what a power cut acts on:
//!
//! - a write in flight (submitted, not completed) is not durable: at a power cut each of its
//!   sectors is persisted or lost independently (a torn write, in any order);
//! - a completed write sits in the volatile write cache until a flush, unless it was FUA or
//!   the drive has power-loss protection (then it is durable when it completes);
//! - a flush makes every completed write durable; a failed flush makes nothing durable.

use crate::faults::{Fault, FaultPlan};
use crate::media::Media;
use crate::nand::{Nand, Wear};
use crate::profile::Profile;
use crate::rng::Rng;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    #[error("the device has no power")]
    PowerOff,
    #[error("uncorrectable read error at {0}")]
    Uncorrectable(u64),
    #[error("program failure writing at {0}")]
    ProgramFail(u64),
    #[error("flush failed")]
    FlushFail,
    #[error("no space left on the device")]
    NoSpace,
    #[error("I/O of {len} bytes at {offset} is not sector-aligned or out of range")]
    Invalid { offset: u64, len: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Read,
    Write,
    WriteFua,
    Flush,
}

/// A submitted command.
#[derive(Debug)]
#[must_use = "a submitted command must be completed"]
pub struct Ticket {
    id: u64,
    /// Virtual time (ns since the device started) at which the command completes.
    pub done_ns: u64,
    /// Power-off generation the command was submitted in.
    life: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SimStats {
    pub profile: String,
    pub commands: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub power_cuts: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    pub wear: Wear,
    /// Virtual time now (ns).
    pub now_ns: u64,
    /// Sectors written but not durable (volatile cache and writes in flight).
    pub volatile_sectors: u64,
}

/// Wear figures of a simulated device, measured and projected.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Endurance {
    /// NAND bytes / host bytes.
    pub write_amplification: f64,
    /// Average P/E cycles used over the rated P/E cycles.
    pub life_used: f64,
    /// Host writes per day (at the rate so far, virtual time) over the device's size.
    pub dwpd: f64,
    /// Host bytes the device can take before its rated P/E cycles, at this write
    /// amplification.
    pub projected_tbw_bytes: f64,
    /// Days until then at the write rate so far.
    pub projected_life_days: f64,
}

struct InFlight {
    offset: u64,
    data: Vec<u8>,
    fua: bool,
}

struct State {
    media: Media,
    /// Completed, unflushed writes, per sector (drives without power-loss protection).
    cache: BTreeMap<u64, Box<[u8]>>,
    inflight: BTreeMap<u64, InFlight>,
    nand: Nand,
    plan: FaultPlan,
    rng: Rng,
    /// Timing draws come from their own generator, so that a plan's fault decisions do not
    /// depend on how many latency samples the model took.
    timing_rng: Rng,
    sector_size: u64,
    powered: bool,
    /// Power was cut by the command being submitted, a write: it is torn.
    torn_pending: bool,
    full: bool,
    life: u64,
    next_command: u64,
    clock_ns: u64,
    /// FNV-1a over every command and every fault decision so far.
    trace_hash: u64,
    stats: SimStats,
}

pub struct SimDevice {
    profile: Profile,
    len: u64,
    realtime: Option<Instant>,
    state: Mutex<State>,
}

impl SimDevice {
    /// A device of `media.len()` bytes. `realtime`: completion times follow the wall clock
    /// (the caller sleeps until them); otherwise time only advances as commands complete.
    pub fn new(profile: Profile, media: Media, plan: FaultPlan, realtime: bool) -> SimDevice {
        let len = media.len();
        let nand = Nand::new(&profile, len);
        SimDevice {
            len,
            realtime: realtime.then(Instant::now),
            state: Mutex::new(State {
                media,
                cache: BTreeMap::new(),
                inflight: BTreeMap::new(),
                nand,
                rng: Rng::new(plan.seed),
                timing_rng: Rng::new(plan.seed ^ 0x7469_6d65),
                plan,
                sector_size: profile.sector_bytes as u64,
                powered: true,
                torn_pending: false,
                full: false,
                life: 0,
                next_command: 0,
                clock_ns: 0,
                trace_hash: 0xcbf2_9ce4_8422_2325,
                stats: SimStats {
                    profile: profile.name.clone(),
                    ..SimStats::default()
                },
            }),
            profile,
        }
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Virtual time now: the wall clock since start in real-time mode.
    pub fn now_ns(&self) -> u64 {
        match self.realtime {
            Some(t0) => t0.elapsed().as_nanos() as u64,
            None => self.state.lock().clock_ns,
        }
    }

    /// The wall-clock instant of virtual time `ns` (real-time mode).
    pub fn instant_of(&self, ns: u64) -> Option<Instant> {
        self.realtime
            .map(|t0| t0 + std::time::Duration::from_nanos(ns))
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), SimError> {
        let s = self.profile.sector_bytes as u64;
        if !offset.is_multiple_of(s)
            || !len.is_multiple_of(s)
            || offset.checked_add(len).is_none_or(|e| e > self.len)
        {
            return Err(SimError::Invalid { offset, len });
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset` (the data as of submission).
    pub fn submit_read(&self, offset: u64, buf: &mut [u8]) -> Result<Ticket, SimError> {
        self.check(offset, buf.len() as u64)?;
        let now = self.now_ns();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let (cmd, faults) = st.begin(Kind::Read, offset, buf.len() as u64, now)?;
        st.stats.reads += 1;
        if faults.contains(&Fault::Uncorrectable)
            || (!faults.contains(&Fault::BitFlip) && st.draw(Kind::Read, Fault::Uncorrectable))
        {
            st.record(cmd, Kind::Read, Fault::Uncorrectable);
            return Err(SimError::Uncorrectable(offset));
        }
        st.read_current(offset, buf);
        if faults.contains(&Fault::BitFlip) || st.draw(Kind::Read, Fault::BitFlip) {
            st.record(cmd, Kind::Read, Fault::BitFlip);
            let max = st.plan.bit_flips_max.max(1) as u64;
            let n = 1 + st.rng.below(max);
            for _ in 0..n {
                let bit = st.rng.below(buf.len() as u64 * 8);
                buf[(bit / 8) as usize] ^= 1 << (bit % 8);
            }
        }
        let start = st.nand.admit(now);
        let mut done = st
            .nand
            .read(start, offset, buf.len() as u64, &mut st.timing_rng);
        done += st.spike(cmd, Kind::Read, &faults);
        Ok(st.issue(cmd, done))
    }

    /// Writes `data` at `offset`; `fua`: durable when it completes.
    pub fn submit_write(&self, offset: u64, data: &[u8], fua: bool) -> Result<Ticket, SimError> {
        self.check(offset, data.len() as u64)?;
        let now = self.now_ns();
        let kind = if fua { Kind::WriteFua } else { Kind::Write };
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let (cmd, faults) = match st.begin(kind, offset, data.len() as u64, now) {
            Err(SimError::PowerOff) if st.torn_pending => {
                // The cut happened on this very command: some of its sectors made it.
                st.torn_pending = false;
                match st.plan.torn_keep_sectors {
                    Some(k) => {
                        let keep = (k as usize * st.sector_size as usize).min(data.len());
                        let _ = st.media.write(offset, &data[..keep]);
                    }
                    None => st.persist_some(offset, data),
                }
                return Err(SimError::PowerOff);
            }
            r => r?,
        };
        st.stats.writes += 1;
        if st.full {
            st.record(cmd, kind, Fault::Full);
            return Err(SimError::NoSpace);
        }
        if faults.contains(&Fault::ProgramFail) || st.draw(kind, Fault::ProgramFail) {
            st.record(cmd, kind, Fault::ProgramFail);
            return Err(SimError::ProgramFail(offset));
        }
        let mut at = offset;
        if faults.contains(&Fault::Misdirect) || st.draw(kind, Fault::Misdirect) {
            st.record(cmd, kind, Fault::Misdirect);
            let s = self.profile.sector_bytes as u64;
            let slots = (self.len - data.len() as u64) / s + 1;
            at = st.rng.below(slots) * s;
        }
        st.inflight.insert(
            cmd,
            InFlight {
                offset: at,
                data: data.to_vec(),
                fua,
            },
        );
        let start = st.nand.admit(now);
        let (cached, programmed) = st
            .nand
            .write(start, at, data.len() as u64, &mut st.timing_rng);
        let mut done = if fua && !self.profile.power_loss_protection {
            st.nand
                .drain(programmed, &mut st.timing_rng)
                .max(programmed)
        } else {
            cached
        };
        done += st.spike(cmd, kind, &faults);
        Ok(st.issue(cmd, done))
    }

    /// Makes every completed write durable.
    pub fn submit_flush(&self) -> Result<Ticket, SimError> {
        let now = self.now_ns();
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let (cmd, faults) = st.begin(Kind::Flush, 0, 0, now)?;
        st.stats.flushes += 1;
        if faults.contains(&Fault::FlushFail) || st.draw(Kind::Flush, Fault::FlushFail) {
            st.record(cmd, Kind::Flush, Fault::FlushFail);
            return Err(SimError::FlushFail);
        }
        let cache = std::mem::take(&mut st.cache);
        for (sector, data) in cache {
            let _ = st
                .media
                .write(sector * self.profile.sector_bytes as u64, &data);
        }
        let start = st.nand.admit(now);
        let mut done = if self.profile.power_loss_protection {
            start
        } else {
            st.nand.drain(start, &mut st.timing_rng)
        };
        done += st.spike(cmd, Kind::Flush, &faults);
        Ok(st.issue(cmd, done))
    }

    /// Completes a command: a write's data goes to the write cache (or the medium, if FUA or
    /// power-loss protected). Fails if power was cut since it was submitted.
    pub fn complete(&self, t: Ticket) -> Result<(), SimError> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if t.life != st.life || !st.powered {
            return Err(SimError::PowerOff);
        }
        st.clock_ns = st.clock_ns.max(t.done_ns);
        if let Some(w) = st.inflight.remove(&t.id) {
            if w.fua || self.profile.power_loss_protection {
                let _ = st.media.write(w.offset, &w.data);
                // A durable write supersedes older cached versions of its sectors.
                let s = self.profile.sector_bytes as u64;
                for i in 0..w.data.len() as u64 / s {
                    st.cache.remove(&(w.offset / s + i));
                }
            } else {
                let s = self.profile.sector_bytes as usize;
                for (i, chunk) in w.data.chunks(s).enumerate() {
                    st.cache
                        .insert(w.offset / s as u64 + i as u64, chunk.into());
                }
            }
        }
        Ok(())
    }

    /// Cuts power now: in-flight and unflushed writes are persisted sector by sector with
    /// the plan's `persist_unflushed` chance, the rest is lost; commands fail until
    /// [`SimDevice::power_on`].
    pub fn power_cut(&self) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let cmd = st.next_command;
        st.cut(cmd);
    }

    pub fn power_on(&self) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.powered = true;
        st.torn_pending = false;
    }

    pub fn is_powered(&self) -> bool {
        self.state.lock().powered
    }

    /// Device full (writes answer [`SimError::NoSpace`]) or not.
    pub fn set_full(&self, full: bool) {
        self.state.lock().full = full;
    }

    /// Replaces the fault plan (its generator restarts from its seed).
    pub fn set_plan(&self, plan: FaultPlan) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.rng = Rng::new(plan.seed);
        st.plan = plan;
    }

    /// FNV-1a over every event so far: equal for equal runs.
    pub fn trace_hash(&self) -> u64 {
        self.state.lock().trace_hash
    }

    pub fn stats(&self) -> SimStats {
        let st = self.state.lock();
        let mut s = st.stats.clone();
        s.wear = st.nand.wear;
        s.commands = st.next_command;
        s.now_ns = st.clock_ns;
        let sb = self.profile.sector_bytes as u64;
        s.volatile_sectors = st.cache.len() as u64
            + st.inflight
                .values()
                .map(|w| w.data.len() as u64 / sb)
                .sum::<u64>();
        s
    }

    /// Endurance so far and projected from the write rate so far (virtual time).
    pub fn endurance(&self) -> Endurance {
        let s = self.stats();
        let w = &s.wear;
        let wa = if w.host_bytes_written > 0 {
            w.nand_bytes_written as f64 / w.host_bytes_written as f64
        } else {
            1.0
        };
        let days = s.now_ns as f64 / 86_400e9;
        let dwpd = if days > 0.0 {
            w.host_bytes_written as f64 / days / self.len as f64
        } else {
            0.0
        };
        let physical = self.len as f64 * (1.0 + self.profile.over_provisioning);
        // Host bytes the NAND can take at this write amplification before its rated P/E.
        let tbw = self.profile.pe_cycles as f64 * physical / wa;
        Endurance {
            write_amplification: wa,
            life_used: w.pe_cycles_avg / self.profile.pe_cycles as f64,
            dwpd,
            projected_tbw_bytes: tbw,
            projected_life_days: if dwpd > 0.0 {
                tbw / (dwpd * self.len as f64)
            } else {
                f64::INFINITY
            },
        }
    }

    /// Bytes of the durable medium (what would survive a power cut now), for tests.
    pub fn read_durable(&self, offset: u64, buf: &mut [u8]) {
        let _ = self.state.lock().media.read(offset, buf);
    }
}

impl State {
    /// Numbers the command, applies scheduled state faults, and refuses it without power.
    fn begin(
        &mut self,
        kind: Kind,
        offset: u64,
        len: u64,
        now: u64,
    ) -> Result<(u64, Vec<Fault>), SimError> {
        let cmd = self.next_command;
        self.next_command += 1;
        self.clock_ns = self.clock_ns.max(now);
        let faults: Vec<Fault> = self.plan.scheduled(cmd).collect();
        self.event(cmd, kind, offset, len, None);
        for f in &faults {
            match f {
                Fault::Full => self.full = true,
                Fault::SpaceBack => self.full = false,
                Fault::PowerCut if self.powered => {
                    self.cut(cmd);
                    self.torn_pending = matches!(kind, Kind::Write | Kind::WriteFua);
                }
                _ => {}
            }
        }
        if !self.powered {
            return Err(SimError::PowerOff);
        }
        Ok((cmd, faults))
    }

    fn draw(&mut self, kind: Kind, fault: Fault) -> bool {
        let p = match (kind, fault) {
            (Kind::Read, Fault::Uncorrectable) => self.plan.uncorrectable,
            (Kind::Read, Fault::BitFlip) => self.plan.bit_flip,
            (Kind::Write | Kind::WriteFua, Fault::ProgramFail) => self.plan.program_fail,
            (Kind::Write | Kind::WriteFua, Fault::Misdirect) => self.plan.misdirect,
            (Kind::Flush, Fault::FlushFail) => self.plan.flush_fail,
            (_, Fault::LatencySpike) => self.plan.latency_spike,
            _ => 0.0,
        };
        self.rng.chance(p)
    }

    fn spike(&mut self, cmd: u64, kind: Kind, faults: &[Fault]) -> u64 {
        if faults.contains(&Fault::LatencySpike) || self.draw(kind, Fault::LatencySpike) {
            self.record(cmd, kind, Fault::LatencySpike);
            (self.plan.latency_spike_us * 1e3) as u64
        } else {
            0
        }
    }

    fn issue(&mut self, id: u64, done_ns: u64) -> Ticket {
        self.nand.complete_at(done_ns);
        Ticket {
            id,
            done_ns,
            life: self.life,
        }
    }

    fn record(&mut self, cmd: u64, kind: Kind, fault: Fault) {
        *self
            .stats
            .faults
            .entry(format!("{fault:?}").to_lowercase())
            .or_default() += 1;
        self.event(cmd, kind, 0, 0, Some(fault));
    }

    /// Folds one event (a command, or a fault decided for it) into the trace hash.
    fn event(&mut self, cmd: u64, kind: Kind, offset: u64, len: u64, fault: Option<Fault>) {
        let fault = fault.map_or(0, |f| f as u64 + 1);
        for v in [cmd, kind as u64, offset, len, fault] {
            for b in v.to_le_bytes() {
                self.trace_hash = (self.trace_hash ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }

    /// Newest data: in flight, then cached, then durable.
    fn read_current(&mut self, offset: u64, buf: &mut [u8]) {
        let _ = self.media.read(offset, buf);
        let sb = self.sector_size;
        let end = offset + buf.len() as u64;
        for (&sector, data) in self.cache.range(offset / sb..end.div_ceil(sb)) {
            let at = (sector * sb - offset) as usize;
            buf[at..at + data.len()].copy_from_slice(data);
        }
        for w in self.inflight.values() {
            let (ws, we) = (w.offset, w.offset + w.data.len() as u64);
            let (s, e) = (ws.max(offset), we.min(end));
            if s < e {
                buf[(s - offset) as usize..(e - offset) as usize]
                    .copy_from_slice(&w.data[(s - ws) as usize..(e - ws) as usize]);
            }
        }
    }

    /// Each sector of `data` persisted with the plan's chance.
    fn persist_some(&mut self, offset: u64, data: &[u8]) {
        let sb = self.sector_size as usize;
        let p = self.plan.persist_unflushed;
        for (i, chunk) in data.chunks(sb).enumerate() {
            if self.rng.chance(p) {
                let _ = self.media.write(offset + (i * sb) as u64, chunk);
            }
        }
    }

    fn cut(&mut self, cmd: u64) {
        let inflight = std::mem::take(&mut self.inflight);
        for w in inflight.values() {
            self.persist_some(w.offset, &w.data);
        }
        let cache = std::mem::take(&mut self.cache);
        let p = self.plan.persist_unflushed;
        for (sector, data) in cache {
            if self.rng.chance(p) {
                let _ = self.media.write(sector * self.sector_size, &data);
            }
        }
        self.powered = false;
        self.life += 1;
        self.stats.power_cuts += 1;
        self.record(cmd, Kind::Flush, Fault::PowerCut);
    }
}
