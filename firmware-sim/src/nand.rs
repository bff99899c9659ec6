//! Timing and wear of the NAND behind the controller: dies (channels × dies per channel)
//! that each do one read, program or erase at a time; a page-mapped FTL at 4 KiB units,
//! striping pages over the dies; greedy garbage collection when a die runs out of free
//! blocks (its relocations cost die time — the GC stalls — and NAND writes — the write
//! amplification); an SLC-mode cache that a QLC drive programs fast and folds into QLC when
//! dies are idle; a DRAM write cache that acknowledges writes before their programs finish.
//!
//! Time is virtual (nanoseconds since the device started). The model holds no data: the
//! bytes live in [`crate::media`] and the device's volatile cache; this only says when each
//! command completes and what it cost the flash.

use crate::profile::Profile;
use crate::rng::Rng;
use serde::Serialize;
use std::collections::{BinaryHeap, VecDeque};

pub const UNIT: u64 = 4096;
const UNMAPPED: u32 = u32::MAX;
/// Free blocks a die keeps; below this it collects garbage before programming.
const GC_RESERVE_BLOCKS: usize = 2;

#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Wear {
    pub host_bytes_written: u64,
    pub host_bytes_read: u64,
    /// Bytes programmed into NAND: host data, padding of partial pages, GC relocations and
    /// SLC-to-QLC folding.
    pub nand_bytes_written: u64,
    pub gc_relocated_bytes: u64,
    pub erases: u64,
    pub pe_cycles_max: u32,
    pub pe_cycles_avg: f64,
    /// Virtual time spent by dies on garbage collection (ns).
    pub gc_busy_ns: u64,
}

struct Die {
    busy_until: u64,
    /// Block being programmed and the next unit in it.
    open: Option<(u32, u32)>,
    free: VecDeque<u32>,
    /// Units written into the open page but not programmed yet.
    page_fill: u32,
}

pub struct Nand {
    p: Profile,
    units_per_page: u32,
    units_per_block: u32,
    dies: Vec<Die>,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    valid: Vec<u32>,
    erase_count: Vec<u32>,
    next_die: usize,
    slc_used: u64,
    slc_bytes: u64,
    /// Programs not finished yet that hold cached bytes: (done at, bytes), in issue order.
    cache_drain: VecDeque<(u64, u64)>,
    cache_bytes: u64,
    /// Completion times of outstanding commands (queue-depth limit).
    outstanding: BinaryHeap<std::cmp::Reverse<u64>>,
    pub wear: Wear,
}

impl Nand {
    /// A model of `len` logical bytes. Erase blocks are shrunk for small simulated devices so
    /// that every die has at least 64 of them (greedy GC needs many blocks to choose from).
    pub fn new(p: &Profile, len: u64) -> Nand {
        let dies_n = p.dies() as u64;
        let units_per_page = (p.page_bytes as u64 / UNIT) as u32;
        let logical_units = len.div_ceil(UNIT);
        let physical_units = (logical_units as f64 * (1.0 + p.over_provisioning)) as u64;
        let per_die = physical_units
            .div_ceil(dies_n)
            .max(units_per_page as u64 * 128);
        let pages_per_block = (p.pages_per_block as u64)
            .min(per_die / 64 / units_per_page as u64)
            .max(2) as u32;
        let units_per_block = pages_per_block * units_per_page;
        let blocks_per_die = per_die.div_ceil(units_per_block as u64) as u32;
        let blocks = blocks_per_die as usize * dies_n as usize;
        let dies = (0..dies_n as u32)
            .map(|d| Die {
                busy_until: 0,
                open: None,
                free: (d * blocks_per_die..(d + 1) * blocks_per_die).collect(),
                page_fill: 0,
            })
            .collect();
        Nand {
            p: p.clone(),
            units_per_page,
            units_per_block,
            dies,
            l2p: vec![UNMAPPED; logical_units as usize],
            p2l: vec![UNMAPPED; blocks * units_per_block as usize],
            valid: vec![0; blocks],
            erase_count: vec![0; blocks],
            next_die: 0,
            slc_used: 0,
            slc_bytes: (len as f64 * p.slc_cache_fraction) as u64,
            cache_drain: VecDeque::new(),
            cache_bytes: 0,
            outstanding: BinaryHeap::new(),
            wear: Wear::default(),
        }
    }

    fn die_of_block(&self, b: u32) -> usize {
        (b / (self.valid.len() as u32 / self.dies.len() as u32)) as usize
    }

