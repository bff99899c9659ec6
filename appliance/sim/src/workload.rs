//! The simulated clients: puts, deletes, reads and listings through the members, as a
//! node serves them (the pod's coordinator), each answer checked against what the clients
//! know of the block.

use super::*;

impl Run {
    /// A member that runs, chosen by the seed (None when none does).
    pub(crate) fn running(&mut self) -> Option<usize> {
        let up: Vec<usize> = (0..self.p.members)
            .filter(|&m| self.members[m].up.is_some())
            .collect();
        (!up.is_empty()).then(|| up[self.rng.below(up.len() as u64) as usize])
    }

    /// The member a put or delete is sent through: one that runs, nine times in ten not
    /// the one a fault strikes (a write through it waits out the fault, and the one
    /// client would do nothing else meanwhile).
    pub(crate) fn door(&mut self) -> Option<usize> {
        let others: Vec<usize> = (0..self.p.members)
            .filter(|&m| self.members[m].up.is_some() && Some(m) != self.focus)
            .collect();
        match self.rng.below(10) {
            0 => self.running(),
            _ if others.is_empty() => self.running(),
            _ => Some(others[self.rng.below(others.len() as u64) as usize]),
        }
    }

    /// A new block, put through member `c` as a node serves a routed put (the pod's
    /// [`Coordinator`](ctxpod_pod::coordinator::Coordinator)): to its first R members
    /// that `c` can reach, in rank; acknowledged when R stored it.
    pub(crate) async fn put(&mut self) {
        let Some(c) = self.door() else { return };
        let k = self.next_key;
        self.next_key += 1;
        let key = key_of(k);
        let member = self.member(c, &key, Op::Put(bytes_of(k)));
        let answer = self.write(c, &key, false, &member).await;
        // In member order: a round's members answer in an order the devices decide.
        let mut took = member.took.into_inner().expect("one thread");
        took.sort_unstable();
        let stored = took.len();
        self.holders.insert(k, took);
        let what = match answer {
            Ok(SimAnswer::Stored) => {
                self.blocks.insert(k, Known::Stored);
                self.out.puts_acked += 1;
                "acknowledged".to_string()
            }
            other => {
                self.out.puts_refused += 1;
                format!("refused ({other:?})")
            }
        };
        self.note(format!("put {k} via m{c:02}: {stored} copies, {what}"));
    }

    /// A put or delete of `key` through member `c`, as the node serves it: routed, planned
    /// and (a delete) recorded and settled by the pod's coordinator.
    pub(crate) async fn write<M: coordinator::Member<Answer = SimAnswer>>(
        &self,
        c: usize,
        key: &[u8],
        delete: bool,
        member: &M,
    ) -> Result<SimAnswer, coordinator::Refusal> {
        let pod = self.pod(c);
        let mut coordinator = pod.coordinator();
        if self.p.plant == Some(Plant::UnrecordedDeletes) {
            coordinator.tombstones = None;
        }
        let view = pod.membership.view();
        let method = match delete {
            true => http::Method::DELETE,
            false => http::Method::PUT,
        };
        let route = coordinator.route(&view, &method, NS, key, R);
        let Some(plan) = coordinator.write_plan(&view, route, NS, key) else {
            // A pod of one alone: served here.
            return Ok(member.ask(&pod.me, true).await.unwrap_or(SimAnswer::Failed));
        };
        let placed = coordinator::Placed {
            ns: NS,
            key,
            copies: R,
            stored_ns: Some(NS),
        };
        coordinator.write(&view, plan, placed, member).await
    }

