//! Leases against the device (issue #18): pins and prefetch holds take at most their share
//! of the capacity (the node's, and a tenant's), so they cannot starve writes.

use super::tests::{cfg, data};
use super::*;
use ctxpod_format::config::ByteSize;

/// Pins cannot starve the device (issue #18, point 5). With the default limit, leases take
/// at most half the capacity: pins beyond answer 507 and every put is still stored. With the
/// limit raised to the whole capacity, a device full of pinned blocks refuses puts with
/// 507 without rewriting a byte (it used to move every pinned record at every commit);
/// a tenant's pins beyond its own limit answer 403 `quota`.
#[tokio::test]
async fn leases_cannot_starve_the_device() {
    let block = data(7, 1 << 20);
    let month = Duration::from_secs(3600);
    // The default: half the capacity.
    pins_take_at_most_half_the_capacity(&block, month).await;

    // The limit at the whole capacity: pin until the device is full.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = small_regions(dir.path());
    c.leased_bytes_max = Some(ByteSize(64 << 20));
    c.tenant_leased_bytes_max = Some(ByteSize(8 << 20));
    let e = Engine::open(c, Arc::new(Metrics::new()))
        .await
        .expect("open");
    let full_at = pin_until_full(&e, &block, month).await;
    assert!(full_at >= 40, "full after {full_at} blocks");
    let written = || e.core.metrics.device_written_bytes.get();
    let before = written();
    for i in 0..20u32 {
        let k = format!("q{i}").into_bytes();
        let r = e
            .put("default", &k, block.clone(), None, Durability::Fast)
            .await;
        assert!(matches!(r, Err(EngineError::NoSpace(_))), "put {i}: {r:?}");
    }
    let rewritten = written() - before;
    assert!(
        rewritten < 1 << 20,
        "20 refused puts rewrote {rewritten} bytes of pinned records"
    );
    // Every pinned block is still there.
    let keys: Vec<Vec<u8>> = (0..full_at).map(|i| format!("p{i}").into_bytes()).collect();
    for k in &keys[..keys.len() - 1] {
        assert!(
            e.contains("default", k).await.expect("contains"),
            "a pinned block was lost"
        );
    }
    // Unpinned, the blocks are evicted again and puts are stored.
    e.unpin("default", keys).await.expect("unpin");
    e.put("default", b"after", block.clone(), None, Durability::Fast)
        .await
        .expect("room once unpinned");
    // A tenant's leases: at most its own limit (8 MiB here).
    tenant_pins_stop_at_its_limit(&e, &block, month).await;
    e.shutdown().await;
}

/// A device of 64 MiB in regions of 4 MiB.
fn small_regions(dir: &std::path::Path) -> Config {
    Config {
        region_bytes: Some(ByteSize(4 << 20)),
        ..cfg(dir, 64 << 20)
    }
}

/// With the default limit, leases take at most half the capacity: pins beyond answer 507,
/// and every put is still stored.
async fn pins_take_at_most_half_the_capacity(block: &Bytes, month: Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Engine::open(small_regions(dir.path()), Arc::new(Metrics::new()))
        .await
        .expect("open");
    let (mut pinned, mut refused) = (0u64, 0u64);
    for i in 0..160u32 {
        let k = format!("p{i}").into_bytes();
        e.put("default", &k, block.clone(), None, Durability::Fast)
            .await
            .expect("every put is stored");
        match e.pin("default", vec![k], month).await {
            Ok(n) => pinned += n,
            Err(EngineError::NoSpace(_)) => refused += 1,
            Err(other) => panic!("pin: {other}"),
        }
    }
    let leased = e.core.leases.bytes();
    assert!(leased <= 32 << 20, "{leased} bytes leased");
    assert!(
        pinned >= 24 && refused > 0,
        "{pinned} pinned, {refused} refused"
    );
    e.shutdown().await;
}

/// Puts and pins `p0`, `p1`, ... until the device is full of pinned blocks (a put or a pin
/// answers 507); how many blocks that took.
async fn pin_until_full(e: &Engine, block: &Bytes, month: Duration) -> u32 {
    let mut full_at = None;
    for i in 0..200u32 {
        let k = format!("p{i}").into_bytes();
        match e
            .put("default", &k, block.clone(), None, Durability::Fast)
            .await
        {
            Ok(_) => match e.pin("default", vec![k], month).await {
                Ok(_) => {}
                // Leases take the whole capacity.
                Err(EngineError::NoSpace(_)) => {
                    full_at = Some(i + 1);
                    break;
                }
                Err(other) => panic!("pin {i}: {other}"),
            },
            Err(EngineError::NoSpace(_)) => {
                full_at = Some(i);
                break;
            }
            Err(other) => panic!("put {i}: {other}"),
        }
    }
    full_at.expect("the device filled with pinned blocks")
}

/// A tenant's pins beyond its own limit (8 MiB on `e`) answer 403 `quota`.
async fn tenant_pins_stop_at_its_limit(e: &Engine, block: &Bytes, month: Duration) {
    e.create_namespace("acme/kv", None).await.expect("ns");
    let mut tenant_pinned = 0;
    let err = loop {
        let k = format!("t{tenant_pinned}").into_bytes();
        e.put("acme/kv", &k, block.clone(), None, Durability::Fast)
            .await
            .expect("put");
        match e.pin("acme/kv", vec![k], month).await {
            Ok(_) => tenant_pinned += 1,
            Err(err) => break err,
        }
        assert!(tenant_pinned < 20, "the tenant's limit never bit");
    };
    assert!(matches!(err, EngineError::Quota(_)), "{err}");
    assert!((6..=8).contains(&tenant_pinned), "{tenant_pinned} pinned");
}
