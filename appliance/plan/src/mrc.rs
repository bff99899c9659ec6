//! Miss-ratio curves: the LRU hit ratio of a reference stream as a function of capacity
//! (in blocks), from stack distances (Mattson): a reference hits in an LRU cache of C blocks
//! exactly when fewer than C distinct other blocks were used since its previous use.
//!
//! - [`Mrc::exact`] tracks every key: the reference.
//! - [`Mrc::sampled`] is SHARDS (Waldspurger et al., FAST'15): only keys whose hash falls
//!   under a threshold are tracked (spatial sampling at rate R); their distances, counted
//!   among sampled keys, are scaled by 1/R, and each sampled reference stands for 1/R
//!   references. With a key budget (`max_keys`) the threshold is lowered whenever the
//!   budget is exceeded (fixed-size SHARDS): memory stays bounded whatever the stream.
//! - Heavy hitters are tracked exactly beside the sample. Spatial sampling weighs each
//!   sampled reference as 1/R references, so one very hot key (the first block of a
//!   system prompt shared by every request: 4 % of all references in Mooncake's
//!   conversation trace) is either counted 100 times over or not at all. A Space-Saving
//!   counter over every reference finds keys used at least [`HOT_MIN_REFS`] times; up to
//!   [`HOT_KEYS_MAX`] of them are then tracked exactly (weight 1), their distances the
//!   exact count of hot keys used since plus the sampled estimate of the others.
//! - The sampled part is scaled to weigh exactly the references of keys that are not heavy
//!   hitters (the sampled keys may be a little hotter or colder than the whole; SHARDS_adj's
//!   correction at distance 0 cannot remove weight once heavy hitters are taken out).
//!
//! Measured on Mooncake's traces at 1 % (`appliance/plan/tests/traces.rs`, docs/PLANNING.md): mean
//! absolute error 0.006 (conversation) and 0.011 (synthetic) against the exact curve; without
//! the heavy hitters 0.022 on the conversation trace.
//!
//! Distances go into a histogram with exact bins up to 256 and 64 bins per octave above
//! (1.1 % wide): curves are read at any capacity, and histograms of several nodes sampled
//! with the same hash add up.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use xxhash_rust::xxh3::xxh3_64;

/// References after which a key is tracked exactly, as a heavy hitter.
pub const HOT_MIN_REFS: u64 = 32;
/// Most heavy hitters tracked exactly.
pub const HOT_KEYS_MAX: usize = 64;
/// Counters of the Space-Saving summary that finds heavy hitters.
const HOT_COUNTERS: usize = 256;

/// Hash space of the sampling threshold.
const MODULUS: u64 = 1 << 24;
const EXACT_BINS: u64 = 256;
const BINS_PER_OCTAVE: f64 = 64.0;

/// Which bin a (scaled) distance falls in.
fn bin_of(d: f64) -> u32 {
    if d < EXACT_BINS as f64 {
        d.max(0.0) as u32
    } else {
        EXACT_BINS as u32 + ((d.log2() - 8.0) * BINS_PER_OCTAVE) as u32
    }
}

/// The distances a bin holds: `[lo, hi)`.
fn bin_range(b: u32) -> (f64, f64) {
    if (b as u64) < EXACT_BINS {
        (b as f64, b as f64 + 1.0)
    } else {
        let k = (b - EXACT_BINS as u32) as f64;
        (
            (8.0 + k / BINS_PER_OCTAVE).exp2(),
            (8.0 + (k + 1.0) / BINS_PER_OCTAVE).exp2(),
        )
    }
}

/// Distance histogram: what a curve is read from. Serialisable and additive.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// (bin, weighted references).
    pub bins: Vec<(u32, f64)>,
    /// Weighted references seen for the first time (misses at any capacity).
    pub cold: f64,
    /// Weighted references in all.
    pub total: f64,
}

impl Histogram {
    /// Hit ratio of an LRU cache of `capacity` blocks.
    pub fn hit_ratio(&self, capacity: f64) -> f64 {
        if self.total <= 0.0 {
            return 0.0;
        }
        let mut hits = 0.0;
        for &(b, w) in &self.bins {
            let (lo, hi) = bin_range(b);
            if hi <= capacity {
                hits += w;
            } else if lo < capacity {
                hits += w * (capacity - lo) / (hi - lo);
            }
        }
        (hits / self.total).clamp(0.0, 1.0)
    }

