//! Tamper: bytes flipped in the device file while the node is down. Each damaged block must
//! answer 404 (and be counted and quarantined); every other block must be untouched.

use crate::common;

use common::{block, flip, open_device, put_all, put_durable, records, Node};
use ctxpod_client::client::Client;
use ctxpod_format::record::{RecordHeader, HEADER_BYTES};
use ctxpod_wire::Durability;
use std::collections::HashMap;
use std::os::unix::fs::FileExt;

#[tokio::test]
async fn flipped_bytes_answer_404_and_nothing_else_is_affected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let mut node = Node::start(&data_dir, &["--capacity", "256MiB"]).await;
    let n = 12u64;
    let key = |i: u64| format!("blk{i:02}").into_bytes();
    let len = |i: u64| 20_000 + i as usize * 15_000;
    for i in 0..n {
        node.client
            .put("default", &key(i), block(i, len(i)), Durability::Durable)
            .await
            .expect("put");
    }
    node.stop();

    let dev = open_device(&data_dir);
    let recs = records(&dev);
    assert_eq!(
        recs.len(),
        n as usize,
        "every record is found on the device"
    );
    let at = |i: u64| recs[&key(i)].0;
    let hb = HEADER_BYTES as u64;
    // 0: ciphertext; 1: key bytes in the header; 2: GCM tag; 3: the header's own CRC;
    // 4: nonce; 5: a consistent header (CRC recomputed) claiming another length;
    // 6: another block's record copied over it (replay under another key).
    flip(&dev, at(0) + hb + 1234);
    flip(&dev, at(1) + 64);
    flip(&dev, at(2) + hb + len(2) as u64 + 3);
    flip(&dev, at(3) + 253);
    flip(&dev, at(4) + 33);
    {
        let mut hdr = recs[&key(5)].1.clone();
        hdr.len -= 1;
        let mut buf = vec![0u8; HEADER_BYTES];
        hdr.encode(&mut buf);
        dev.write_all_at(&buf, at(5)).expect("write");
    }
    {
        let mut other = vec![0u8; 4096 * 4];
        dev.read_exact_at(&mut other, at(7)).expect("read");
        dev.write_all_at(&other, at(6)).expect("write");
    }
    // 8: a byte of the zero padding after the body (segmented: over 64 KiB, its tags are in
    // the segment table) is outside the record's contents.
    let tag = if ctxpod_format::record::is_segmented(len(8)) {
        0
    } else {
        16
    };
    let body_at = ctxpod_format::record::body_offset(len(8)) as u64;
    let pad_at = at(8) + body_at + len(8) as u64 + tag + 10;
    assert!(pad_at < at(8) + ctxpod_format::record::record_bytes(len(8)) as u64);
    flip(&dev, pad_at);
    dev.sync_all().expect("sync");
    drop(dev);
    let tampered = 7u64;

    node.restart().await;
    let c = node.client.clone();
    for i in 0..n {
        let got = c.get("default", &key(i)).await.expect("get answers");
        if i < tampered {
            assert_eq!(got, None, "tampered block {i} must be a miss");
        } else {
            assert_eq!(got, Some(block(i, len(i))), "untouched block {i}");
        }
    }
    let s = c.stats().await.expect("stats");
    assert_eq!(s.integrity_errors, tampered);
    let m = c.metrics().await.expect("metrics");
    assert!(
        m.contains(&format!("ctxpod_integrity_errors_total {tampered}")),
        "{m}"
    );
    // Quarantined: a second read is a plain miss, not a second integrity error; the key can
    // be stored again.
    for i in 0..tampered {
        assert_eq!(c.get("default", &key(i)).await.expect("get"), None);
    }
    assert_eq!(c.stats().await.expect("stats").integrity_errors, tampered);
    c.put("default", &key(0), block(0, len(0)), Durability::Durable)
        .await
        .expect("re-put");
    assert_eq!(
        c.get("default", &key(0)).await.expect("get"),
        Some(block(0, len(0)))
    );
    // And after another restart nothing changed.
    node.restart().await;
    for i in 1..n {
        let got = node.client.get("default", &key(i)).await.expect("get");
        assert_eq!(
            got.is_some(),
            i >= tampered,
            "block {i} after the second restart"
        );
    }
    assert_eq!(
        node.client.stats().await.expect("stats").integrity_errors,
        0,
        "counter is per run"
    );
}