    /// When a command submitted at `now` may start: after the oldest outstanding one
    /// completes if the queue is full.
    pub fn admit(&mut self, now: u64) -> u64 {
        while self.outstanding.peek().is_some_and(|t| t.0 <= now) {
            self.outstanding.pop();
        }
        if self.outstanding.len() < self.p.queue_depth as usize {
            now
        } else {
            self.outstanding.pop().map_or(now, |t| t.0)
        }
    }

    pub fn complete_at(&mut self, done: u64) {
        self.outstanding.push(std::cmp::Reverse(done));
    }

    fn host_xfer(&self, bytes: u64) -> u64 {
        (bytes as f64 / self.p.host_bytes_per_s * 1e9) as u64
    }

    fn chan_xfer(&self, bytes: u64) -> u64 {
        (bytes as f64 / self.p.channel_bytes_per_s * 1e9) as u64
    }

    /// Folds SLC-cached data into the capacity mode in the time dies were idle before `now`
    /// (folding never delays a host command: under constant load the SLC cache fills and
    /// writes go to the capacity mode directly, as on real QLC drives).
    fn fold(&mut self, now: u64, rng: &mut Rng) {
        if self.slc_used == 0 {
            return;
        }
        let page = self.p.page_bytes as u64;
        for d in 0..self.dies.len() {
            while self.slc_used > 0 {
                let cost = self.p.read.sample_ns(rng.normal())
                    + self.p.program.sample_ns(rng.normal())
                    + self.chan_xfer(page);
                if self.dies[d].busy_until + cost > now {
                    break;
                }
                self.dies[d].busy_until += cost;
                let n = page.min(self.slc_used);
                self.slc_used -= n;
                self.wear.nand_bytes_written += n;
            }
        }
    }

    /// Programs one page on die `d` from `start`: SLC mode while the SLC cache has room.
    fn program_page(&mut self, d: usize, start: u64, rng: &mut Rng) -> u64 {
        let page = self.p.page_bytes as u64;
        let t = if self.slc_used + page <= self.slc_bytes {
            self.slc_used += page;
            self.p.program_slc.sample_ns(rng.normal())
        } else {
            self.p.program.sample_ns(rng.normal())
        };
        let xfer = self.chan_xfer(page);
        let die = &mut self.dies[d];
        let begin = start.max(die.busy_until);
        die.busy_until = begin + xfer + t;
        self.wear.nand_bytes_written += page;
        die.busy_until
    }

    /// Next physical unit on die `d`, opening (and if needed collecting) a block.
    fn alloc_unit(&mut self, d: usize, now: u64, rng: &mut Rng) -> u32 {
        loop {
            if let Some((b, next)) = self.dies[d].open {
                if next < self.units_per_block {
                    self.dies[d].open = Some((b, next + 1));
                    return b * self.units_per_block + next;
                }
                self.dies[d].open = None;
            }
            // Each pass frees its victim and spends only the victim's valid units, so the
            // free list grows while victims hold invalid units (over-provisioning makes sure).
            while self.dies[d].free.len() <= GC_RESERVE_BLOCKS {
                if !self.collect(d, now, rng) {
                    break;
                }
            }
            let b = self.dies[d]
                .free
                .pop_front()
                .expect("over-provisioning leaves a free block per die");
            self.dies[d].open = Some((b, 0));
        }
    }

