use super::*;
use crate::config::ByteSize;
use rand::{Rng, SeedableRng};

fn cfg(dir: &std::path::Path, capacity: u64) -> Config {
    Config {
        data_dir: dir.to_path_buf(),
        capacity: ByteSize(capacity),
        dram: ByteSize(4 << 20),
        ..Config::default()
    }
}

fn data(seed: u8, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect::<Vec<_>>(),
    )
}

#[tokio::test]
async fn put_get_conflict_delete_and_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cfg(dir.path(), 80 << 20);
    let e = Engine::open(c.clone(), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let d = data(1, 70_000);
    assert_eq!(
        e.put("default", b"a", d.clone(), None, Durability::Durable)
            .await
            .expect("put"),
        PutStatus::Created
    );
    assert_eq!(
        e.put("default", b"a", d.clone(), None, Durability::Fast)
            .await
            .expect("re-put"),
        PutStatus::Exists
    );
    assert!(matches!(
        e.put("default", b"a", data(2, 70_000), None, Durability::Durable)
            .await,
        Err(EngineError::Conflict)
    ));
    assert!(matches!(
        e.put(
            "default",
            b"b",
            d.clone(),
            Some(crc32c::crc32c(&d) ^ 1),
            Durability::Durable
        )
        .await,
        Err(EngineError::Integrity(_))
    ));
    assert!(matches!(
        e.get("nope", b"a").await,
        Err(EngineError::NotFound(_))
    ));
    assert_eq!(
        e.get("default", b"a").await.expect("get").map(|(b, _)| b),
        Some(d.clone())
    );
    e.put("default", b"c", data(3, 10), None, Durability::Durable)
        .await
        .expect("put");
    assert!(e.delete("default", b"c").await.expect("delete"));
    assert!(!e.delete("default", b"c").await.expect("delete again"));
    let s = e.stats();
    assert_eq!((s.block_count, s.live_bytes), (1, 70_000));
    e.shutdown().await;
    drop(e);

    let e = Engine::open(c, Arc::new(Metrics::new()))
        .await
        .expect("reopen");
    assert_eq!(
        e.get("default", b"a").await.expect("get").map(|(b, _)| b),
        Some(d)
    );
    assert_eq!(e.get("default", b"c").await.expect("get"), None);
    let s = e.stats();
    assert_eq!(
        (s.block_count, s.live_bytes, s.integrity_errors),
        (1, 70_000, 0)
    );
    e.shutdown().await;
}

#[tokio::test]
async fn nonces_are_never_reused_across_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = cfg(dir.path(), 80 << 20);
    let mut seen = std::collections::HashSet::new();
    for round in 0..3u8 {
        let e = Engine::open(c.clone(), Arc::new(Metrics::new()))
            .await
            .expect("open");
        for i in 0..5u8 {
            let s = e.core.next_seq().expect("seq");
            assert!(
                seen.insert(s),
                "sequence {s} handed out twice (round {round}, {i})"
            );
        }
        e.shutdown().await;
    }
}

#[tokio::test]
async fn staged_blocks_fill_in_pieces_and_must_be_complete() {
    let d = data(9, 100_000);
    let mut st = StagedBlock::new(d.len()).expect("stage");
    for piece in d.chunks(7_777) {
        assert!(st.append(piece));
    }
    assert!(!st.append(b"x"), "nothing past the announced length");
    assert!(st.is_complete());
    assert_eq!(st.payload(), &d[..]);
    assert_eq!(st.crc, crc32c::crc32c(&d));
    assert!(matches!(StagedBlock::new(0), Err(EngineError::Invalid(_))));
    assert!(matches!(
        StagedBlock::new(ctxpod_api::BLOCK_BYTES_MAX + 1),
        Err(EngineError::TooLarge(_))
    ));

    let dir = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(cfg(dir.path(), 80 << 20), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let mut half = StagedBlock::new(d.len()).expect("stage");
    assert!(half.append(&d[..50_000]));
    assert!(matches!(
        e.put_staged("default", b"h", half, None, Durability::Durable)
            .await,
        Err(EngineError::Invalid(_))
    ));
    assert!(matches!(
        e.put_staged(
            "default",
            b"h",
            st,
            Some(crc32c::crc32c(&d) ^ 1),
            Durability::Durable
        )
        .await,
        Err(EngineError::Integrity(_))
    ));
    e.shutdown().await;
}

/// Bit rot: every single-bit flip of a stored record, and 100 000 random multi-bit
/// corruptions, are caught by the record checks (header against the index, AES-GCM tag,
/// plaintext CRC32C) — or fall in the zero padding, which is never served. Nothing is ever
/// answered with wrong bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bit_rot_is_always_detected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(cfg(dir.path(), 80 << 20), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let d = data(7, 3000);
    e.put("default", b"rot", d.clone(), None, Durability::Durable)
        .await
        .expect("put");
    let ns = e.ns("default").expect("ns");
    let bkey = block_key(ns.id, b"rot");
    let loc = e
        .core
        .index
        .get_block(&bkey)
        .expect("index")
        .expect("entry");
    let dek = ns.dek(loc.key_id).expect("dek");
    let (stored, r) = e
        .core
        .device
        .read_at(
            AlignedBuf::zeroed(loc.record_len as usize),
            e.core.dev_offset(loc.region, loc.offset),
        )
        .await;
    r.expect("read");
    let stored = stored.to_vec();
    let meaningful = record::HEADER_BYTES + d.len() + 16;
    let check = |bytes: &[u8]| -> bool {
        let mut b = AlignedBuf::zeroed(bytes.len());
        b.copy_from_slice(bytes);
        match verify_record(b, Some(&dek), ns.id, b"rot", &loc) {
            Verified::Ok(got) => {
                assert_eq!(got, d, "a corrupted record was answered with wrong bytes");
                false
            }
            Verified::Bad(_) => true,
        }
    };
    assert!(!check(&stored), "the intact record verifies");
    let mut detected = 0;
    for bit in 0..stored.len() * 8 {
        let mut b = stored.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        let caught = check(&b);
        assert!(
            caught || bit / 8 >= meaningful,
            "flip of bit {bit} (byte {}) not detected",
            bit / 8
        );
        detected += caught as usize;
    }
    assert_eq!(
        detected,
        meaningful * 8,
        "every flip within the record is caught"
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for i in 0..100_000 {
        let mut b = stored.clone();
        for _ in 0..rng.gen_range(2..=64) {
            let bit = rng.gen_range(0..meaningful * 8);
            b[bit / 8] ^= 1 << (bit % 8);
        }
        // Flips can cancel out (the same bit twice): then the record is intact again.
        if b != stored {
            assert!(check(&b), "random corruption {i} not detected");
        }
    }
}