/// Runs `ctxpod serve` on `data_dir` expecting it to refuse to start; returns its stderr.
fn refused_start(data_dir: &std::path::Path, capacity: &str) -> String {
    refused_start_with(data_dir, capacity, &[])
}

/// [`refused_start`] with environment variables set.
fn refused_start_with(data_dir: &std::path::Path, capacity: &str, envs: &[(&str, &str)]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxpod"))
        .envs(envs.iter().copied())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            capacity,
            "--data-dir",
        ])
        .arg(data_dir)
        .output()
        .expect("run ctxpod");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "ctxpod started; stderr:\n{err}");
    err
}

/// A device file swapped for another is refused at start, not served.
#[tokio::test]
async fn a_replaced_device_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let mut node = Node::start(&data_dir, &["--capacity", "128MiB"]).await;
    put_durable(&node.client, "default", b"k", block(1, 1000)).await;
    node.stop();
    std::fs::remove_file(data_dir.join("blocks.dev")).expect("remove");
    let err = refused_start(&data_dir, "128MiB");
    assert!(err.contains("superblock"), "{err}");
    assert!(
        !data_dir.join("blocks.dev").exists(),
        "a missing device is not recreated"
    );
    // Another (blank) device file in its place.
    std::fs::write(data_dir.join("blocks.dev"), vec![0u8; 128 << 20]).expect("write");
    let err = refused_start(&data_dir, "128MiB");
    assert!(
        err.contains("does not carry this node's superblock"),
        "{err}"
    );
    // And a changed capacity is refused with a clear message.
    let err = refused_start(&data_dir, "256MiB");
    assert!(err.contains("resizing is not supported"), "{err}");
}

/// Every record of the device, in device order (all generations of a key).
fn all_records(dev: &std::fs::File) -> Vec<(u64, RecordHeader)> {
    let len = dev.metadata().expect("metadata").len();
    let mut out = Vec::new();
    let mut buf = vec![0u8; HEADER_BYTES];
    let mut pos = common::DATA_OFFSET;
    while pos + HEADER_BYTES as u64 <= len {
        dev.read_exact_at(&mut buf, pos).expect("read");
        if let Ok(h) = RecordHeader::decode(&buf) {
            out.push((pos, h));
        }
        pos += 4096;
    }
    out
}

/// `CTXPOD_TAMPER_CASES` (default 10 000) blocks, each damaged on the device in one of
/// thirteen ways: a flipped byte of ciphertext, tag, nonce or header; a consistent header (its
/// CRC recomputed) claiming another data-key generation, length or namespace; another
/// record copied whole over it; another record's ciphertext and tag under its header, from
/// the same namespace, another namespace of the tenant, and another tenant; its own older
/// generation replayed (whole, or under the current header); a plaintext forgery (the header
/// flagged plaintext, its CRC recomputed, and the block's own expected bytes written as the
/// body, so only the mode check stands between it and a read). Every one answers a miss and
/// counts as an integrity error: 0 plaintext bytes are released. Donor blocks stay readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_tamper_cases_release_no_plaintext() {
    let cases: usize = common::env_or("CTXPOD_TAMPER_CASES", 10_000);
    let seed = common::seed_from_env("CTXPOD_TEST_SEED", 5);
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let creds = [
        ("root", "admin", None),
        ("a", "tenant-rw", Some("a")),
        ("b", "tenant-rw", Some("b")),
    ];
    let (mut node, tokens) = common::node_with_tokens(
        &data_dir,
        &["--capacity", "512MiB", "--dram", "16MiB"],
        &creds,
        "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"b\"\n",
    )
    .await;
    let a = common::client_with(&node, &tokens["a"]);
    let b = common::client_with(&node, &tokens["b"]);
    a.create_namespace("data", None).await.expect("ns");
    a.create_namespace("other", None).await.expect("ns");
    b.create_namespace("data", None).await.expect("ns");
    let all: Vec<Vec<u8>> = (0..cases).map(victim).collect();
    store_victims(&a, &all).await;
    let donors = store_donors(&a, &b).await;
    node.stop();

    let dev = open_device(&data_dir);
    let mut tamper = Tamperer::new(&dev, seed);
    for (i, k) in all.iter().enumerate() {
        tamper.damage(i % KINDS, k);
    }
    let per_kind = tamper.per_kind;
    dev.sync_all().expect("sync");
    drop(dev);

    node.restart().await;
    let a = common::client_with(&node, &tokens["a"]);
    let b = common::client_with(&node, &tokens["b"]);
    let mut released = 0usize;
    for chunk in all.chunks(1000) {
        for (k, got) in a.batch_get("data", chunk).await.expect("batch get") {
            if let Some(d) = got {
                released += d.len();
                eprintln!("tampered block {} was served", String::from_utf8_lossy(&k));
            }
        }
    }
    assert_eq!(
        released, 0,
        "plaintext bytes released from tampered records"
    );
    let s = node.client.stats().await.expect("stats");
    assert_eq!(
        s.integrity_errors, cases as u64,
        "every case is an integrity error"
    );
    for (ns, of_b, k) in &donors {
        let c = if *of_b { &b } else { &a };
        assert_eq!(
            c.get(ns, k).await.expect("get"),
            Some(victim_content(k, 0)),
            "donor intact"
        );
    }
    eprintln!("{cases} tamper cases rejected, by kind: {per_kind:?}");
}

