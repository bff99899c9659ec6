//! Cold compression (issue #36): blocks of a namespace with `compression` are stored
//! compressed as `fast`'s reclaim demotes them into `dense`, read back byte for byte (while
//! readers read them, and after a restart), and compressed data that is damaged on the
//! device is refused, never answered: the AEAD tag, the stored bytes' CRC32C and the
//! block's CRC32C after decompression each catch it.

use super::*;
use ctxpod_wire::types::Compression;
use std::sync::atomic::AtomicBool;

const MIB: usize = 1 << 20;

/// A node of `fast` (4 regions of 16 MiB) and `dense` (12), on files in `dir`.
fn tiered(dir: &std::path::Path, encrypt: bool) -> Config {
    Config {
        encrypt_at_rest: encrypt,
        ..super::tier_tests::tiered_with(dir, 200 << 20)
    }
}

/// `n` bf16 values of a normal distribution (σ 0.05, a KV cache's spread), seeded.
pub(crate) fn bf16_normal(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = ctxpod_firmware_sim::rng::Rng::new(seed);
    let mut out = Vec::with_capacity(n * 2);
    while out.len() < n * 2 {
        let (u1, u2) = (rng.unit().max(1e-12), rng.unit());
        let r = (-2.0 * u1.ln()).sqrt() * 0.05;
        let a = 2.0 * std::f64::consts::PI * u2;
        for z in [r * a.cos(), r * a.sin()] {
            let bits = (z as f32).to_bits();
            out.extend_from_slice(&((bits >> 16) as u16).to_le_bytes());
        }
    }
    out.truncate(n * 2);
    out
}

/// What the test stores: per namespace, its setting and its blocks of 1 MiB.
struct Corpus {
    /// (namespace, compression, blocks).
    sets: Vec<(&'static str, Option<Compression>, Vec<Bytes>)>,
}

impl Corpus {
    /// `zstd`: bf16 KV blocks, and every fourth one random bytes (which do not compress);
    /// `lz4` and `off`: the last chunk of a prompt (its first 40 % tokens, zeros after).
    fn new(per_ns: usize) -> Corpus {
        let kv = |i: usize| Bytes::from(bf16_normal(MIB / 2, i as u64));
        let partial = |i: usize| {
            let mut b = bf16_normal(MIB / 2, 1000 + i as u64);
            b[MIB * 2 / 5..].fill(0);
            Bytes::from(b)
        };
        let random = |i: usize| Bytes::from(super::value_tests::data(i as u64, MIB));
        Corpus {
            sets: vec![
                (
                    "z",
                    Some(Compression::Zstd),
                    (0..per_ns)
                        .map(|i| if i % 4 == 3 { random(i) } else { kv(i) })
                        .collect(),
                ),
                (
                    "l",
                    Some(Compression::Lz4),
                    (0..per_ns).map(partial).collect(),
                ),
                ("off", None, (0..per_ns).map(partial).collect()),
            ],
        }
    }

    fn key(i: usize) -> Vec<u8> {
        format!("chunk/{i}").into_bytes()
    }