    /// Greedy GC on die `d`: erases the block with the fewest valid units after moving them.
    /// False when no block would gain anything.
    fn collect(&mut self, d: usize, now: u64, rng: &mut Rng) -> bool {
        let per = self.valid.len() / self.dies.len();
        let open = self.dies[d].open.map(|(b, _)| b);
        let free: std::collections::HashSet<u32> = self.dies[d].free.iter().copied().collect();
        let victim = (d * per..(d + 1) * per)
            .map(|b| b as u32)
            .filter(|b| Some(*b) != open && !free.contains(b))
            .min_by_key(|&b| self.valid[b as usize]);
        let Some(v) = victim.filter(|&v| self.valid[v as usize] < self.units_per_block) else {
            return false;
        };
        let start = now.max(self.dies[d].busy_until);
        let moving: Vec<u32> = (0..self.units_per_block)
            .map(|u| v * self.units_per_block + u)
            .filter(|&pu| self.p2l[pu as usize] != UNMAPPED)
            .collect();
        // Relocations go into the die's open block, or a free one when it is full.
        let mut cost = self.p.erase.sample_ns(rng.normal());
        let pages = (moving.len() as u64).div_ceil(self.units_per_page as u64);
        cost += pages
            * (self.p.read.sample_ns(rng.normal())
                + self.p.program.sample_ns(rng.normal())
                + 2 * self.chan_xfer(self.p.page_bytes as u64));
        for pu in moving {
            let l = self.p2l[pu as usize];
            let b = match self.dies[d].open {
                Some((b, n)) if n < self.units_per_block => {
                    self.dies[d].open = Some((b, n + 1));
                    b * self.units_per_block + n
                }
                _ => {
                    let b = self.dies[d].free.pop_front().expect("a free block for GC");
                    self.dies[d].open = Some((b, 1));
                    b * self.units_per_block
                }
            };
            self.map(l, b);
            self.wear.gc_relocated_bytes += UNIT;
            self.wear.nand_bytes_written += UNIT;
        }
        self.erase_count[v as usize] += 1;
        self.wear.erases += 1;
        self.wear.pe_cycles_max = self.wear.pe_cycles_max.max(self.erase_count[v as usize]);
        self.wear.pe_cycles_avg = self.wear.erases as f64 / self.valid.len() as f64;
        self.dies[d].free.push_back(v);
        self.dies[d].busy_until = start + cost;
        self.wear.gc_busy_ns += cost;
        true
    }

    fn map(&mut self, l: u32, pu: u32) {
        let old = self.l2p[l as usize];
        if old != UNMAPPED {
            self.p2l[old as usize] = UNMAPPED;
            self.valid[(old / self.units_per_block) as usize] -= 1;
        }
        self.l2p[l as usize] = pu;
        self.p2l[pu as usize] = l;
        self.valid[(pu / self.units_per_block) as usize] += 1;
    }

    /// A host write of `len` bytes at `offset`, starting at `start`. Returns when the
    /// controller has the data (cached) and when it is programmed.
    pub fn write(&mut self, start: u64, offset: u64, len: u64, rng: &mut Rng) -> (u64, u64) {
        self.fold(start, rng);
        self.wear.host_bytes_written += len;
        let mut programmed = start;
        let first = offset / UNIT;
        for l in first..(offset + len).div_ceil(UNIT) {
            let d = self.next_die;
            let pu = self.alloc_unit(d, start, rng);
            self.map(l as u32, pu);
            self.dies[d].page_fill += 1;
            if self.dies[d].page_fill == self.units_per_page {
                self.dies[d].page_fill = 0;
                programmed = programmed.max(self.program_page(d, start, rng));
                self.next_die = (d + 1) % self.dies.len();
            }
        }
        let received = start + self.host_xfer(len);
        // The write cache holds the bytes until their programs finish.
        while self
            .cache_drain
            .front()
            .is_some_and(|&(t, _)| t <= received)
        {
            let (_, b) = self.cache_drain.pop_front().expect("front");
            self.cache_bytes -= b;
        }
        let mut cached = received;
        while self.cache_bytes + len > self.p.write_cache_bytes {
            let Some((t, b)) = self.cache_drain.pop_front() else {
                break;
            };
            cached = cached.max(t);
            self.cache_bytes -= b;
        }
        self.cache_bytes += len;
        self.cache_drain.push_back((programmed, len));
        (cached, programmed)
    }

    /// Programs every partly filled page now (padding it): what a flush or FUA needs when
    /// the drive has no power-loss protection. Returns when all programs are done.
    pub fn drain(&mut self, start: u64, rng: &mut Rng) -> u64 {
        let mut done = start;
        for d in 0..self.dies.len() {
            if self.dies[d].page_fill > 0 {
                self.dies[d].page_fill = 0;
                done = done.max(self.program_page(d, start, rng));
            }
            done = done.max(self.dies[d].busy_until);
        }
        done
    }

