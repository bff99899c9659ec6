//! Large values in a pod of three over etcd (issue #34): placement per value, through every
//! door that carries them (the HTTP pod client, the CXP1 pod client, a node forwarding
//! plain requests, the S3 door): each value of an engine's size (10 MiB + 1 B, 32 MiB +
//! 28 B) lands whole on exactly its R = 2 ranked members, reads back through every door,
//! and with its first member killed (`kill -9`, still named by the view) reads still hit
//! and new puts still store two copies (the next member in rank takes the place: for a
//! forwarded put, streamed from a member that stored it). The batch door carries blocks of
//! one record only: a value over 8 MiB is refused there (413), nothing stored. A member
//! frozen (SIGSTOP) costs each door one deadline, not a hang, and no lost copy.

use super::doors::{http, key_for, open_doors, Door, DoorPod};
use super::{create_replicated, within};
use crate::common::etcd::EtcdServer;
use crate::common::{block, counter};
use bytes::Bytes;
use ctxpod_client::pod_client::PodClient;

const NS: &str = "values";
const MIB: usize = 1 << 20;

/// Which of `nodes` (by id, in `urls`) hold `key` themselves (a HEAD each serves locally).
async fn holders(urls: &[(String, String)], key: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    for (id, url) in urls {
        let r = http()
            .head(format!(
                "{url}/v1/namespaces/{NS}/blocks/{}",
                hex::encode(key)
            ))
            .header(ctxpod_wire::HEADER_ROUTED, "test")
            .send()
            .await
            .expect("a HEAD");
        if r.status() == 200 {
            out.push(id.clone());
        }
    }
    out
}

