//! Tamper: bytes flipped in the device file while the node is down. Each damaged block must
//! answer 404 (and be counted and quarantined); every other block must be untouched.

mod common;

use common::{block, flip, open_device, records, Node};
use ctxpod::record::HEADER_BYTES;
use ctxpod_api::Durability;
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
    // 8: a byte of the zero padding after the tag is outside the record's contents.
    let pad_at = at(8) + hb + len(8) as u64 + 16 + 10;
    assert!(pad_at < at(8) + ctxpod::record::record_bytes(len(8)) as u64);
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
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxpod"))
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
    node.client
        .put("default", b"k", block(1, 1000), Durability::Durable)
        .await
        .expect("put");
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
