//! Draining a node before it leaves: its member record says `draining`, so every node
//! ranks it last for every block (placement weight 0: no new block lands on it while others
//! can take it), and its backfill copies each block it holds to the block's first R members,
//! which no longer include it. Passes run back to back until one finds every block already
//! held by its first R members: the node is then `drained`, and stopping it loses nothing.
//!
//! `POST /v1/admin/drain` starts it, `GET` tells how far it is, `DELETE` takes it back
//! (`up` again). It needs etcd membership (the state travels in the member record) and the
//! backfill (`pod.backfill_interval_s` > 0, and the peer token when authentication is on).

use super::membership::{MemberState, RegistrationHandle};
use super::PassReport;
use ctxpod_wire::types::{DrainStatus, RepairStatus};
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::Notify;

#[derive(Default)]
struct State {
    draining: bool,
    /// Passes finished with this node `draining` in their view.
    passes: u64,
    /// The last of them.
    last: Option<PassReport>,
    drained: bool,
}

/// Every backfill pass of this node, drain or not (`ctxpod repair`).
#[derive(Default)]
struct Passes {
    /// Passes ended (failed ones too).
    done: u64,
    running: bool,
    /// The last pass that ended: its report (`None`: it failed).
    last: Option<PassReport>,
    /// Why the backfill does not run here, when it does not.
    off: Option<String>,
}

/// This node's drain: set by the API, advanced by the backfill. And its backfill passes,
/// which `ctxpod repair` asks for and follows.
pub struct Drain {
    registration: Option<RegistrationHandle>,
    /// Why a drain cannot run here, when it cannot.
    off: Mutex<Option<String>>,
    /// Asks the backfill for a pass now.
    pub kick: Arc<Notify>,
    state: Mutex<State>,
    passes: Mutex<Passes>,
}

/// Why this node cannot drain (it is alone, or its backfill is off).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CannotDrain(pub String);

impl Drain {
    pub fn new(registration: Option<RegistrationHandle>) -> Drain {
        let off = registration
            .is_none()
            .then(|| "draining needs etcd membership (pod.etcd_endpoints)".to_string());
        Drain {
            registration,
            off: Mutex::new(off),
            kick: Arc::new(Notify::new()),
            state: Mutex::new(State::default()),
            passes: Mutex::new(Passes::default()),
        }
    }

    /// A backfill pass begins.
    pub fn pass_started(&self) {
        self.passes.lock().running = true;
    }

    /// A backfill pass ended (`None`: it failed).
    pub fn pass_ended(&self, r: Option<&PassReport>) {
        let mut p = self.passes.lock();
        p.running = false;
        p.done += 1;
        p.last = r.cloned();
    }

    /// `POST /v1/admin/repair`: asks the backfill for a pass now; the status says which
    /// pass begins after this call (`wait_for_pass`). Refused when the backfill is off.
    pub fn ask_repair(&self) -> Result<RepairStatus, CannotDrain> {
        if let Some(why) = self.passes.lock().off.clone() {
            return Err(CannotDrain(format!(
                "repair needs the backfill, which is off: {why}"
            )));
        }
        self.kick.notify_one();
        Ok(self.repair_status(true))
    }

    /// Where this node's backfill passes stand; `asked`: the pass to wait for is the first
    /// one to begin from now (the one after the running one, if any).
    pub fn repair_status(&self, asked: bool) -> RepairStatus {
        let p = self.passes.lock();
        let last = p.last.clone();
        RepairStatus {
            passes_done: p.done,
            running: p.running,
            wait_for_pass: if asked {
                p.done + if p.running { 2 } else { 1 }
            } else {
                0
            },
            last_ok: last.is_some(),
            last_copied_blocks: last.as_ref().map_or(0, |l| l.copied_blocks),
            last_failed: last.as_ref().map_or(0, |l| l.failed),
            last_restarted: last.as_ref().is_some_and(|l| l.restarted),
            unavailable: p.off.clone(),
        }
    }

    /// The backfill does not run on this node: a drain could not move anything.
    pub fn backfill_off(&self, why: &str) {
        self.passes
            .lock()
            .off
            .get_or_insert_with(|| why.to_string());
        let mut off = self.off.lock();
        if off.is_none() {
            *off = Some(format!("draining needs the backfill, which is off: {why}"));
        }
    }

    /// Starts draining (again: idempotent), or why it cannot.
    pub fn start(&self) -> Result<DrainStatus, CannotDrain> {
        if let Some(why) = self.off.lock().clone() {
            return Err(CannotDrain(why));
        }
        let reg = self.registration.as_ref().expect("checked by `off`");
        {
            let mut s = self.state.lock();
            if !s.draining {
                *s = State {
                    draining: true,
                    ..State::default()
                };
                tracing::info!("drain: this node is draining");
            }
        }
        reg.set_state(MemberState::Draining);
        self.kick.notify_one();
        Ok(self.status())
    }

    /// Takes the drain back: the node is `up` again and ranks as before.
    pub fn cancel(&self) -> DrainStatus {
        if let Some(reg) = &self.registration {
            reg.set_state(MemberState::Up);
        }
        let mut s = self.state.lock();
        if s.draining {
            tracing::info!("drain: cancelled, this node is up again");
        }
        *s = State::default();
        drop(s);
        self.status()
    }

    pub fn draining(&self) -> bool {
        self.state.lock().draining
    }

    /// A backfill pass ended whose view had this node draining. Returns whether another
    /// pass should follow at once (not drained yet).
    pub fn pass_done(&self, r: &PassReport) -> bool {
        let mut s = self.state.lock();
        if !s.draining {
            return false;
        }
        s.passes += 1;
        s.last = Some(r.clone());
        if !r.restarted && r.copied_blocks == 0 && r.failed == 0 {
            if !s.drained {
                tracing::info!(
                    passes = s.passes,
                    "drain: every block is held by its first members: the node may stop"
                );
            }
            s.drained = true;
        } else {
            s.drained = false;
        }
        !s.drained
    }

    pub fn status(&self) -> DrainStatus {
        let s = self.state.lock();
        let last = s.last.clone().unwrap_or_default();
        DrainStatus {
            state: match (s.draining, s.drained) {
                (false, _) => "up",
                (true, false) => "draining",
                (true, true) => "drained",
            }
            .into(),
            passes: s.passes,
            last_scanned: last.scanned,
            last_copied_blocks: last.copied_blocks,
            last_failed: last.failed,
            unavailable: self.off.lock().clone(),
        }
    }
}