/// A multipart upload of `parts` as `key` through the S3 door: "stored", or why not.
async fn s3_multipart(s3: &aws_sdk_s3::Client, key: &str, parts: &[Bytes]) -> String {
    use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
    let up = s3
        .create_multipart_upload()
        .bucket(NS)
        .key(key)
        .send()
        .await;
    let id = match up {
        Ok(u) => u.upload_id.expect("an upload id"),
        Err(e) => return format!("create failed: {e:?}"),
    };
    let mut done = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let n = i as i32 + 1;
        let part = s3
            .upload_part()
            .bucket(NS)
            .key(key)
            .upload_id(&id)
            .part_number(n);
        match part.body(p.clone().into()).send().await {
            Ok(o) => done.push(
                CompletedPart::builder()
                    .part_number(n)
                    .set_e_tag(o.e_tag)
                    .build(),
            ),
            Err(e) => return format!("part {n} failed: {e:?}"),
        }
    }
    let all = CompletedMultipartUpload::builder()
        .set_parts(Some(done))
        .build();
    let complete = s3
        .complete_multipart_upload()
        .bucket(NS)
        .key(key)
        .upload_id(&id);
    match complete.multipart_upload(all).send().await {
        Ok(_) => "stored".into(),
        Err(e) => format!("complete failed: {e:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_are_placed_whole_on_their_members_through_every_door() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let DoorPod {
        mut nodes,
        urls,
        seeds,
        pc,
    } = DoorPod::start(tmp.path(), &etcd, "values", "768MiB").await;
    create_replicated(&nodes[0], NS, 2).await;
    let doors = open_doors(&seeds, &nodes[0]).await;
    let sizes = [10 * MIB + 1, 32 * MIB + 28];

    // Every door puts a value of each size under a key whose first member is c.
    let mut stored = Vec::new();
    for (d, door) in doors.iter().enumerate() {
        for (s, &size) in sizes.iter().enumerate() {
            let key = key_for(&pc, NS, door.name(), s, Some("c"));
            let data = block((d * 10 + s) as u64, size);
            let got = door.put(NS, &key, data.clone()).await;
            if matches!(door, Door::Batch(_)) {
                assert_eq!(got, "refused 413", "batch door, {size} B");
                assert!(holders(&urls, &key).await.is_empty());
                continue;
            }
            assert_eq!(got, "stored", "{}, {size} B", door.name());
            let mut want: Vec<String> = pc.ranked(NS, &key)[..2].to_vec();
            want.sort();
            assert_eq!(
                holders(&urls, &key).await,
                want,
                "{}, {size} B",
                door.name()
            );
            stored.push((key, data));
        }
    }
    let reads = async |doors: &[Door], stored: &[(Vec<u8>, Bytes)], when: &str| {
        for door in doors.iter().filter(|d| !matches!(d, Door::Batch(_))) {
            for (key, data) in stored {
                let got = door.get(NS, key, data).await;
                assert_eq!(got, "hit", "{} {when}, {} B", door.name(), data.len());
            }
        }
    };
    reads(&doors, &stored, "with every member up").await;

    // S3 multipart uploads through node a's door, of keys whose first member (where the
    // upload lives) is a itself, b and c: completed, each value is on its two members.
    let Door::S3(s3) = &doors[4] else {
        panic!("door 4 is the S3 door")
    };
    let mut uploaded = Vec::new();
    for (i, home) in ["a", "b", "c"].into_iter().enumerate() {
        let key = key_for(&pc, NS, "multipart", i, Some(home));
        let parts = [block(50 + i as u64, 5 * MIB), block(60 + i as u64, MIB + 7)];
        let key_s = std::str::from_utf8(&key).unwrap();
        let got = s3_multipart(s3, key_s, &parts).await;
        assert_eq!(got, "stored", "home {home}");
        let whole = Bytes::from([&parts[0][..], &parts[1][..]].concat());
        let mut want: Vec<String> = pc.ranked(NS, &key)[..2].to_vec();
        want.sort();
        assert_eq!(holders(&urls, &key).await, want, "multipart, home {home}");
        uploaded.push((key, whole));
    }
    reads(&doors, &uploaded, "after multipart uploads").await;
    uploads_in_progress_are_listed_from_every_home(s3, &pc).await;

    // c is killed: every value it held is read from its second member, and new values
    // whose first member is c are stored on the two others.
    nodes[2].kill9();
    reads(&doors, &stored, "with c killed").await;
    let mut after = Vec::new();
    for (d, door) in doors.iter().enumerate() {
        if matches!(door, Door::Batch(_)) {
            continue;
        }
        let key = key_for(&pc, NS, door.name(), 9, Some("c"));
        let data = block((100 + d) as u64, 10 * MIB + 1);
        let got = door.put(NS, &key, data.clone()).await;
        assert_eq!(got, "stored", "{} with c killed", door.name());
        let up = &urls[..2];
        assert_eq!(
            holders(up, &key).await,
            ["a", "b"],
            "{} with c killed",
            door.name()
        );
        after.push((key, data));
    }
    reads(&doors, &after, "put with c killed").await;
}

/// Uploads in progress live on their keys' homes (a, b, c): listed through one node's S3
/// door, every member's are there; aborted through it, they are gone from their homes.
async fn uploads_in_progress_are_listed_from_every_home(s3: &aws_sdk_s3::Client, pc: &PodClient) {
    let mut open = Vec::new();
    for (i, home) in ["a", "b", "c"].into_iter().enumerate() {
        let key = key_for(pc, NS, "open", i, Some(home));
        let key = String::from_utf8(key).unwrap();
        let up = s3.create_multipart_upload().bucket(NS).key(&key);
        open.push((key, up.send().await.unwrap().upload_id.unwrap()));
    }
    let listed = s3.list_multipart_uploads().bucket(NS).send().await.unwrap();
    let mut got: Vec<(String, String)> = listed
        .uploads()
        .iter()
        .map(|u| {
            (
                u.key().unwrap().to_string(),
                u.upload_id().unwrap().to_string(),
            )
        })
        .collect();
    got.sort();
    open.sort();
    assert_eq!(got, open, "every member's uploads, listed through node a");
    for (key, id) in &open {
        let abort = s3
            .abort_multipart_upload()
            .bucket(NS)
            .key(key)
            .upload_id(id);
        abort.send().await.unwrap();
    }
    let left = s3.list_multipart_uploads().bucket(NS).send().await.unwrap();
    assert!(
        left.uploads().is_empty(),
        "aborted through node a, gone from their homes"
    );
}

