//! Device profiles: the numbers that make a simulated device behave like a class of real
//! drives. Three are built in (`slc`, `tlc`, `qlc`; their sources are in docs/FIRMWARE-SIM.md); any
//! other is a TOML file with the same fields.

use serde::{Deserialize, Serialize};

/// A latency distribution in microseconds: log-normal through the given median and 99th
/// percentile (a shape that fits NAND read and program times, which have a long right tail).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
}

impl Latency {
    pub const fn fixed(us: f64) -> Latency {
        Latency {
            p50_us: us,
            p99_us: us,
        }
    }

    /// A sample in nanoseconds from a standard normal deviate `z`.
    pub fn sample_ns(&self, z: f64) -> u64 {
        // ln(p99) = ln(p50) + 2.326 σ
        let sigma = if self.p99_us > self.p50_us && self.p50_us > 0.0 {
            (self.p99_us / self.p50_us).ln() / 2.326
        } else {
            0.0
        };
        (self.p50_us * (sigma * z).exp() * 1e3) as u64
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    /// Capacity of the real drive this profile stands for (for endurance projections; the
    /// simulated device itself is as large as it is asked to be).
    pub rated_capacity_bytes: u64,
    /// Rated endurance: drive writes per day over `warranty_years`.
    pub rated_dwpd: f64,
    pub warranty_years: f64,
    /// Program/erase cycles a block is rated for.
    pub pe_cycles: u32,
    /// Smallest unit a power loss can tear (the atomic write unit).
    pub sector_bytes: u32,
    /// Submission queue depth: commands beyond it wait for a completion.
    pub queue_depth: u32,
    pub channels: u32,
    pub dies_per_channel: u32,
    /// NAND page (the program unit), and pages per erase block.
    pub page_bytes: u32,
    pub pages_per_block: u32,
    /// Bytes per second one channel moves between controller and dies.
    pub channel_bytes_per_s: f64,
    /// Bytes per second over the host link (PCIe).
    pub host_bytes_per_s: f64,
    pub read: Latency,
    /// Program of one page in the capacity mode (TLC or QLC).
    pub program: Latency,
    /// Program of one page in SLC mode (the write cache of a QLC drive); used while the SLC
    /// cache has room.
    pub program_slc: Latency,
    pub erase: Latency,
    /// Share of the capacity run in SLC mode as a write cache (0: none). Folded into the
    /// capacity mode in the background when dies are idle.
    pub slc_cache_fraction: f64,
    /// Spare physical space over the logical capacity (0.07 = 7 %), room for GC.
    pub over_provisioning: f64,
    /// Volatile DRAM write cache in front of the NAND.
    pub write_cache_bytes: u64,
    /// With power-loss protection, the write cache survives a power cut (capacitors drain it
    /// to NAND); without it, whatever was not flushed may be lost.
    pub power_loss_protection: bool,
}

impl Profile {
    /// A datacenter TLC NVMe drive, after the Kioxia CD6-R 3.84 TB (PCIe 4.0 x4, 16
    /// channels, BiCS4 96-layer TLC, 1 DWPD, power-loss protection). Sources and the
    /// arithmetic that ties die count, page and program time to the datasheet's 4.0 GB/s
    /// sequential write and 1 M read IOPS: docs/FIRMWARE-SIM.md.
    pub fn tlc() -> Profile {
        Profile {
            name: "tlc".into(),
            rated_capacity_bytes: 3_840_000_000_000,
            rated_dwpd: 1.0,
            warranty_years: 5.0,
            pe_cycles: 3000,
            sector_bytes: 4096,
            queue_depth: 256,
            channels: 16,
            dies_per_channel: 4,
            // One multi-plane one-shot program: 2 planes × 3 pages × 16 KiB.
            page_bytes: 96 << 10,
            pages_per_block: 192,
            channel_bytes_per_s: 533e6,
            host_bytes_per_s: 6.2e9,
            read: Latency {
                p50_us: 58.0,
                p99_us: 80.0,
            },
            program: Latency {
                p50_us: 1600.0,
                p99_us: 2200.0,
            },
            program_slc: Latency::fixed(250.0),
            erase: Latency::fixed(4000.0),
            slc_cache_fraction: 0.0,
            over_provisioning: 0.145,
            write_cache_bytes: 32 << 20,
            power_loss_protection: true,
        }
    }

    /// A QLC capacity NVMe drive, after the Solidigm D5-P5336 61.44 TB (PCIe 4.0 x4, 7.0 /
    /// 3.3 GB/s, 1,005 K read IOPS, 65 PBW = 0.58 DWPD). Of its 370 dies about 110 program
    /// at once within its 25 W budget: the model has 112 (16 × 7), which gives both the
    /// sequential write and the random read rating. A small static SLC region (about 0.1 %
    /// of capacity, 64 GiB on the real drive) takes writes first and is folded into QLC in
    /// idle time.
    pub fn qlc() -> Profile {
        Profile {
            name: "qlc".into(),
            rated_capacity_bytes: 61_440_000_000_000,
            rated_dwpd: 0.58,
            warranty_years: 5.0,
            pe_cycles: 1500,
            sector_bytes: 4096,
            queue_depth: 256,
            channels: 16,
            dies_per_channel: 7,
            // One foggy-fine program: 4 planes × 4 pages × 16 KiB.
            page_bytes: 256 << 10,
            pages_per_block: 192,
            channel_bytes_per_s: 1.2e9,
            host_bytes_per_s: 7.0e9,
            read: Latency {
                p50_us: 100.0,
                p99_us: 140.0,
            },
            program: Latency {
                p50_us: 8700.0,
                p99_us: 11000.0,
            },
            // The same 256 KiB in SLC mode: four 64 KiB programs of 250 µs.
            program_slc: Latency::fixed(1000.0),
            erase: Latency::fixed(6000.0),
            slc_cache_fraction: 0.001,
            over_provisioning: 0.10,
            write_cache_bytes: 64 << 20,
            power_loss_protection: true,
        }
    }

