use crate::auth::Access;
use ctxpod_wire::types::*;

use super::middleware::access_of;
use super::observe::{curve_points, merge_pod_curves};
use super::routes::routes;

/// The pod's curve: each member at its share of the pod's capacity, weighted by its
/// references; the pod's rate is the members' sum.
#[test]
fn pod_curves_merge_by_capacity_share_and_references() {
    let node = |cap: u64, refs: u64, knee: u64| MrcResponse {
        sample_rate: 0.01,
        tracked_keys: 10,
        references: refs,
        mean_block_bytes: 4096,
        capacity_blocks: cap,
        references_per_s: refs as f64 / 10.0,
        // Hit ratio 0 below `knee` blocks, 0.5 from it on.
        points: curve_points(cap, 4096, |c| if c >= knee as f64 { 0.5 } else { 0.0 }),
    };
    // Two equal members with the same curve: the pod at twice the capacity is the same
    // curve stretched by two.
    let m = merge_pod_curves(&[node(1000, 100, 500), node(1000, 100, 500)]);
    assert_eq!((m.capacity_blocks, m.references), (2000, 200));
    for p in &m.points {
        let want = if p.capacity_blocks >= 1100 {
            0.5
        } else if p.capacity_blocks < 900 {
            0.0
        } else {
            continue;
        };
        assert!((p.hit_ratio - want).abs() < 1e-9, "{p:?}");
    }
    // A member with three times the references weighs three times as much.
    let m = merge_pod_curves(&[node(1000, 300, 100), node(1000, 100, 100_000)]);
    let top = m.points.iter().find(|p| p.capacity_blocks >= 1000).unwrap();
    assert!((top.hit_ratio - 0.375).abs() < 1e-9, "{top:?}");
    assert!((m.references_per_s - 40.0).abs() < 1e-9);
}

/// The router's routes equal the OpenAPI document's operations.
#[test]
fn routes_equal_the_openapi_spec() {
    let spec: serde_json::Value =
        serde_json::from_str(ctxpod_wire::OPENAPI_JSON).expect("openapi.json parses");
    let mut from_spec: Vec<(String, String)> = Vec::new();
    for (path, item) in spec["paths"].as_object().expect("paths") {
        for m in ["get", "put", "post", "delete", "head", "patch", "options"] {
            if item.get(m).is_some() {
                from_spec.push((m.to_uppercase(), path.clone()));
            }
        }
    }
    let mut from_router: Vec<(String, String)> = routes()
        .list
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    from_spec.sort();
    from_router.sort();
    assert_eq!(from_router, from_spec);
}

/// Every route says what access it needs; only the probes are public.
#[test]
fn every_route_has_an_access_rule() {
    for (m, p) in routes().list {
        let a = access_of(&m, p).unwrap_or_else(|| panic!("{m} {p} has no access rule"));
        assert_eq!(
            a == Access::Public,
            p == "/healthz" || p == "/readyz" || p.starts_with("/ui"),
            "{m} {p}"
        );
    }
}