    /// The sum of two histograms (e.g. two nodes' samples of the same stream's keys).
    pub fn merged(&self, other: &Histogram) -> Histogram {
        let mut m: std::collections::BTreeMap<u32, f64> = self.bins.iter().copied().collect();
        for &(b, w) in &other.bins {
            *m.entry(b).or_default() += w;
        }
        Histogram {
            bins: m.into_iter().collect(),
            cold: self.cold + other.cold,
            total: self.total + other.total,
        }
    }
}

/// A Fenwick tree of 0/1 marks over access times: how many tracked keys were last used
/// after a given time.
struct Fenwick(Vec<i64>);

impl Fenwick {
    fn new(n: usize) -> Fenwick {
        Fenwick(vec![0; n + 1])
    }
    fn len(&self) -> usize {
        self.0.len() - 1
    }
    fn add(&mut self, i: usize, v: i64) {
        let mut i = i + 1;
        while i < self.0.len() {
            self.0[i] += v;
            i += i & i.wrapping_neg();
        }
    }
    /// Sum over `[0, i)`.
    fn prefix(&self, i: usize) -> i64 {
        let mut i = i;
        let mut s = 0;
        while i > 0 {
            s += self.0[i];
            i -= i & i.wrapping_neg();
        }
        s
    }
}

/// Miss-ratio curve builder over a stream of block keys.
pub struct Mrc {
    /// Sampling threshold: keys with `hash mod 2^24 < threshold` are tracked.
    threshold: u64,
    max_keys: Option<usize>,
    /// Tracked key → time of its last use, and whether it is a heavy hitter.
    last: HashMap<u64, (u64, bool)>,
    /// Sampled (not hot) keys as (hash mod 2^24, key), to lower the threshold under a key
    /// budget.
    by_hash: BTreeSet<(u64, u64)>,
    /// Times of the sampled keys' last uses, and of the hot keys'.
    marks: Fenwick,
    hot_marks: Fenwick,
    hot: SpaceSaving,
    hot_keys: usize,
    now: u64,
    /// Weighted references by distance bin: of sampled keys, and of heavy hitters.
    hist: HashMap<u32, f64>,
    hot_hist: HashMap<u32, f64>,
    cold: f64,
    hot_cold: f64,
    /// References seen (sampled or not).
    refs: u64,
    /// References of hot keys recorded (weight 1 each).
    hot_refs: u64,
    /// Weighted references of sampled (not hot) keys recorded.
    recorded: f64,
}

impl Mrc {
    /// Every key tracked: the exact curve.
    pub fn exact() -> Mrc {
        Mrc::with_threshold(MODULUS, None)
    }

    /// SHARDS at `rate` (0 < rate ≤ 1), at most `max_keys` keys tracked when given.
    pub fn sampled(rate: f64, max_keys: Option<usize>) -> Mrc {
        assert!(rate > 0.0 && rate <= 1.0, "sampling rate within (0, 1]");
        Mrc::with_threshold(((rate * MODULUS as f64).round() as u64).max(1), max_keys)
    }

    fn with_threshold(threshold: u64, max_keys: Option<usize>) -> Mrc {
        Mrc {
            threshold,
            max_keys,
            last: HashMap::new(),
            by_hash: BTreeSet::new(),
            marks: Fenwick::new(1024),
            hot_marks: Fenwick::new(1024),
            hot: SpaceSaving::default(),
            hot_keys: 0,
            now: 0,
            hist: HashMap::new(),
            hot_hist: HashMap::new(),
            cold: 0.0,
            hot_cold: 0.0,
            refs: 0,
            hot_refs: 0,
            recorded: 0.0,
        }
    }