    /// A host read; returns when the data has reached the host.
    pub fn read(&mut self, start: u64, offset: u64, len: u64, rng: &mut Rng) -> u64 {
        self.fold(start, rng);
        self.wear.host_bytes_read += len;
        let mut done = start;
        let mut last_page = None;
        for l in offset / UNIT..(offset + len).div_ceil(UNIT) {
            let pu = self.l2p.get(l as usize).copied().unwrap_or(UNMAPPED);
            if pu == UNMAPPED {
                continue; // never written: the controller answers zeros
            }
            let page = pu / self.units_per_page;
            if last_page == Some(page) {
                continue;
            }
            last_page = Some(page);
            let d = self.die_of_block(pu / self.units_per_block);
            let die = &mut self.dies[d];
            let begin = start.max(die.busy_until);
            die.busy_until = begin
                + self.p.read.sample_ns(rng.normal())
                + (self.p.page_bytes as f64 / self.p.channel_bytes_per_s * 1e9) as u64;
            done = done.max(die.busy_until);
        }
        done + self.host_xfer(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_all(n: &mut Nand, rng: &mut Rng, len: u64, passes: u32, chunk: u64) -> u64 {
        let mut t = 0;
        for _ in 0..passes {
            let mut off = 0;
            while off < len {
                let s = n.admit(t);
                let (c, _) = n.write(s, off, chunk, rng);
                n.complete_at(c);
                t = t.max(c);
                off += chunk;
            }
        }
        n.drain(t, rng)
    }

    /// A drive of `len` logical bytes written `passes` times over in 1 MiB writes; the
    /// time the last one finished.
    fn filled(p: &Profile, len: u64, passes: u32, seed: u64) -> (Nand, Rng, u64) {
        let mut n = Nand::new(p, len);
        let mut rng = Rng::new(seed);
        let done = write_all(&mut n, &mut rng, len, passes, 1 << 20);
        (n, rng, done)
    }

    #[test]
    fn sequential_overwrite_keeps_write_amplification_near_one() {
        let (n, _, _) = filled(&Profile::tlc(), 256 << 20, 4, 1);
        let wa = n.wear.nand_bytes_written as f64 / n.wear.host_bytes_written as f64;
        assert!(wa < 1.1, "write amplification {wa}");
        assert!(n.wear.erases > 0, "overwrites must have erased blocks");
    }

    #[test]
    fn random_overwrite_at_high_utilisation_amplifies() {
        // 1 GiB over 64 dies: large enough that the physical space is the profile's
        // 1.145 × logical, every logical unit written once, then 2 × random 4 KiB overwrites.
        let len = 1 << 30;
        let (mut n, mut rng, _) = filled(&Profile::tlc(), len, 1, 2);
        let before = n.wear;
        let mut t = 0;
        for _ in 0..2 * (len / UNIT) {
            let off = rng.below(len / UNIT) * UNIT;
            let (c, _) = n.write(t, off, UNIT, &mut rng);
            t = c;
        }
        let wa = (n.wear.nand_bytes_written - before.nand_bytes_written) as f64
            / (n.wear.host_bytes_written - before.host_bytes_written) as f64;
        assert!(
            wa > 1.5,
            "random 4 KiB overwrites with 14.5 % spare: WA {wa}"
        );
        assert!(n.wear.gc_busy_ns > 0);
    }

    #[test]
    fn bandwidth_follows_the_dies() {
        // 64 dies × 16 KiB / (400 µs + transfer) ≈ 2.4 GB/s of programs for TLC.
        let len = 1 << 30;
        let (_, mut rng, done) = filled(&Profile::tlc(), len, 1, 3);
        let gbps = len as f64 / done as f64;
        assert!(
            (1.5..4.0).contains(&gbps),
            "TLC sequential write {gbps} GB/s"
        );
        // QLC: 3.3 GB/s from 112 dies; faster while an SLC cache (here 1/8 of 4 GiB) lasts.
        let mut q = Profile::qlc();
        let mut n = Nand::new(&q, 4 << 30);
        let gbps = (2u64 << 30) as f64 / write_all(&mut n, &mut rng, 2 << 30, 1, 1 << 20) as f64;
        assert!(
            (2.5..4.0).contains(&gbps),
            "QLC sequential write {gbps} GB/s"
        );
        q.slc_cache_fraction = 0.125;
        let mut n = Nand::new(&q, 4 << 30);
        let in_slc = write_all(&mut n, &mut rng, 256 << 20, 1, 1 << 20);
        let mut n2 = Nand::new(&q, 4 << 30);
        let past_slc = write_all(&mut n2, &mut rng, 2 << 30, 1, 1 << 20);
        let (fast, slow) = (
            (256u64 << 20) as f64 / in_slc as f64,
            (2u64 << 30) as f64 / past_slc as f64,
        );
        assert!(fast > 1.5 * slow, "SLC {fast} GB/s vs past it {slow} GB/s");
    }
}