/// The length of every block of [`ten_thousand_tamper_cases_release_no_plaintext`].
const TAMPER_LEN: usize = 1000;
/// The ways a record is damaged there (see [`Tamperer::damage`]).
const KINDS: usize = 13;

/// The key of tamper victim `i`.
fn victim(i: usize) -> Vec<u8> {
    format!("v{i:06}").into_bytes()
}

/// The contents of block `k` in its `generation` (the first byte differs between
/// generations, so that a replayed older one is told apart).
fn victim_content(k: &[u8], generation: u8) -> bytes::Bytes {
    let mut d = common::content(k, TAMPER_LEN).to_vec();
    d[0] ^= generation;
    bytes::Bytes::from(d)
}

/// Stores `blocks` in namespace `data` through `a`, in one batch; entries answered 503
/// (the write queue was full) are sent again.
async fn store_retrying(a: &Client, blocks: Vec<(Vec<u8>, bytes::Bytes)>) {
    let mut left = blocks;
    for _ in 0..1000 {
        if left.is_empty() {
            return;
        }
        let st = a
            .batch_put("data", &left, Durability::Fast)
            .await
            .expect("batch put");
        assert!(st.iter().all(|&s| s == 201 || s == 503), "{st:?}");
        left = common::answered_busy(left, st);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("the node stayed busy");
}

/// Stores every victim (generation 1) in batches of up to 1000, then gives the kind-11
/// victims an older generation on the device: deleted and stored again (generation 2).
async fn store_victims(a: &Client, all: &[Vec<u8>]) {
    for chunk in all.chunks(1000) {
        store_retrying(
            a,
            chunk
                .iter()
                .map(|k| (k.clone(), victim_content(k, 1)))
                .collect(),
        )
        .await;
    }
    // Older generations: the kind-11 victims are deleted and stored again.
    let regen: Vec<Vec<u8>> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| i % KINDS == 11)
        .map(|(_, k)| k.clone())
        .collect();
    for k in &regen {
        assert!(a.delete("data", k).await.expect("delete"));
    }
    for chunk in regen.chunks(1000) {
        store_retrying(
            a,
            chunk
                .iter()
                .map(|k| (k.clone(), victim_content(k, 2)))
                .collect(),
        )
        .await;
    }
}

/// Stores the donor blocks whose records are copied over victims: 32 each in tenant a's
/// `data` (`da…`) and `other` (`oa…`), and tenant b's `data` (`ob…`). Each as
/// (namespace, of tenant b, key).
async fn store_donors(a: &Client, b: &Client) -> Vec<(&'static str, bool, Vec<u8>)> {
    let donors: Vec<(&str, bool, Vec<u8>)> = (0..32)
        .flat_map(|j| {
            [
                ("data", false, format!("da{j:03}").into_bytes()),
                ("other", false, format!("oa{j:03}").into_bytes()),
                ("data", true, format!("ob{j:03}").into_bytes()),
            ]
        })
        .collect();
    for (ns, of_b, k) in &donors {
        let c = if *of_b { b } else { a };
        c.put(ns, k, victim_content(k, 0), Durability::Durable)
            .await
            .expect("donor");
    }
    donors
}