    /// The sampling rate now.
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / MODULUS as f64
    }

    /// Keys tracked now (the memory it holds is proportional).
    pub fn tracked(&self) -> usize {
        self.last.len()
    }

    fn spatial_hash(key: u64) -> u64 {
        xxh3_64(&key.to_le_bytes()) % MODULUS
    }

    /// A reference to a block named by bytes (the node's keys).
    pub fn access_bytes(&mut self, key: &[u8]) {
        self.access(xxh3_64(key));
    }

    /// A reference to block `key`.
    pub fn access(&mut self, key: u64) {
        self.refs += 1;
        let sampling = self.threshold < MODULUS;
        let h = Self::spatial_hash(key);
        let known = self.last.get(&key).copied();
        let mut is_hot = known.is_some_and(|(_, hot)| hot);
        if sampling
            && !is_hot
            && self.hot.count(key) >= HOT_MIN_REFS
            && self.hot_keys < HOT_KEYS_MAX
        {
            // A heavy hitter from now on: tracked exactly.
            is_hot = true;
            self.hot_keys += 1;
            if let Some((t, _)) = known {
                self.marks.add(t as usize, -1);
                self.hot_marks.add(t as usize, 1);
                self.by_hash.remove(&(h, key));
                self.last.insert(key, (t, true));
            }
        }
        if !is_hot && h >= self.threshold {
            return;
        }
        let rate = self.rate();
        let weight = if is_hot { 1.0 } else { 1.0 / rate };
        if is_hot {
            self.hot_refs += 1;
        } else {
            self.recorded += weight;
        }
        match self.last.get(&key).copied() {
            Some((t, hot)) => {
                // Keys used after t (t's own mark included, removed below): the sampled
                // ones stand for 1/R each, the hot ones for themselves.
                let end = self.marks.len();
                let sampled_after = self.marks.prefix(end) - self.marks.prefix(t as usize + 1);
                let hot_after = self.hot_marks.prefix(end) - self.hot_marks.prefix(t as usize + 1);
                if hot {
                    self.hot_marks.add(t as usize, -1);
                } else {
                    self.marks.add(t as usize, -1);
                }
                let d = sampled_after as f64 / rate + hot_after as f64;
                let hist = if is_hot {
                    &mut self.hot_hist
                } else {
                    &mut self.hist
                };
                *hist.entry(bin_of(d)).or_default() += weight;
            }
            None if is_hot => self.hot_cold += weight,
            None => {
                self.cold += weight;
                self.by_hash.insert((h, key));
            }
        }
        if self.now as usize == self.marks.len() {
            self.compact();
        }
        if is_hot {
            self.hot_marks.add(self.now as usize, 1);
        } else {
            self.marks.add(self.now as usize, 1);
        }
        self.last.insert(key, (self.now, is_hot));
        self.now += 1;
        if let Some(max) = self.max_keys {
            while self.last.len() > max + self.hot_keys {
                self.lower_threshold();
            }
        }
    }

    /// Fixed-size SHARDS: the threshold drops to the largest tracked hash, whose keys are
    /// forgotten.
    fn lower_threshold(&mut self) {
        let Some(&(h, _)) = self.by_hash.iter().next_back() else {
            return;
        };
        self.threshold = h;
        while let Some(&(hh, k)) = self.by_hash.iter().next_back() {
            if hh < h {
                break;
            }
            self.by_hash.remove(&(hh, k));
            if let Some((t, _)) = self.last.remove(&k) {
                self.marks.add(t as usize, -1);
            }
        }
    }

    /// Renumbers the tracked keys' times 0..n (in order), so the marks stay within twice
    /// the tracked keys.
    fn compact(&mut self) {
        let mut live: Vec<(u64, u64, bool)> = self
            .last
            .iter()
            .map(|(&k, &(t, hot))| (t, k, hot))
            .collect();
        live.sort_unstable();
        let n = (2 * live.len()).max(1024);
        self.marks = Fenwick::new(n);
        self.hot_marks = Fenwick::new(n);
        for (i, &(_, k, hot)) in live.iter().enumerate() {
            self.last.insert(k, (i as u64, hot));
            if hot {
                self.hot_marks.add(i, 1);
            } else {
                self.marks.add(i, 1);
            }
        }
        self.now = live.len() as u64;
    }

    /// The histogram so far: exact, or the sampled part scaled to the references it stands
    /// for plus the heavy hitters as counted. (A heavy hitter's references before it was
    /// found count with the sampled part: at most [`HOT_MIN_REFS`] each.)
    pub fn histogram(&self) -> Histogram {
        let total = self.refs as f64;
        // The sampled part stands for every reference of keys that are not heavy hitters:
        // scaled so that it weighs exactly that (the sample set of keys may be a little
        // hotter or colder than the whole); heavy hitters are counted as they are.
        let scale = if self.threshold < MODULUS && self.recorded > 0.0 {
            (total - self.hot_refs as f64).max(0.0) / self.recorded
        } else {
            1.0
        };
        let hot = Histogram {
            bins: self.hot_hist.iter().map(|(&b, &w)| (b, w)).collect(),
            cold: self.hot_cold,
            total: self.hot_refs as f64,
        };
        let mut bins: Vec<(u32, f64)> = self.hist.iter().map(|(&b, &w)| (b, w * scale)).collect();
        bins.sort_by_key(|&(b, _)| b);
        Histogram {
            bins,
            cold: self.cold * scale,
            total: total - self.hot_refs as f64,
        }
        .merged(&hot)
    }
}