    /// Every block of every namespace read back: what was wrong.
    async fn check(&self, e: &Engine) -> Vec<String> {
        let mut wrong = Vec::new();
        for (ns, _, blocks) in &self.sets {
            for (i, b) in blocks.iter().enumerate() {
                match e.get(ns, &Self::key(i)).await {
                    Ok(Some((got, _))) if got == *b => {}
                    other => wrong.push(format!("{ns}/{i}: {:?}", other.map(|o| o.is_some()))),
                }
            }
        }
        wrong
    }
}

async fn create(e: &Engine, ns: &str, compression: Option<Compression>) {
    e.create_namespace_with(
        ns,
        NsSettings {
            compression,
            ..NsSettings::default()
        },
    )
    .await
    .expect("namespace");
}

/// Blocks of three namespaces (zstd, lz4, off) worth more than `fast` holds, put while two
/// readers read every block put so far: `fast`'s reclaim demotes them, the compressing
/// namespaces' compressed where that saves an eighth (random bytes are not), no read misses
/// or sees other bytes, and after a restart every block reads back byte for byte and each
/// namespace's compressed bytes are what they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_on_demotion_and_read_back_byte_for_byte() {
    const PER_NS: usize = 32;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = tiered(dir.path(), true);
    let m = Arc::new(Metrics::new());
    let e = Engine::open(cfg.clone(), m.clone()).await.expect("open");
    let corpus = Corpus::new(PER_NS);
    for (ns, c, _) in &corpus.sets {
        create(&e, ns, *c).await;
    }
    let written = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let writer = async {
        for i in 0..PER_NS {
            for (ns, _, blocks) in &corpus.sets {
                e.put(
                    ns,
                    &Corpus::key(i),
                    blocks[i].clone(),
                    None,
                    Durability::Fast,
                )
                .await
                .expect("put");
            }
            written.store(i as u64 + 1, Ordering::SeqCst);
        }
        done.store(true, Ordering::SeqCst);
    };
    let reader = |seed: usize| {
        let (e, corpus, written, done) = (&e, &corpus, &written, &done);
        async move {
            let (mut reads, mut wrong) = (0u64, Vec::new());
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            while !done.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                let n = written.load(Ordering::SeqCst) as usize;
                if n == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    continue;
                }
                reads += 1;
                let i = (reads as usize * 7 + seed) % n;
                let (ns, _, blocks) = &corpus.sets[reads as usize % 3];
                match e.get(ns, &Corpus::key(i)).await {
                    Ok(Some((b, _))) if b == blocks[i] => {}
                    other => wrong.push(format!("{ns}/{i}: {:?}", other.map(|o| o.is_some()))),
                }
            }
            (reads, wrong)
        }
    };
    let ((), (r1, w1), (r2, w2)) = tokio::join!(writer, reader(0), reader(5));
    assert!(w1.is_empty() && w2.is_empty(), "{w1:?} {w2:?}");
    assert!(r1 + r2 > 0);
    let stats = e.stats();
    assert_eq!(stats.evicted_blocks, 0, "dense has room: nothing evicted");
    let info = |e: &Engine, ns: &str| e.namespace(ns).expect("info");
    let (z, l, off) = (info(&e, "z"), info(&e, "l"), info(&e, "off"));
    let c = &m.compression;
    let (zn, ln) = (
        c.records.with_label_values(&["zstd"]).get(),
        c.records.with_label_values(&["lz4"]).get(),
    );
    // Demoted: most of each namespace (fast holds under 64 of the 96 blocks).
    assert!(zn >= 8 && ln >= 8, "compressed: zstd {zn}, lz4 {ln}");
    assert!(
        c.skipped.with_label_values(&["zstd"]).get() >= 2,
        "random blocks are not worth compressing"
    );
    assert!(z.compressed_bytes >= zn * MIB as u64 && l.compressed_bytes >= ln * MIB as u64);
    assert!(
        z.compressed_stored_bytes * 8 <= z.compressed_bytes * 7,
        "{z:?}"
    );
    assert!(l.compressed_stored_bytes * 2 <= l.compressed_bytes, "{l:?}");
    assert_eq!((off.compressed_bytes, off.compressed_stored_bytes), (0, 0));
    assert_eq!(z.compression, Some(Compression::Zstd));
    // Compressed records are in dense (or promoted back): each reads back.
    assert_eq!(corpus.check(&e).await, Vec::<String>::new());
    e.shutdown().await;
    drop(e);
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("restart");
    assert_eq!(corpus.check(&e).await, Vec::<String>::new());
    for (before, ns) in [(z, "z"), (l, "l"), (off, "off")] {
        let after = info(&e, ns);
        assert_eq!(
            (after.compressed_bytes, after.compressed_stored_bytes),
            (before.compressed_bytes, before.compressed_stored_bytes),
            "{ns} after a restart"
        );
        assert_eq!(after.compression, before.compression);
    }
    e.shutdown().await;
}

/// Which damage a test does to a compressed record's stored body.
#[derive(Clone, Copy, Debug)]
enum Damage {
    /// One bit of the stored bytes flipped.
    Body,
    /// One bit flipped and the stored CRC32C (and the header's) rewritten to match: only
    /// the block's CRC32C after decompression (or the decompressor) can tell.
    BodyAndItsCrc,
}

