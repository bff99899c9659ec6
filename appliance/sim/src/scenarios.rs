//! Races the seeded runs reach too rarely to count on, set up step by step on the same
//! pieces: the real coordinator, engines and pods over the simulated network.

use super::*;
use coordinator::{Said, Unreached};
use ctxpod_pod::backfill::CopyTo as _;
use ctxpod_pod::membership::MemberInfo;
use reach::SimCopies;

/// A delete asked of the members as `inner` asks them, but right after member `at` applied
/// it, a copy of the block lands on `at`: a backfill pass (or a read repair) that read the
/// block from another member just before, and sends it now.
struct CopyLandsAfter<'a> {
    inner: SimMember<'a>,
    at: usize,
    copies: SimCopies,
    block: Bytes,
    /// What `at` answered the copy.
    landed: std::sync::Mutex<Option<Vec<u16>>>,
}

#[async_trait::async_trait]
impl coordinator::Member for CopyLandsAfter<'_> {
    type Answer = SimAnswer;

    async fn ask(&self, m: &MemberInfo, mine: bool) -> Result<SimAnswer, Unreached> {
        let answer = self.inner.ask(m, mine).await;
        let first = self.landed.lock().expect("one thread").is_none();
        if first && reach::index_of(m, self.inner.running.len()) == Some(self.at) {
            let copy = [(self.inner.key, self.block.clone())];
            let statuses = self.copies.put_copies(m, None, NS, &copy).await;
            *self.landed.lock().expect("one thread") = Some(statuses.expect("the copy lands"));
        }
        answer
    }

    async fn ask_recorded(&self, m: &MemberInfo, mine: bool) -> Result<SimAnswer, Unreached> {
        self.inner.ask_recorded(m, mine).await
    }

    fn said(&self, a: &SimAnswer) -> Said {
        self.inner.said(a)
    }
}

/// A delete's first round reaches a member; a copy of the block, read elsewhere before,
/// lands there just after (before the tombstone is recorded, so nothing refuses it); the
/// member's tombstone watch stalls (it is cut from etcd, its lease still counts for a
/// moment). The delete must not be acknowledged while that member serves the copy.
#[tokio::test(start_paused = true)]
async fn a_copy_landing_between_a_deletes_first_round_and_its_record_is_not_served(
) -> anyhow::Result<()> {
    let n = 3;
    let mut run = Run::new(&Params {
        seed: 1,
        members: n,
        steps: 0,
        plant: None,
    })?;
    for m in 0..n {
        run.start(m).await?;
    }
    let k = 1;
    let key = key_of(k);
    let put = run.member(0, &key, Op::Put(bytes_of(k)));
    let stored = run.write(0, &key, false, &put).await;
    assert!(matches!(stored, Ok(SimAnswer::Stored)), "{stored:?}");
    let ranked: Vec<usize> = run
        .pod(0)
        .membership
        .view()
        .ranked(NS, &key)
        .into_iter()
        .map(|m| reach::index_of(m, n).expect("a member"))
        .collect();
    // b holds the block, d holds the other copy (and sends it to b), a takes the delete.
    let (b, d, a) = (ranked[0], ranked[1], ranked[2]);
    run.net.cut_from_meta(b);
    let delete = CopyLandsAfter {
        inner: run.member(a, &key, Op::Delete),
        at: b,
        copies: SimCopies {
            running: run.running.clone(),
            net: run.net.clone(),
            from: d,
        },
        block: bytes_of(k),
        landed: std::sync::Mutex::new(None),
    };
    let answer = run.write(a, &key, true, &delete).await;
    let landed = delete.landed.lock().expect("one thread").clone();
    assert_eq!(
        landed,
        Some(vec![201]),
        "the copy landed on m{b:02} (the race ran)"
    );
    assert!(
        matches!(answer, Ok(SimAnswer::Deleted { .. })),
        "the delete was acknowledged: {answer:?}"
    );
    let served = run.read_from(b, k).await;
    assert!(
        served.is_none(),
        "m{b:02} serves the block after its delete was acknowledged"
    );
    for m in 0..n {
        run.stop(m).await?;
    }
    Ok(())
}