/// Space-Saving (Metwally et al.): approximate counts of the most frequent keys in a fixed
/// number of counters. A counter taken over from another key inherits its count as an
/// error bound: `count - error` never exceeds the key's true count.
#[derive(Default)]
struct SpaceSaving {
    /// key → (count, error).
    counts: HashMap<u64, (u64, u64)>,
    /// (count, key), to find the smallest counter.
    order: BTreeSet<(u64, u64)>,
}

impl SpaceSaving {
    /// Counts one reference of `key`; how many references of it are certain.
    fn count(&mut self, key: u64) -> u64 {
        let (c, e) = match self.counts.get(&key).copied() {
            Some((c, e)) => {
                self.order.remove(&(c, key));
                (c + 1, e)
            }
            None if self.counts.len() < HOT_COUNTERS => (1, 0),
            None => {
                // Takes over the smallest counter.
                let (c, k) = self.order.pop_first().expect("a full summary has counters");
                self.counts.remove(&k);
                (c + 1, c)
            }
        };
        self.counts.insert(key, (c, e));
        self.order.insert((c, key));
        c - e
    }
}

/// The exact curve of a trace's block references at `capacities` (blocks).
pub fn exact_curve(reqs: &[crate::trace::Request], capacities: &[u64]) -> Vec<(u64, f64)> {
    let mut m = Mrc::exact();
    for r in reqs {
        for &k in &r.hash_ids {
            m.access(k);
        }
    }
    let h = m.histogram();
    capacities
        .iter()
        .map(|&c| (c, h.hit_ratio(c as f64)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lru::Lru;
    use proptest::prelude::*;

    #[test]
    fn bins_cover_distances_in_order() {
        let mut prev = 0.0;
        for b in 0..2000u32 {
            let (lo, hi) = bin_range(b);
            assert!((lo - prev).abs() < 1e-6 * lo.max(1.0), "bin {b}");
            assert!(hi > lo);
            let mid = (lo + hi) / 2.0;
            assert_eq!(bin_of(mid), b);
            prev = hi;
        }
    }

    proptest! {
        // The exact curve equals an LRU simulation at every capacity.
        #[test]
        fn exact_equals_lru(keys in proptest::collection::vec(0u64..40, 1..600), cap in 1usize..30) {
            let mut m = Mrc::exact();
            let mut l = Lru::new(cap);
            let mut hits = 0;
            for &k in &keys {
                m.access(k);
                hits += l.touch(k) as u64;
            }
            let want = hits as f64 / keys.len() as f64;
            let got = m.histogram().hit_ratio(cap as f64);
            prop_assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        }
    }

    #[test]
    fn a_key_budget_bounds_memory() {
        let mut m = Mrc::sampled(1.0, Some(1000));
        for i in 0..200_000u64 {
            m.access(i % 50_000);
        }
        assert!(m.tracked() <= 1000);
        assert!(m.rate() < 0.05, "rate {}", m.rate());
        // The curve of a loop over 50,000 keys: all misses below 50,000 blocks, all hits
        // (after the first pass) above.
        let h = m.histogram();
        assert!(h.hit_ratio(40_000.0) < 0.1, "{}", h.hit_ratio(40_000.0));
        assert!(h.hit_ratio(60_000.0) > 0.6, "{}", h.hit_ratio(60_000.0));
    }

    #[test]
    fn histograms_add_up() {
        let mut a = Mrc::exact();
        let mut b = Mrc::exact();
        for i in 0..100u64 {
            a.access(i % 10);
            b.access(i % 20);
        }
        let m = a.histogram().merged(&b.histogram());
        assert_eq!(m.total, 200.0);
        assert!((m.hit_ratio(25.0) - (90.0 + 80.0) / 200.0).abs() < 1e-9);
    }
}
