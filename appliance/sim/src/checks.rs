//! The end of a run: everything healed, then the promises that hold once the pod has
//! settled (no acknowledged block lost, R copies back at each block's first R members).

use super::*;

impl Run {
    /// Heals everything, restarts the members that are down, lets the pod settle, then
    /// checks that every acknowledged block not deleted is held by some member, and
    /// [`RESTORED_WITHIN`] after the heal by each of its first R members (distinct zones).
    pub(crate) async fn finish(&mut self) -> anyhow::Result<()> {
        self.net.heal();
        self.net.lossless();
        self.etcd_up();
        for m in 0..self.p.members {
            if self.members[m].up.is_none() {
                self.start(m).await?;
            }
        }
        let healed = Instant::now();
        self.note("healed for good".into());
        tokio::time::sleep(Duration::from_secs(4 * LEASE_TTL_S)).await;
        let stored = self.stored();
        for &k in &stored {
            let mut held = false;
            for m in 0..self.p.members {
                if self.read_from(m, k).await.is_some() {
                    held = true;
                    break;
                }
            }
            if !held {
                self.out.violations.push(Violation::Lost { key: k });
            }
        }
        tokio::time::sleep_until(healed + RESTORED_WITHIN).await;
        self.check_restored(&stored).await;
        for m in 0..self.p.members {
            self.stop(m).await?;
        }
        Ok(())
    }

    /// Each of `stored` is held by its first R members in the view (in distinct zones).
    pub(crate) async fn check_restored(&mut self, stored: &[u64]) {
        let Some(c) = (0..self.p.members).find(|&m| self.members[m].up.is_some()) else {
            return;
        };
        let view = self.pod(c).membership.view();
        let zones: std::collections::BTreeSet<&str> =
            view.members.iter().map(|m| m.zone.as_str()).collect();
        let mut found = Vec::new();
        for &k in stored {
            let key = key_of(k);
            let ranked: Vec<usize> = view
                .ranked(NS, &key)
                .into_iter()
                .take(R)
                .filter_map(|t| reach::index_of(t, self.p.members))
                .collect();
            let in_zones: std::collections::BTreeSet<usize> =
                ranked.iter().map(|m| m % ZONES).collect();
            if zones.len() >= R && in_zones.len() < ranked.len() {
                found.push(Violation::SameZone { key: k });
            }
            for m in ranked {
                if self.read_from(m, k).await.is_none() {
                    found.push(Violation::NotRestored { key: k, member: m });
                }
            }
        }
        let missing = found.len();
        self.out.violations.extend(found);
        self.note(format!(
            "{} blocks checked at their first {R} members: {missing} copies missing",
            stored.len()
        ));
    }
}
