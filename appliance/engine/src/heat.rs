//! How often each block is read, approximately (sans-IO): a count-min sketch of 4-bit
//! counters that halves itself as it fills, TinyLFU's frequency sketch (Einziger, Friedman
//! and Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", 2017). A node of two
//! tiers counts every block it serves into it, and promotion asks it whether a block is
//! read more often than what its move would push out of `fast` (`writer::promote`).
//!
//! Fixed memory (`width` bytes per row, two counters a byte), no allocation per key; an
//! estimate is never below the key's true count since the last halving, and above it only
//! by collisions, which the four rows make rare.

const ROWS: usize = 4;
/// A 4-bit counter's ceiling.
pub const COUNTER_MAX: u8 = 15;

pub struct Sketch {
    /// `ROWS` rows of `width` counters, two per byte.
    table: Vec<u8>,
    width: usize,
    /// Increments since the last halving.
    added: u64,
    /// Increments after which every counter is halved (10 per counter of a row: the
    /// window over which frequencies are compared).
    halve_at: u64,
}

impl Sketch {
    /// A sketch of `width` counters per row (rounded up to a power of two, at least 64).
    pub fn new(width: usize) -> Sketch {
        let width = width.next_power_of_two().max(64);
        Sketch {
            table: vec![0; ROWS * width / 2],
            width,
            added: 0,
            halve_at: 10 * width as u64,
        }
    }

    /// The counter of `row` for the hash pair `(h1, h2)`: (byte, shift).
    fn slot(&self, row: usize, (h1, h2): (u64, u64)) -> (usize, u32) {
        let i = (h1.wrapping_add((row as u64).wrapping_mul(h2)) as usize) & (self.width - 1);
        let at = row * self.width + i;
        (at / 2, (at % 2) as u32 * 4)
    }

    /// The hash pair a key is counted under: computed before the sketch's lock is taken.
    pub fn hashes(key: &[u8]) -> (u64, u64) {
        let h = xxhash_rust::xxh3::xxh3_128(key);
        (h as u64, ((h >> 64) as u64) | 1)
    }

    /// One read of `key`.
    pub fn add(&mut self, key: &[u8]) {
        let h = Self::hashes(key);
        let est = self.estimate_hashed(h);
        if est < COUNTER_MAX {
            // Conservative update: only the counters at the minimum grow.
            for row in 0..ROWS {
                let (b, s) = self.slot(row, h);
                if (self.table[b] >> s) & 0xf == est {
                    self.table[b] += 1 << s;
                }
            }
        }
        self.added += 1;
        if self.added >= self.halve_at {
            self.halve();
        }
    }

    /// About how often `key` was read (0..=15), recent reads weighing more.
    pub fn estimate(&self, key: &[u8]) -> u8 {
        self.estimate_hashed(Self::hashes(key))
    }

    /// [`Sketch::estimate`] of a key by its [`Sketch::hashes`].
    pub fn estimate_hashed(&self, h: (u64, u64)) -> u8 {
        (0..ROWS)
            .map(|row| {
                let (b, s) = self.slot(row, h);
                (self.table[b] >> s) & 0xf
            })
            .min()
            .unwrap_or(0)
    }

    /// Every counter halved: what was read long ago weighs half.
    fn halve(&mut self) {
        for b in &mut self.table {
            *b = (*b >> 1) & 0x77;
        }
        self.added /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_count_reads_and_never_undercount() {
        let mut s = Sketch::new(1 << 12);
        for i in 0..200u32 {
            for _ in 0..(i % 8) {
                s.add(&i.to_le_bytes());
            }
        }
        let mut over = 0;
        for i in 0..200u32 {
            let e = s.estimate(&i.to_le_bytes());
            assert!(e >= (i % 8) as u8, "{i}: {e}");
            over += u32::from(e > (i % 8) as u8);
        }
        assert!(over < 10, "{over} of 200 overestimated in a sparse sketch");
        assert_eq!(s.estimate(b"never"), 0);
    }

    #[test]
    fn counters_saturate_and_halve_as_the_sketch_fills() {
        let mut s = Sketch::new(64);
        for _ in 0..100 {
            s.add(b"hot");
        }
        s.add(b"warm");
        assert_eq!((s.estimate(b"hot"), s.estimate(b"warm")), (COUNTER_MAX, 1));
        // Halved: a count of 15 weighs 7, one of 1 nothing; no counter spills into its
        // neighbour in the byte.
        s.halve();
        assert_eq!((s.estimate(b"hot"), s.estimate(b"warm")), (7, 0));
        assert_eq!(s.added, 50);
        // 10 increments per counter of a row since the last halving halve it again.
        for i in 0..590u32 {
            s.add(&i.to_le_bytes());
        }
        assert_eq!(s.added, 320, "halved once more at 640");
    }
}