/// A member frozen (SIGSTOP: it accepts connections and takes a few MiB into its socket
/// buffers, then nothing) in the middle of the pod's life: through every door that carries
/// values, values whose first member is the frozen one read back, and new ones are stored
/// whole on the two other members (the frozen one given up on, the next in rank taking its
/// place), each call within a bound of one deadline (the clients' 10 s) and slack, never a
/// hang. Thawed, the frozen member holds of the values put meanwhile at most the copies
/// read repair writes back to it, each the value as it was put.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_member_costs_large_values_one_deadline_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let pod = DoorPod::start(tmp.path(), &etcd, "frozen", "768MiB").await;
    let (nodes, urls, pc) = (&pod.nodes, &pod.urls, &pod.pc);
    create_replicated(&nodes[0], NS, 2).await;
    let doors = open_doors(&pod.seeds, &nodes[0]).await;
    let doors: Vec<&Door> = doors
        .iter()
        .filter(|d| !matches!(d, Door::Batch(_)))
        .collect();
    let mut stored = Vec::new();
    for (d, door) in doors.iter().enumerate() {
        let key = key_for(pc, NS, door.name(), 20, Some("c"));
        let data = block(200 + d as u64, 10 * MIB + 1);
        assert_eq!(door.put(NS, &key, data.clone()).await, "stored");
        stored.push((key, data));
    }
    nodes[2].freeze();
    // One call's bound: a client's request deadline (10 s) and slack for this machine; a
    // node gives up on a member after 5 s (`PEER_DEADLINE`) and asks it last after that.
    let bound = std::time::Duration::from_secs(25);
    let mut after = Vec::new();
    for (d, door) in doors.iter().enumerate() {
        let key = key_for(pc, NS, door.name(), 21, Some("c"));
        let data = block(300 + d as u64, 32 * MIB + 28);
        let what = format!(
            "{} putting a value whose first member is frozen",
            door.name()
        );
        let (got, took) = within(bound, &what, door.put(NS, &key, data.clone())).await;
        assert_eq!(got, "stored", "{what} ({took:?})");
        eprintln!("{what}: {took:?}");
        assert_eq!(holders(&urls[..2], &key).await, ["a", "b"], "{what}");
        after.push((key, data, door.name()));
    }
    for door in &doors {
        for (key, data) in stored
            .iter()
            .map(|(k, d)| (k, d))
            .chain(after.iter().map(|(k, d, _)| (k, d)))
        {
            let what = format!("{} reading a value of a frozen member", door.name());
            let (got, took) = within(bound, &what, door.get(NS, key, data)).await;
            assert_eq!(got, "hit", "{what} ({took:?})");
        }
    }
    nodes[2].thaw();
    for (key, data, put_by) in &after {
        // A copy may land on c once it thaws: c is these values' first member, and the
        // pod writes values back to a first member that misses them (read repair, backfill).
        // One did in a CI run (2026-12-06: the value the CXP1 client put, 1 run in ~8
        // under load), most likely by backfill: c renews its 60 s etcd lease every 20 s,
        // so a freeze of 40 s or more can outlast it; c then leaves the view, rejoins when
        // thawed, and a pass 2 s later copies to it what it misses. Whatever c holds must
        // be the value as it was put.
        if !holders(&urls[2..], key).await.is_empty() {
            let r = http()
                .get(format!(
                    "{}/v1/namespaces/{NS}/blocks/{}",
                    urls[2].1,
                    hex::encode(key)
                ))
                .header(ctxpod_wire::HEADER_ROUTED, "test")
                .send()
                .await
                .expect("a GET from c");
            let got = r.bytes().await.expect("its body");
            assert!(
                got == *data,
                "c holds the value {put_by} put while it was frozen, and not as it was put"
            );
            eprintln!("c holds a copy of the value {put_by} put while it was frozen");
        }
        for door in &doors {
            assert_eq!(
                door.get(NS, key, data).await,
                "hit",
                "{} after",
                door.name()
            );
        }
    }
}