/// Per key: (offset, header) of its current (newest) and its oldest record on the device.
type RecordsByKey = HashMap<Vec<u8>, (u64, RecordHeader)>;

/// Damages records on a stopped node's device, one tamper case at a time.
struct Tamperer<'a> {
    dev: &'a std::fs::File,
    newest: RecordsByKey,
    oldest: RecordsByKey,
    /// The id of tenant a's other namespace, for headers claiming it.
    other_ns_id: u32,
    rng: rand::rngs::StdRng,
    /// How many cases of each kind were made.
    per_kind: [usize; KINDS],
}

impl<'a> Tamperer<'a> {
    fn new(dev: &'a std::fs::File, seed: u64) -> Self {
        use rand::SeedableRng;
        let mut newest = RecordsByKey::default();
        let mut oldest = RecordsByKey::default();
        for (at, h) in all_records(dev) {
            let n = newest.entry(h.key.clone()).or_insert((at, h.clone()));
            if h.seq > n.1.seq {
                *n = (at, h.clone());
            }
            let o = oldest.entry(h.key.clone()).or_insert((at, h.clone()));
            if h.seq < o.1.seq {
                *o = (at, h);
            }
        }
        let other_ns_id = newest[&b"oa000".to_vec()].1.ns_id;
        Tamperer {
            dev,
            newest,
            oldest,
            other_ns_id,
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            per_kind: [0; KINDS],
        }
    }

    fn read(&self, at: u64, n: u64) -> Vec<u8> {
        let mut v = vec![0u8; n as usize];
        self.dev.read_exact_at(&mut v, at).expect("read");
        v
    }

    fn write_header(&self, at: u64, h: &RecordHeader) {
        let mut buf = vec![0u8; HEADER_BYTES];
        h.encode(&mut buf);
        self.dev.write_all_at(&buf, at).expect("write");
    }

    /// The offset of a random donor's record among those whose key starts with `prefix`.
    fn donor(&mut self, prefix: &str) -> u64 {
        use rand::Rng;
        self.newest[&format!("{prefix}{:03}", self.rng.gen_range(0..32)).into_bytes()].0
    }

    /// Damages the current record of victim `k` in the way `kind` (0..[`KINDS`]) says.
    fn damage(&mut self, kind: usize, k: &[u8]) {
        use rand::Rng;
        let dev = self.dev;
        let (at, h) = self.newest[k].clone();
        let hb = HEADER_BYTES as u64;
        let sealed = (TAMPER_LEN + ctxpod_format::record::TAG_BYTES) as u64;
        let len = TAMPER_LEN as u64;
        match kind {
            0 => flip(dev, at + hb + self.rng.gen_range(0..len)),
            1 => flip(dev, at + hb + len + self.rng.gen_range(0..16)),
            2 => flip(dev, at + 32 + self.rng.gen_range(0..12)),
            3 => flip(dev, at + self.rng.gen_range(0..hb)),
            4 => self.write_header(
                at,
                &RecordHeader {
                    key_id: h.key_id + 1,
                    ..h.clone()
                },
            ),
            5 => {
                let len = h.len - 1 - self.rng.gen_range(0..16);
                self.write_header(at, &RecordHeader { len, ..h.clone() })
            }
            6 => self.write_header(
                at,
                &RecordHeader {
                    ns_id: self.other_ns_id,
                    ..h.clone()
                },
            ),
            7 => {
                let from = self.donor("da");
                dev.write_all_at(&self.read(from, 4096), at).expect("copy")
            }
            8..=10 => {
                let prefix = ["da", "oa", "ob"][kind - 8];
                let from = self.donor(prefix);
                dev.write_all_at(&self.read(from + hb, sealed), at + hb)
                    .expect("copy");
            }
            12 => {
                self.write_header(
                    at,
                    &RecordHeader {
                        plaintext: true,
                        ..h.clone()
                    },
                );
                let mut body = victim_content(k, 1).to_vec();
                body.extend_from_slice(&[0u8; ctxpod_format::record::TAG_BYTES]);
                dev.write_all_at(&body, at + hb).expect("forge");
            }
            _ => {
                let (old_at, old) = self.oldest[k].clone();
                assert!(
                    old.seq < h.seq,
                    "an older generation of {k:?} is on the device"
                );
                if self.rng.gen() {
                    dev.write_all_at(&self.read(old_at, 4096), at)
                        .expect("replay");
                } else {
                    dev.write_all_at(&self.read(old_at + hb, sealed), at + hb)
                        .expect("replay");
                }
            }
        }
        self.per_kind[kind] += 1;
    }
}

