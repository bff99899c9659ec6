//! The faults: a member isolated, cut from etcd or cut one way, etcd stopped, a member
//! restarted; each healed when its time is up.

use super::*;

impl Run {
    /// A fault, lasting 1 to 20 s of pod time (healed by [`Run::heal_when_due`]); the
    /// member it strikes becomes the workload's focus meanwhile.
    pub(crate) async fn fault(&mut self) -> anyhow::Result<()> {
        if self.fault_until.is_some() {
            return Ok(());
        }
        self.out.faults += 1;
        let n = self.p.members;
        let m = self.rng.below(n as u64) as usize;
        let lasts = Duration::from_millis(1_000 + self.rng.below(19_000));
        self.fault_until = Some(Instant::now() + lasts);
        self.focus = Some(m);
        let what = match self.rng.below(5) {
            0 | 1 => {
                self.net.isolate(m, n);
                format!("m{m:02} isolated")
            }
            2 => {
                self.net.cut_from_meta(m);
                format!("m{m:02} cut from etcd")
            }
            3 => {
                let o = (m + 1 + self.rng.below(n as u64 - 1) as usize) % n;
                self.net.cut_one_way(m, o);
                format!("m{m:02} -> m{o:02} cut")
            }
            _ => {
                self.net.meta_down(true);
                self.meta.stop();
                self.focus = None;
                "etcd down".into()
            }
        };
        self.note(format!("fault: {what} for {} ms", lasts.as_millis()));
        Ok(())
    }

    /// Heals the fault whose time is up.
    pub(crate) fn heal_when_due(&mut self) {
        if self.fault_until.is_some_and(|t| Instant::now() >= t) {
            self.fault_until = None;
            self.focus = None;
            self.net.heal();
            self.etcd_up();
            self.note("healed".into());
        }
    }

    /// etcd runs (again, if it was stopped: every lease lives its whole TTL again).
    pub(crate) fn etcd_up(&mut self) {
        if self.net.is_meta_down() {
            self.net.meta_down(false);
            self.meta.start();
        }
    }

    /// Stops a member and starts it again after up to 8 s; half of the time its power is
    /// cut first (its device loses what it had not flushed; the index, kept by RocksDB,
    /// loses nothing written without the WAL only because the process stays: as in the
    /// node's power-loss suites).
    pub(crate) async fn restart(&mut self) -> anyhow::Result<()> {
        let m = self.rng.below(self.p.members as u64) as usize;
        self.out.faults += 1;
        let power_cut = self.rng.below(2) == 0
            && self.members[m].up.is_some()
            && std::env::var("NOPC").is_err();
        if power_cut {
            self.members[m].dev.power_cut();
            self.note(format!("m{m:02} lost power"));
        }
        self.stop(m).await?;
        tokio::time::sleep(Duration::from_millis(self.rng.below(8_000))).await;
        if power_cut {
            self.members[m].dev.power_on();
        }
        self.start(m).await
    }
}