    /// A datacenter SLC drive, the fast tier of a node with two (issue #36): after the
    /// Kioxia FL6 800 GB (XL-Flash, SLC BiCS4 with 16 planes; PCIe 4.0 x4, 6.2 / 5.8 GB/s,
    /// 1.5 M read IOPS, 29 µs read latency, 60 DWPD over 5 years). Die count, page and
    /// program time are assumptions that give the datasheet's figures (docs/FIRMWARE-SIM.md).
    pub fn slc() -> Profile {
        Profile {
            name: "slc".into(),
            rated_capacity_bytes: 800_000_000_000,
            rated_dwpd: 60.0,
            warranty_years: 5.0,
            pe_cycles: 100_000,
            sector_bytes: 4096,
            queue_depth: 256,
            channels: 16,
            dies_per_channel: 2,
            // One multi-plane program: 16 planes × 4 KiB.
            page_bytes: 64 << 10,
            pages_per_block: 256,
            channel_bytes_per_s: 800e6,
            host_bytes_per_s: 6.2e9,
            read: Latency {
                p50_us: 21.0,
                p99_us: 30.0,
            },
            program: Latency {
                p50_us: 350.0,
                p99_us: 450.0,
            },
            program_slc: Latency {
                p50_us: 350.0,
                p99_us: 450.0,
            },
            erase: Latency::fixed(3000.0),
            slc_cache_fraction: 0.0,
            over_provisioning: 0.28,
            write_cache_bytes: 32 << 20,
            power_loss_protection: true,
        }
    }

    /// A built-in profile by name (`slc`, `tlc`, `qlc`, and `-noplp` variants without power-loss
    /// protection, the worst case the reliability suites use), or a TOML file.
    pub fn load(spec: &str) -> Result<Profile, String> {
        let (base, noplp) = match spec.strip_suffix("-noplp") {
            Some(b) => (b, true),
            None => (spec, false),
        };
        let mut p = match base {
            "slc" => Profile::slc(),
            "tlc" => Profile::tlc(),
            "qlc" => Profile::qlc(),
            path => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    format!("device profile {path:?}: not slc, tlc or qlc, and not readable: {e}")
                })?;
                toml::from_str(&text).map_err(|e| format!("device profile {path}: {e}"))?
            }
        };
        if noplp {
            p.power_loss_protection = false;
            p.name.push_str("-noplp");
        }
        p.check()?;
        Ok(p)
    }

    pub fn check(&self) -> Result<(), String> {
        let pow2 = |v: u32| v.is_power_of_two();
        if !(pow2(self.sector_bytes) && (512..=4096).contains(&self.sector_bytes)) {
            return Err("sector_bytes must be a power of two in 512..=4096".into());
        }
        if self.page_bytes == 0 || !self.page_bytes.is_multiple_of(4096) {
            return Err("page_bytes must be a positive multiple of 4096".into());
        }
        if !(0.0..=0.5).contains(&self.slc_cache_fraction) {
            return Err("slc_cache_fraction must be within 0..=0.5".into());
        }
        if self.channels == 0
            || self.dies_per_channel == 0
            || self.pages_per_block < 2
            || self.queue_depth == 0
        {
            return Err(
                "channels, dies_per_channel, queue_depth must be positive and \
                        pages_per_block at least 2"
                    .into(),
            );
        }
        if !(0.02..=1.0).contains(&self.over_provisioning) {
            return Err("over_provisioning must be within 0.02..=1.0".into());
        }
        if self.channel_bytes_per_s <= 0.0 || self.host_bytes_per_s <= 0.0 {
            return Err("channel_bytes_per_s and host_bytes_per_s must be positive".into());
        }
        Ok(())
    }

    pub fn dies(&self) -> u32 {
        self.channels * self.dies_per_channel
    }

    /// Rated total bytes written over the warranty.
    pub fn rated_tbw_bytes(&self) -> f64 {
        self.rated_dwpd * self.rated_capacity_bytes as f64 * 365.0 * self.warranty_years
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_valid_and_files_round_trip() {
        for p in [Profile::slc(), Profile::tlc(), Profile::qlc()] {
            p.check().expect("valid");
            let dir = std::env::temp_dir().join(format!("sim-profile-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("dir");
            let f = dir.join(format!("{}.toml", p.name));
            std::fs::write(&f, toml::to_string(&p).expect("toml")).expect("write");
            assert_eq!(Profile::load(f.to_str().expect("utf-8")).expect("load"), p);
            let _ = std::fs::remove_dir_all(&dir);
        }
        assert!(
            !Profile::load("tlc-noplp")
                .expect("noplp")
                .power_loss_protection
        );
        assert!(Profile::load("nope").is_err());
    }

    #[test]
    fn latency_quantiles() {
        let l = Latency {
            p50_us: 100.0,
            p99_us: 300.0,
        };
        assert_eq!(l.sample_ns(0.0), 100_000);
        let p99 = l.sample_ns(2.326) as f64;
        assert!((p99 - 300_000.0).abs() < 1000.0, "{p99}");
    }
}
