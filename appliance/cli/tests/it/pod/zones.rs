//! Failure domains in a real pod: four nodes over etcd in two zones (a and b in `z1`, c and
//! d in `z2`), R = 2. Every block has one copy in each zone, so losing a whole zone (both
//! its nodes killed with kill -9) loses no block: each one reads back whole through the pod
//! client and through a surviving node.

use super::{held_here, pod_config, pod_node, r2_data, r2_key, r2_write, wait_cluster};
use super::{wait_members, wait_views};
use crate::common::etcd::EtcdServer;
use crate::common::Node;
use ctxpod_client::client::Client;
use ctxpod_client::connect::Connect;
use ctxpod_client::pod_client::PodClient;
use std::time::{Duration, Instant};

const NODES: [(&str, &str); 4] = [("a", "z1"), ("b", "z1"), ("c", "z2"), ("d", "z2")];

/// Blocks written through the pod client.
const BLOCKS: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_zone_loses_no_block() {
    let tmp = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(tmp.path());
    let mut nodes = Vec::new();
    for (id, zone) in NODES {
        let extra = format!("replication = 2\nzone = \"{zone}\"\n");
        let config = pod_config("zones", &etcd, &extra)(id);
        nodes.push(pod_node(tmp.path(), id, &config).await);
    }
    wait_views(&nodes, NODES.len()).await;
    let pc = PodClient::connect(&[nodes[0].url.clone()], &Connect::default())
        .await
        .unwrap();
    wait_members(&pc, NODES.len()).await;
    assert_eq!(pc.replication(), 2);
    let acked = r2_write(&pc, 0, BLOCKS).await;
    assert_eq!(acked, BLOCKS, "every put acknowledged");

    // Every block: one copy in each zone, on the two members it ranks first.
    let (one_per_zone, on_ranked) = copies_by_zone(&pc, &nodes).await;
    eprintln!(
        "{BLOCKS} blocks: {one_per_zone} with exactly one copy in each zone, {on_ranked} held \
         by their first two ranked members"
    );
    assert_eq!(one_per_zone, BLOCKS);
    assert_eq!(on_ranked, BLOCKS);

    // Zone z2 is lost: c and d are killed; a's view drops them once their leases expire.
    nodes[2].kill9();
    nodes[3].kill9();
    wait_cluster(&nodes[0], 20, 200, "c and d did not leave a's view", |c| {
        c.members.len() == 2
    })
    .await;
    let [whole, lost, wrong, failed] = read_all(&pc, &nodes[0].client).await;
    eprintln!(
        "zone z2 lost (c and d killed): {whole} of {} reads whole (pod client and node a), \
         {lost} lost, {wrong} wrong, {failed} failed",
        2 * BLOCKS
    );
    assert_eq!((lost, wrong, failed), (0, 0, 0));
    assert_eq!(whole, 2 * BLOCKS);

    // The pod client's refreshed view has only zone z1 left; its reads still find every
    // block (bounded wait for the view).
    let deadline = Instant::now() + Duration::from_secs(20);
    while pc.members().len() > 2 {
        assert!(
            Instant::now() < deadline,
            "the pod client still sees c or d"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        pc.refresh().await.unwrap();
    }
    for i in 0..BLOCKS {
        let got = pc.get("default", &r2_key(i)).await.unwrap();
        assert_eq!(got, Some(r2_data(i)), "block {i} after the view dropped z2");
    }
}

/// Of blocks `0..BLOCKS`: how many have exactly one copy in each zone, and how many are held
/// by exactly the two members the pod client ranks first for them.
async fn copies_by_zone(pc: &PodClient, nodes: &[Node]) -> (u64, u64) {
    let zone_of = |id: &str| NODES.iter().find(|n| n.0 == id).expect("a node").1;
    let keys: Vec<Vec<u8>> = (0..BLOCKS).map(r2_key).collect();
    let mut held = Vec::new();
    for n in nodes {
        held.push(held_here(n, "default", &keys).await);
    }
    let (mut one_per_zone, mut on_ranked) = (0u64, 0u64);
    for (b, key) in keys.iter().enumerate() {
        let holders: Vec<&str> = NODES
            .iter()
            .zip(&held)
            .filter(|(_, h)| h[b])
            .map(|(n, _)| n.0)
            .collect();
        let mut zones: Vec<&str> = holders.iter().map(|&id| zone_of(id)).collect();
        zones.sort_unstable();
        one_per_zone += u64::from(zones == ["z1", "z2"]);
        let mut first_two = pc.ranked("default", key)[..2].to_vec();
        first_two.sort_unstable();
        on_ranked += u64::from(first_two == holders);
    }
    (one_per_zone, on_ranked)
}

/// Reads blocks `0..BLOCKS` through the pod client and through `plain` (a node's client):
/// how many reads came back whole, lost (a miss), wrong (other bytes), failed (an error).
async fn read_all(pc: &PodClient, plain: &Client) -> [u64; 4] {
    let (mut whole, mut lost, mut wrong, mut failed) = (0u64, 0u64, 0u64, 0u64);
    for i in 0..BLOCKS {
        let want = r2_data(i);
        for got in [
            pc.get("default", &r2_key(i)).await,
            plain.get("default", &r2_key(i)).await,
        ] {
            match got {
                Ok(Some(b)) if b == want => whole += 1,
                Ok(Some(_)) => wrong += 1,
                Ok(None) => lost += 1,
                Err(e) => {
                    eprintln!("block {i}: {e}");
                    failed += 1;
                }
            }
        }
    }
    [whole, lost, wrong, failed]
}