    /// Member `c`'s requests for `key` over the simulated network.
    pub(crate) fn member<'a>(&'a self, c: usize, key: &'a [u8], op: Op) -> SimMember<'a> {
        SimMember {
            running: &self.running,
            net: &self.net,
            from: c,
            key,
            op,
            took: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Deletes a stored block through member `c`, as a node does: asks every member that
    /// may hold it, records the tombstone, settles (the pod's coordinator).
    pub(crate) async fn delete(&mut self) {
        let stored = self.stored();
        let focused: Vec<u64> = match self.focus {
            Some(f) => stored
                .iter()
                .copied()
                .filter(|k| self.holders.get(k).is_some_and(|h| h.contains(&f)))
                .collect(),
            None => Vec::new(),
        };
        let pick = if focused.is_empty() {
            &stored
        } else {
            &focused
        };
        if pick.is_empty() {
            return;
        }
        let k = pick[self.rng.below(pick.len() as u64) as usize];
        let Some(c) = self.door() else { return };
        let key = key_of(k);
        self.blocks.insert(k, Known::Unsure);
        if self.recent.len() == RECENT {
            self.recent.remove(0);
        }
        self.recent.push(k);
        let member = self.member(c, &key, Op::Delete);
        let answer = self.write(c, &key, true, &member).await;
        let acknowledged = matches!(answer, Ok(SimAnswer::Deleted { .. }));
        let outcome = match answer {
            Ok(a) if acknowledged => format!("acknowledged ({a:?})"),
            Ok(a) => format!("refused ({a:?})"),
            Err(coordinator::Refusal::Unsettled { pending, .. }) => {
                format!("unsettled, pending {pending:?}")
            }
            Err(r) => format!("not acknowledged: {}", refusal_name(&r)),
        };
        if acknowledged {
            self.blocks.insert(k, Known::Deleted(Instant::now()));
            self.out.deletes_acked += 1;
        } else {
            self.out.deletes_unsettled += 1;
        }
        self.note(format!("delete {k} via m{c:02}: {outcome}"));
        // Read back at once, at the member a fault strikes: where a delete acknowledged
        // without it would be served.
        let focus = self
            .focus
            .filter(|&f| f != c && self.members[f].up.is_some());
        if let Some(f) = focus.filter(|_| acknowledged) {
            self.read_at(f, k, false).await;
        }
    }

    /// A client reads a block: from one running member directly (any door of any member,
    /// in the pod's view or not: mostly one it was written to, else any), or through a
    /// member that asks the pod for it (a routed read: the pod's coordinator).
    pub(crate) async fn read(&mut self) {
        if self.next_key == 0 {
            return;
        }
        // Often a block deleted lately: where a broken promise would show.
        let k = match self.recent.len() {
            n if n > 0 && self.rng.below(2) == 0 => self.recent[self.rng.below(n as u64) as usize],
            _ => self.rng.below(self.next_key),
        };
        let Some(c) = self.running() else { return };
        let holders: Vec<usize> = self
            .holders
            .get(&k)
            .into_iter()
            .flatten()
            .copied()
            .filter(|&m| self.members[m].up.is_some())
            .collect();
        let focus = self.focus.filter(|&f| self.members[f].up.is_some());
        let m = match self.rng.below(10) {
            0..=4 if focus.is_some() => focus.unwrap_or(c),
            0..=6 if !holders.is_empty() => holders[self.rng.below(holders.len() as u64) as usize],
            _ => c,
        };
        let routed = self.rng.below(2) == 0;
        self.read_at(m, k, routed).await;
    }

    /// A client reads block `k` at member `m` (`routed`: through it, as it asks the pod),
    /// and checks the answer.
    pub(crate) async fn read_at(&mut self, m: usize, k: u64, routed: bool) {
        let asked = Instant::now();
        let got = match routed {
            true => self.read_through(m, k).await,
            false => self.read_from(m, k).await,
        };
        let what = match got {
            None => {
                self.out.reads_missed += 1;
                "miss"
            }
            Some(bytes) => {
                self.out.reads_hit += 1;
                if bytes != bytes_of(k) {
                    self.out
                        .violations
                        .push(Violation::WrongBytes { key: k, member: m });
                }
                if let Some(Known::Deleted(at)) = self.blocks.get(&k) {
                    if *at <= asked {
                        self.out
                            .violations
                            .push(Violation::Resurrected { key: k, member: m });
                    }
                }
                "hit"
            }
        };
        let how = if routed { "through" } else { "at" };
        self.note(format!("read {k} {how} m{m:02}: {what}"));
    }

    /// A client lists the namespace's keys through a running member, page by page: for the
    /// whole pod (the pod's listing, [`ctxpod_pod::listing`]) or, half of the time, that
    /// member's own (a request marked as routed); through the member a fault strikes while
    /// one is in force. No key whose delete was acknowledged
    /// before the listing began may be listed.
    pub(crate) async fn list(&mut self) {
        let Some(c) = self.running() else { return };
        // Through the member a fault strikes, where a broken promise would show.
        let c = self
            .focus
            .filter(|&f| self.members[f].up.is_some())
            .unwrap_or(c);
        let whole_pod = self.rng.below(2) == 0;
        let asked = Instant::now();
        let (listed, failed) = {
            let pod = self.pod(c);
            let view = pod.membership.view();
            let coordinator = pod.coordinator();
            let pages = reach::SimPages {
                running: &self.running,
                net: &self.net,
                from: c,
            };
            let mut listed = Vec::new();
            let mut after: Option<Vec<u8>> = None;
            let mut failed = None;
            // Bounded: every block fits in this many pages.
            for _ in 0..=self.next_key / LIST_PAGE as u64 + 1 {
                let page = coordinator
                    .list(
                        &view,
                        whole_pod,
                        &pages,
                        b"sim-block-",
                        after.as_deref(),
                        LIST_PAGE,
                    )
                    .await;
                match page {
                    Ok((keys, more)) => {
                        after = keys.last().map(|(k, _)| k.clone());
                        listed.extend(keys.into_iter().map(|(k, _)| k));
                        if !more || after.is_none() {
                            break;
                        }
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            (listed, failed)
        };
        for key in &listed {
            let Some(k) = key_number(key) else { continue };
            if let Some(Known::Deleted(at)) = self.blocks.get(&k) {
                if *at <= asked {
                    self.out
                        .violations
                        .push(Violation::ListedDeleted { key: k, member: c });
                }
            }
        }
        let how = if whole_pod { "for the pod" } else { "its own" };
        let what = match failed {
            None => {
                self.out.lists += 1;
                format!("{} keys", listed.len())
            }
            Some(e) => {
                self.out.lists_refused += 1;
                format!("refused after {} keys: {e}", listed.len())
            }
        };
        self.note(format!("list through m{c:02} ({how}): {what}"));
    }

    /// A routed read through member `c`: the block's read candidates asked as the node asks
    /// them (the pod's coordinator).
    pub(crate) async fn read_through(&self, c: usize, k: u64) -> Option<Bytes> {
        let key = key_of(k);
        let pod = self.pod(c);
        let view = pod.membership.view();
        let member = self.member(c, &key, Op::Get);
        let coordinator = pod.coordinator();
        let answer = match coordinator.route(&view, &http::Method::GET, NS, &key, R) {
            ctxpod_pod::route::Route::Read { copies } => {
                coordinator.read(&view, NS, &key, copies, &member).await
            }
            _ => member.ask(&pod.me, true).await.ok(),
        };
        match answer {
            Some(SimAnswer::Block(b)) => Some(b),
            _ => None,
        }
    }

    pub(crate) async fn read_from(&self, m: usize, k: u64) -> Option<Bytes> {
        let (engine, _) = self.members[m].up.as_ref()?;
        engine
            .get(NS, &key_of(k))
            .await
            .ok()
            .flatten()
            .map(|(b, _)| b)
    }
}
