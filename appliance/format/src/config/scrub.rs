//! `[scrub]`: the background re-read of every record (docs/RELIABILITY.md, "Scrub").

use super::ByteSize;
use serde::{Deserialize, Serialize};

/// Scrub: a background pass re-reads every record on flash at a bounded rate and checks
/// it as a GET would (header identity, AES-GCM tag, CRC32C). A bad copy is quarantined and
/// stored again from a good copy on another member; with none, the block is lost (a KV
/// event says so, as for an evicted block).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ScrubConfig {
    /// Seconds from the start of one pass to the start of the next; 0 turns scrub off.
    pub interval_s: u64,
    /// Most record bytes per second a pass reads from the device.
    pub bytes_per_s: ByteSize,
}

/// The most a scrub may read per second: a quarter of a fast NVMe drive's reads, so a
/// pass never crowds the clients' own.
pub const SCRUB_BYTES_PER_S_MAX: u64 = 1 << 30;

impl Default for ScrubConfig {
    fn default() -> Self {
        ScrubConfig {
            // A pass a day: a 4 TB drive at the default rate takes about 14 hours.
            interval_s: 86_400,
            bytes_per_s: ByteSize(64 << 20),
        }
    }
}

impl ScrubConfig {
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.interval_s <= 30 * 86_400,
            "scrub.interval_s must be within 0..=2592000 (30 days; 0: off)"
        );
        anyhow::ensure!(
            (1 << 20..=SCRUB_BYTES_PER_S_MAX).contains(&self.bytes_per_s.0),
            "scrub.bytes_per_s must be within 1 MiB..=1 GiB"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Scrub reads within 1 MiB/s..=1 GiB/s; passes at most 30 days apart (0: off).
    #[test]
    fn scrub_settings_are_bounded() {
        let with = |interval_s, bytes: u64| Config {
            scrub: ScrubConfig {
                interval_s,
                bytes_per_s: ByteSize(bytes),
            },
            ..Config::default()
        };
        assert!(with(0, 1 << 20).validate().is_ok());
        assert!(with(30 * 86_400, SCRUB_BYTES_PER_S_MAX).validate().is_ok());
        for (i, b) in [
            (1, (1 << 20) - 1),
            (1, SCRUB_BYTES_PER_S_MAX + 1),
            (30 * 86_400 + 1, 1 << 20),
        ] {
            let e = with(i, b).validate().expect_err("out of bounds");
            assert!(e.to_string().contains("scrub."), "{e}");
        }
    }
}