/// A node formatted with `encrypt_at_rest = false` stores bodies as received (the device
/// holds them verbatim), reads them back across a crash (the open region's tail re-indexed
/// from plaintext records), still quarantines a damaged body, and refuses to start
/// configured the other way; an encrypting node refuses to start in plaintext mode too.
#[tokio::test]
async fn a_plaintext_node_stores_bodies_as_received_and_keeps_its_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("plain");
    let off = [("CTXPOD_ENCRYPT_AT_REST", "false")];
    let mut node = Node::start_with(&data_dir, &["--capacity", "128MiB"], &off).await;
    assert!(
        node.log().contains("encryption at rest is OFF"),
        "{}",
        node.log()
    );
    let key = |i: u64| format!("p{i}").into_bytes();
    let len = |i: u64| 5_000 + i as usize * 7_000;
    // Fast puts: after the kill below, only the tail scan finds them.
    let blocks = (0..6).map(|i| (key(i), block(i, len(i))));
    put_all(&node.client, "default", blocks, Durability::Fast).await;
    put_durable(&node.client, "default", b"sync", block(99, 100)).await;
    node.restart().await;
    for i in 0..6 {
        assert_eq!(
            node.client.get("default", &key(i)).await.expect("get"),
            Some(block(i, len(i))),
            "block {i} after a kill -9"
        );
    }
    node.stop();

    let dev = open_device(&data_dir);
    let recs = records(&dev);
    let hb = HEADER_BYTES as u64;
    for i in 0..6 {
        let (at, h) = &recs[&key(i)];
        assert!(h.plaintext, "record {i} is flagged plaintext");
        let mut body = vec![0u8; len(i)];
        dev.read_exact_at(&mut body, at + hb).expect("read");
        assert_eq!(body, block(i, len(i)), "record {i} holds the body verbatim");
    }
    flip(&dev, recs[&key(0)].0 + hb + 17);
    dev.sync_all().expect("sync");
    drop(dev);
    node = Node::start_with(&data_dir, &["--capacity", "128MiB"], &off).await;
    assert_eq!(
        node.client.get("default", &key(0)).await.expect("get"),
        None,
        "a damaged plaintext body is a miss"
    );
    assert_eq!(
        node.client.stats().await.expect("stats").integrity_errors,
        1
    );
    assert_eq!(
        node.client.get("default", &key(1)).await.expect("get"),
        Some(block(1, len(1)))
    );
    node.stop();
    drop(node);

    let err = refused_start(&data_dir, "128MiB");
    assert!(err.contains("fixed at format time"), "{err}");

    // And the other way round: an encrypting node's records are never flagged plaintext,
    // and it refuses to be restarted in plaintext mode.
    let sealed_dir = dir.path().join("sealed");
    let mut node = Node::start(&sealed_dir, &["--capacity", "128MiB"]).await;
    put_durable(&node.client, "default", b"s", block(5, 9_000)).await;
    node.stop();
    let dev = open_device(&sealed_dir);
    let (at, h) = records(&dev)[&b"s".to_vec()].clone();
    assert!(!h.plaintext);
    let mut body = vec![0u8; 9_000];
    dev.read_exact_at(&mut body, at + hb).expect("read");
    assert_ne!(body, block(5, 9_000), "an encrypting node's body is sealed");
    drop(dev);
    let err = refused_start_with(&sealed_dir, "128MiB", &off);
    assert!(err.contains("fixed at format time"), "{err}");
}