/// A block demoted compressed (its key and index entry) in namespace `z`.
async fn a_compressed_block(e: &Engine) -> (Vec<u8>, BlockLoc, Bytes) {
    create(e, "z", Some(Compression::Zstd)).await;
    let blocks: Vec<Bytes> = (0..80)
        .map(|i| Bytes::from(bf16_normal(MIB / 2, i)))
        .collect();
    for (i, b) in blocks.iter().enumerate() {
        e.put("z", &Corpus::key(i), b.clone(), None, Durability::Fast)
            .await
            .expect("put");
    }
    let ns = e.ns("z").expect("ns");
    for (i, b) in blocks.into_iter().enumerate() {
        let key = Corpus::key(i);
        let loc = e
            .core
            .index
            .get_block(&block_key(ns.id, &key))
            .expect("index")
            .expect("held");
        if loc.is_compressed() {
            return (key, loc, b);
        }
    }
    panic!("no block was demoted compressed");
}

/// Damages the record at `loc` on the device as `how` says.
async fn damage(e: &Engine, loc: &BlockLoc, how: Damage) {
    let at = e.core.dev_offset(loc.region, loc.offset);
    let (mut buf, r) = e
        .core
        .device
        .read_at(AlignedBuf::zeroed(loc.record_len as usize), at)
        .await;
    r.expect("read");
    let h = RecordHeader::decode(&buf).expect("a compressed record's header");
    let c = h.compressed.expect("compressed");
    buf[HEADER_BYTES + c.stored_len as usize / 2] ^= 0x10;
    if let Damage::BodyAndItsCrc = how {
        let crc = crc32c::crc32c(&buf[HEADER_BYTES..HEADER_BYTES + c.stored_len as usize]);
        RecordHeader {
            compressed: Some(record::Compressed {
                stored_crc: crc,
                ..c
            }),
            ..h
        }
        .encode(&mut buf[..HEADER_BYTES]);
    }
    let (_, r) = e.core.device.write_at(buf, at).await;
    r.expect("write");
    e.core.device.flush().await.expect("flush");
}

/// Compressed data damaged on the device is refused on an encrypting node (the AEAD tag)
/// and on a plaintext one (the stored bytes' CRC32C; with that CRC32C rewritten to match,
/// the decompressor or the block's CRC32C): the read answers a miss, the block is
/// quarantined and counted, never answered with other bytes; a block put again reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_compressed_data_is_refused() {
    for (encrypt, how) in [
        (true, Damage::Body),
        (true, Damage::BodyAndItsCrc),
        (false, Damage::Body),
        (false, Damage::BodyAndItsCrc),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = Engine::open(tiered(dir.path(), encrypt), Arc::new(Metrics::new()))
            .await
            .expect("open");
        let (key, loc, good) = a_compressed_block(&e).await;
        assert!(
            e.read_for_copy("z", &key)
                .await
                .expect("read")
                .is_some_and(|r| r.0 == good),
            "intact first"
        );
        damage(&e, &loc, how).await;
        let errors = e.stats().integrity_errors;
        let case = format!("encrypt {encrypt}, {how:?}");
        let got = e.read_for_copy("z", &key).await.expect("read");
        assert!(
            got.is_none(),
            "{case}: damaged compressed data answered ({} bytes, right: {})",
            got.as_ref().map_or(0, |g| g.0.len()),
            got.is_some_and(|g| g.0 == good)
        );
        assert_eq!(e.stats().integrity_errors, errors + 1, "{case}");
        assert!(
            !e.on_flash("z", &key).expect("index"),
            "{case}: quarantined"
        );
        assert!(e.get("z", &key).await.expect("get").is_none(), "{case}");
        e.put("z", &key, good.clone(), None, Durability::Fast)
            .await
            .expect("put again");
        assert!(
            e.get("z", &key)
                .await
                .expect("get")
                .is_some_and(|r| r.0 == good),
            "{case}: put again"
        );
        e.shutdown().await;
    }
}

/// Compression changes only later moves: turned off, compressed blocks still read back,
/// and a namespace's setting survives a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_setting_changes_later_moves_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = tiered(dir.path(), true);
    let e = Engine::open(cfg.clone(), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let (key, _, good) = a_compressed_block(&e).await;
    create(&e, "z", None).await;
    assert_eq!(e.namespace("z").expect("info").compression, None);
    assert!(e
        .get("z", &key)
        .await
        .expect("get")
        .is_some_and(|r| r.0 == good));
    create(&e, "z", Some(Compression::Lz4)).await;
    e.shutdown().await;
    drop(e);
    let e = Engine::open(cfg, Arc::new(Metrics::new()))
        .await
        .expect("restart");
    let info = e.namespace("z").expect("info");
    assert_eq!(info.compression, Some(Compression::Lz4));
    assert!(info.compressed_bytes > 0, "{info:?}");
    e.shutdown().await;
}
