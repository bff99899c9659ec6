//! Fault plans: what goes wrong, and when, decided from a seed so that a run can be replayed.
//!
//! Every command the device receives gets a number (from 0, reads, writes and flushes alike);
//! faults happen with a probability per command of their kind, or exactly at the command
//! numbers of the schedule. Decisions are drawn from the plan's own generator in command
//! order, so the same plan over the same commands gives the same faults.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Bits of a read's data flipped, beyond what ECC corrects; the read reports success.
    BitFlip,
    /// The read fails (uncorrectable error).
    Uncorrectable,
    /// The write fails; nothing of it is stored.
    ProgramFail,
    /// The flush fails; nothing is made durable by it.
    FlushFail,
    /// The write reports success but its data lands at another address.
    Misdirect,
    /// The command takes `latency_spike_us` longer.
    LatencySpike,
    /// Power is cut as the command arrives: a write is torn, unflushed data may be lost, and
    /// every command fails until power returns.
    PowerCut,
    /// The device answers "no space" to writes from here on, until told otherwise.
    Full,
    /// The device takes writes again.
    SpaceBack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scheduled {
    pub command: u64,
    pub fault: Fault,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultPlan {
    pub seed: u64,
    /// Per read.
    pub bit_flip: f64,
    /// Bits flipped by one [`Fault::BitFlip`]: 1 to this many.
    pub bit_flips_max: u32,
    pub uncorrectable: f64,
    /// Per write.
    pub program_fail: f64,
    pub misdirect: f64,
    /// Per flush.
    pub flush_fail: f64,
    /// Per command.
    pub latency_spike: f64,
    pub latency_spike_us: f64,
    /// At a power cut, the chance that each sector of an unflushed or in-flight write was
    /// persisted anyway (independently, so in no particular order).
    pub persist_unflushed: f64,
    /// The write a power cut tears keeps exactly its first this many sectors (instead of
    /// each by `persist_unflushed`): to walk every tear point of a record.
    pub torn_keep_sectors: Option<u32>,
    pub schedule: Vec<Scheduled>,
}

impl Default for FaultPlan {
    fn default() -> FaultPlan {
        FaultPlan {
            seed: 0,
            bit_flip: 0.0,
            bit_flips_max: 1,
            uncorrectable: 0.0,
            program_fail: 0.0,
            misdirect: 0.0,
            flush_fail: 0.0,
            latency_spike: 0.0,
            latency_spike_us: 10_000.0,
            persist_unflushed: 0.5,
            torn_keep_sectors: None,
            schedule: Vec::new(),
        }
    }
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> FaultPlan {
        FaultPlan::default()
    }

    pub fn at(mut self, command: u64, fault: Fault) -> FaultPlan {
        self.schedule.push(Scheduled { command, fault });
        self
    }

    pub fn load(path: &str) -> Result<FaultPlan, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("fault plan {path}: {e}"))?;
        let p: FaultPlan = toml::from_str(&text).map_err(|e| format!("fault plan {path}: {e}"))?;
        let probs = [
            p.bit_flip,
            p.uncorrectable,
            p.program_fail,
            p.misdirect,
            p.flush_fail,
            p.latency_spike,
            p.persist_unflushed,
        ];
        if probs.iter().any(|v| !(0.0..=1.0).contains(v)) {
            return Err(format!(
                "fault plan {path}: probabilities must be within 0..=1"
            ));
        }
        Ok(p)
    }

    pub(crate) fn scheduled(&self, command: u64) -> impl Iterator<Item = Fault> + '_ {
        self.schedule
            .iter()
            .filter(move |s| s.command == command)
            .map(|s| s.fault)
    }
}