/// A block found corrupt (quarantined) and stored again — by a client's read repair, or by
/// scrub from a good copy — survives `kill -9`: the new copy is acknowledged durable and
/// must read back after recovery, byte-exact, however many quarantines came before it.
#[tokio::test]
async fn a_block_stored_again_after_its_copy_went_bad_survives_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let mut node = Node::start(&data_dir, &["--capacity", "256MiB"]).await;
    let key = |i: u64| format!("blk{i:02}").into_bytes();
    let len = |i: u64| 20_000 + i as usize * 1_500;
    for i in 0..12 {
        put_durable(&node.client, "default", &key(i), block(i, len(i))).await;
    }
    let bad = [2u64, 5, 9];
    {
        let dev = open_device(&data_dir);
        let recs = records(&dev);
        for &i in &bad {
            flip(&dev, recs[&key(i)].0 + HEADER_BYTES as u64 + 100);
        }
        dev.sync_all().expect("sync");
    }
    // Running, not restarted: the node's own reads find the flips (O_DIRECT, no DRAM copy
    // after a restart, so restart to drop the DRAM tier's copies first).
    node.kill9();
    node.restart().await;
    let c = node.client.clone();
    for &i in &bad {
        assert_eq!(
            c.get("default", &key(i)).await.expect("get"),
            None,
            "{i} quarantined"
        );
        put_durable(&c, "default", &key(i), block(i + 100, len(i))).await;
    }
    node.kill9();
    node.restart().await;
    let c = node.client.clone();
    for i in 0..12 {
        let want = if bad.contains(&i) {
            block(i + 100, len(i))
        } else {
            block(i, len(i))
        };
        assert_eq!(
            c.get("default", &key(i)).await.expect("get"),
            Some(want),
            "block {i} after kill -9"
        );
    }
}

/// Scrub on a node alone: a record flipped on the drive while the node runs (its DRAM
/// copy is gone after a restart) is found by the next pass without any client reading it:
/// quarantined, counted bad and lost (no other member holds a copy), announced to the
/// namespace's KV-event subscribers as evicted, and answered as a miss; every other block
/// reads back as stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_finds_a_flipped_record_no_client_read() {
    use ctxpod_wire::proto::EventKind;
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("n");
    let mut node = Node::scrubbing(&data_dir, "64MiB").await;
    let key = |i: u64| format!("blk{i:02}").into_bytes();
    for i in 0..10 {
        put_durable(&node.client, "default", &key(i), block(i, 30_000)).await;
    }
    node.kill9();
    node.restart().await;
    let wire = node.wire().await;
    let mut sub = wire.subscribe("default").await.expect("subscribe");
    {
        let dev = open_device(&data_dir);
        let recs = records(&dev);
        flip(&dev, recs[&key(4)].0 + HEADER_BYTES as u64 + 7);
        dev.sync_all().expect("sync");
    }
    let evicted = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        loop {
            let b = sub.next().await.expect("the subscription is live");
            if let Some((_, k)) = b.events.iter().find(|(k, _)| *k == EventKind::Evicted) {
                return k.clone();
            }
        }
    })
    .await
    .expect("an evicted event within 60 s");
    assert_eq!(&evicted[..], &key(4)[..]);
    // The event goes out as the quarantine is indexed; scrub counts the record after.
    let c = node.client.clone();
    common::eventually(
        std::time::Duration::from_secs(10),
        "scrub counts it",
        async || {
            let m = c.metrics().await.expect("metrics");
            m.contains("ctxpod_scrub_lost_total 1")
        },
    )
    .await;
    let m = node.client.metrics().await.expect("metrics");
    let bg = node.client.stats().await.expect("stats").background;
    assert_eq!(
        (bg.scrub_bad_records, bg.scrub_lost, bg.scrub_repaired),
        (1, 1, 0),
        "{bg:?}"
    );
    assert!(bg.scrub_pass_total_records >= 9, "{bg:?}");
    for line in [
        "ctxpod_scrub_records_total{outcome=\"bad\"} 1",
        "ctxpod_scrub_lost_total 1",
        "ctxpod_scrub_repaired_total 0",
        "ctxpod_integrity_errors_total 1",
    ] {
        assert!(m.contains(line), "{line} in\n{m}");
    }
    for i in 0..10 {
        let got = node.client.get("default", &key(i)).await.expect("get");
        if i == 4 {
            assert_eq!(got, None, "the bad block is a miss");
        } else {
            assert_eq!(got, Some(block(i, 30_000)), "block {i}");
        }
    }
}