/// A put a frozen member receives late (its bytes waited in its socket buffers while the
/// client gave up on it and stored the value on the two others) must not undo a delete
/// made meanwhile: once thawed, the member serves no copy of the deleted value, through any
/// door. The CXP1 client resets its connection at the deadline, and the thawed node, which
/// finds the whole put frame in its buffers (64 KiB), refuses to apply it and counts it
/// (`ctxpod_abandoned_writes_total`). Before, the put landed on c after the delete's
/// tombstone in 1 of 3 runs, and the deleted value was back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_a_frozen_member_receives_late_never_undoes_a_delete() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let pod = DoorPod::start(tmp.path(), &etcd, "late", "512MiB").await;
    let (nodes, urls, pc) = (&pod.nodes, &pod.urls, &pod.pc);
    create_replicated(&nodes[0], NS, 2).await;
    let doors = open_doors(&pod.seeds, &nodes[0]).await;
    let writers: Vec<&Door> = doors
        .iter()
        .filter(|d| matches!(d, Door::Http(_) | Door::Cxp1(_) | Door::Forward(_)))
        .collect();
    // Each door talks to c before the freeze, so its connection is open and warm.
    for (d, door) in writers.iter().enumerate() {
        let key = key_for(pc, NS, door.name(), 40, Some("c"));
        assert_eq!(
            door.put(NS, &key, block(400 + d as u64, MIB)).await,
            "stored"
        );
    }
    nodes[2].freeze();
    let bound = std::time::Duration::from_secs(25);
    let mut put = Vec::new();
    for (d, door) in writers.iter().enumerate() {
        let key = key_for(pc, NS, door.name(), 41, Some("c"));
        let data = block(500 + d as u64, 64 << 10);
        let what = format!("{} putting while c is frozen", door.name());
        let (got, _) = within(bound, &what, door.put(NS, &key, data.clone())).await;
        assert_eq!(got, "stored", "{what}");
        assert_eq!(holders(&urls[..2], &key).await, ["a", "b"], "{what}");
        // c, frozen, is still in the pod (60 s leases) and a read candidate of the key:
        // the delete is recorded but cannot be acknowledged before c applies it or drops
        // out (docs/OPERATIONS.md, "Consistency under partitions"): 503, sent again below.
        let what = format!("{} deleting it", door.name());
        let (got, _) = within(bound, &what, doors[0].delete(NS, &key)).await;
        assert!(got == "done" || got == "refused 503", "{what}: {got}");
        put.push((key, data, door.name()));
    }
    nodes[2].thaw();
    // Sent again once c answers, each delete is acknowledged.
    for (key, _, put_by) in &put {
        let what = format!("deleting again the value {put_by} put while c was frozen");
        let deadline = std::time::Instant::now() + bound;
        loop {
            let (got, _) = within(bound, &what, doors[0].delete(NS, key)).await;
            // Acknowledged: done, or a miss (the copies it reached went the first time).
            if got == "done" || got == "miss" {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: {got}");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    // Whatever waited in c's socket buffers is read within moments of the thaw.
    let abandoned = "ctxpod_abandoned_writes_total ";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // (A metrics call in the moments of the thaw may fail: asked again.)
    while counter(
        &nodes[2].client.metrics().await.unwrap_or_default(),
        abandoned,
    ) < 1
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the CXP1 put c read after its client reset the connection was not refused"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    for (key, data, put_by) in &put {
        assert!(
            holders(urls, key).await.is_empty(),
            "the value {put_by} put while c was frozen, then deleted, is back on {:?}",
            holders(urls, key).await
        );
        for door in &doors {
            assert_eq!(
                door.get(NS, key, data).await,
                "miss",
                "{} reading the value {put_by} put and deleted while c was frozen",
                door.name()
            );
        }
    }
}
