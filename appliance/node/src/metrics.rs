//! The node's own Prometheus series: requests and answers, block bytes in and out, connections,
//! prefetch pushes, authentication, TLS, forwarding and the pod as this node sees it. They are
//! registered in the engine's registry (`ctxpod_engine::metrics`), so `/metrics` is one page;
//! [`render`] writes it.

use ctxpod_engine::metrics::{counter, gauge, latency_buckets, register};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub struct NodeMetrics {
    /// Request latency per operation (`put`, `get`, `head`, `delete`, `match`, `batch_get`,
    /// `batch_put`, `pin`, `unpin`, `promote`, `namespace`).
    pub request_seconds: HistogramVec,
    /// Answers per operation and status class.
    pub responses: IntCounterVec,
    pub received_bytes: IntCounter,
    pub sent_bytes: IntCounter,
    /// Connections held, by listener (`http`, `transfer`).
    pub connections: IntGaugeVec,
    /// Connections refused or closed by a limit, by listener and why (`listener`, `peer`:
    /// the caps; `idle`: the idle timeout; `handshakes`: too many TLS handshakes).
    pub connections_refused: IntCounterVec,
    pub inflight_requests: IntGauge,
    pub prefetch_blocks: IntCounterVec,
    pub prefetch_pushed_bytes: IntCounter,
    pub prefetch_tickets: IntCounter,
    /// Credentials refused, by reason (`missing`, `malformed`, `wrong`, `unknown_identity`).
    pub auth_failures: IntCounterVec,
    /// Authenticated requests refused for their role (403).
    pub forbidden: IntCounter,
    /// S3 door requests, by operation and outcome (`OK` or the S3 error code; a bounded
    /// set, `other` for the rare ones).
    pub s3_requests: IntCounterVec,
    /// Requests refused for a tenant's limits, by tenant and kind (`rate`: 429, `bytes`: 403 `quota`, `namespaces`: 403).
    pub quota_rejections: IntCounterVec,
    /// TLS handshakes that failed (bad or missing client certificate, protocol errors).
    pub tls_handshake_failures: IntCounter,
    /// Successful reloads of the TLS certificate, key and client CA.
    pub tls_reloads: IntCounter,
    /// Members of the pod in this node's view.
    pub pod_members: IntGauge,
    /// Single-block requests this node forwarded to another member, by outcome (`read`,
    /// `write`, `read_miss`: no member tried held it, `unreachable`: a member did not answer).
    pub forwarded: IntCounterVec,
    /// 1 while etcd answers (always 1 without etcd), 0 while the node serves with the last
    /// known membership.
    pub pod_etcd_up: IntGauge,
    /// Unix time of etcd's last answer (0: never, or no etcd).
    pub pod_etcd_last_ok: IntGauge,
    /// Member records in etcd left out of this node's view as invalid (forged or broken).
    pub pod_member_records_rejected: IntGauge,
    /// Copies of a deleted block refused (read repair, backfill).
    pub copies_refused: IntCounter,
    /// CXP1 write requests not applied: read after their client closed or reset the
    /// connection (it gave up on them at its deadline).
    pub abandoned_writes: IntCounter,
}

impl NodeMetrics {
    /// The node's series, registered in `r`, family by family.
    pub fn new(r: &Registry) -> NodeMetrics {
        let q = RequestSeries::new(r);
        let c = ConnectionSeries::new(r);
        let p = PrefetchSeries::new(r);
        let a = AccessSeries::new(r);
        let d = PodSeries::new(r);
        NodeMetrics {
            request_seconds: q.seconds,
            responses: q.responses,
            received_bytes: q.received_bytes,
            sent_bytes: q.sent_bytes,
            connections: c.held,
            connections_refused: c.refused,
            inflight_requests: c.inflight_requests,
            prefetch_blocks: p.blocks,
            prefetch_pushed_bytes: p.pushed_bytes,
            prefetch_tickets: p.tickets,
            auth_failures: a.auth_failures,
            forbidden: a.forbidden,
            s3_requests: a.s3_requests,
            quota_rejections: a.quota_rejections,
            tls_handshake_failures: a.tls_handshake_failures,
            tls_reloads: a.tls_reloads,
            pod_members: d.members,
            forwarded: d.forwarded,
            pod_etcd_up: d.etcd_up,
            pod_etcd_last_ok: d.etcd_last_ok,
            pod_member_records_rejected: d.member_records_rejected,
            copies_refused: d.copies_refused,
            abandoned_writes: d.abandoned_writes,
        }
    }

    /// The request-latency histogram of each operation served so far (cumulative bucket
    /// counts at [`latency_buckets`]), sorted by op.
    pub fn latency_by_op(&self) -> Vec<ctxpod_wire::types::OpLatency> {
        use prometheus::core::Collector;
        let mut out: Vec<_> = self
            .request_seconds
            .collect()
            .iter()
            .flat_map(|mf| mf.get_metric())
            .map(|m| {
                let h = m.get_histogram();
                ctxpod_wire::types::OpLatency {
                    op: m
                        .get_label()
                        .iter()
                        .find(|l| l.name() == "op")
                        .map(|l| l.value().to_string())
                        .unwrap_or_default(),
                    buckets: h
                        .get_bucket()
                        .iter()
                        .map(|b| b.cumulative_count())
                        .collect(),
                    count: h.get_sample_count(),
                }
            })
            .collect();
        out.sort_by(|a, b| a.op.cmp(&b.op));
        out
    }
}

/// The Prometheus text of every series in `r`.
pub fn render(r: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&r.gather(), &mut buf)
        .expect("text encoding into a Vec cannot fail");
    String::from_utf8(buf).expect("the text encoder writes UTF-8")
}

/// Requests and their answers, and block bytes in and out (fields of [`NodeMetrics`]).
struct RequestSeries {
    seconds: HistogramVec,
    responses: IntCounterVec,
    received_bytes: IntCounter,
    sent_bytes: IntCounter,
}

impl RequestSeries {
    fn new(r: &Registry) -> RequestSeries {
        RequestSeries {
            seconds: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "ctxpod_request_duration_seconds",
                        "Request latency per operation",
                    )
                    .buckets(latency_buckets()),
                    &["op"],
                ),
            ),
            responses: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "ctxpod_responses_total",
                        "Answers per operation and status class",
                    ),
                    &["op", "class"],
                ),
            ),
            received_bytes: counter(
                r,
                "ctxpod_received_bytes_total",
                "Block payload bytes received",
            ),
            sent_bytes: counter(r, "ctxpod_sent_bytes_total", "Block payload bytes sent"),
        }
    }
}

/// Connections held and refused, and requests in flight (fields of [`NodeMetrics`]).
struct ConnectionSeries {
    held: IntGaugeVec,
    refused: IntCounterVec,
    inflight_requests: IntGauge,
}

impl ConnectionSeries {
    fn new(r: &Registry) -> ConnectionSeries {
        ConnectionSeries {
            held: register(
                r,
                IntGaugeVec::new(
                    Opts::new("ctxpod_connections", "Connections held, by listener"),
                    &["listener"],
                ),
            ),
            refused: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "ctxpod_connections_refused_total",
                        "Connections refused or closed by a limit, by listener and why",
                    ),
                    &["listener", "why"],
                ),
            ),
            inflight_requests: gauge(r, "ctxpod_inflight_requests", "Data requests being served"),
        }
    }
}

/// Prefetch pushes and tickets (fields of [`NodeMetrics`]).
struct PrefetchSeries {
    blocks: IntCounterVec,
    pushed_bytes: IntCounter,
    tickets: IntCounter,
}

impl PrefetchSeries {
    fn new(r: &Registry) -> PrefetchSeries {
        PrefetchSeries {
            blocks: register(r, IntCounterVec::new(
                Opts::new(
                    "ctxpod_prefetch_blocks_total",
                    "Prefetch entries by outcome: pushed, miss, deadline, cancelled, busy, too_large, error"
                ),
                &["outcome"]
            )),
            pushed_bytes: counter(
                r,
                "ctxpod_prefetch_pushed_bytes_total",
                "Block bytes pushed into clients' memory regions",
            ),
            tickets: counter(
                r,
                "ctxpod_prefetch_tickets_total",
                "Prefetch tickets completed (every entry pushed or missed)",
            ),
        }
    }
}

/// Access: authentication, roles, the S3 door, tenants' limits and TLS (fields of
/// [`NodeMetrics`]).
struct AccessSeries {
    auth_failures: IntCounterVec,
    forbidden: IntCounter,
    s3_requests: IntCounterVec,
    quota_rejections: IntCounterVec,
    tls_handshake_failures: IntCounter,
    tls_reloads: IntCounter,
}

impl AccessSeries {
    fn new(r: &Registry) -> AccessSeries {
        AccessSeries {
            auth_failures: register(r, IntCounterVec::new(
                Opts::new(
                    "ctxpod_auth_failures_total",
                    "Credentials refused (401), by reason"
                ),
                &["reason"]
            )),
            forbidden: counter(
                r,
                "ctxpod_forbidden_total",
                "Authenticated requests refused for their role (403)",
            ),
            s3_requests: register(r, IntCounterVec::new(
                Opts::new(
                    "ctxpod_s3_requests_total",
                    "S3 door requests by operation and outcome"
                ),
                &["op", "code"]
            )),
            quota_rejections: register(r, IntCounterVec::new(
                Opts::new(
                    "ctxpod_quota_rejections_total",
                    "Requests refused for a tenant's limits: rate (429), bytes (403 quota) or namespaces (403)"
                ),
                &["tenant", "kind"]
            )),
            tls_handshake_failures: counter(
                r,
                "ctxpod_tls_handshake_failures_total",
                "TLS handshakes that failed (client certificate refused, protocol errors)",
            ),
            tls_reloads: counter(
                r,
                "ctxpod_tls_reloads_total",
                "Reloads of the TLS certificate, key and client CA",
            ),
        }
    }
}

/// The pod as this node sees it: members, forwarding, etcd and refused copies (fields of
/// [`NodeMetrics`]).
struct PodSeries {
    members: IntGauge,
    forwarded: IntCounterVec,
    etcd_up: IntGauge,
    etcd_last_ok: IntGauge,
    member_records_rejected: IntGauge,
    copies_refused: IntCounter,
    abandoned_writes: IntCounter,
}

impl PodSeries {
    fn new(r: &Registry) -> PodSeries {
        PodSeries {
            members: gauge(r, "ctxpod_pod_members", "Members of the pod in this node's view"),
            forwarded: register(r, IntCounterVec::new(
                Opts::new(
                    "ctxpod_forwarded_total",
                    "Single-block requests forwarded to the member holding the block, by outcome"
                ),
                &["outcome"]
            )),
            etcd_up: gauge(
                r,
                "ctxpod_pod_etcd_up",
                "1 while etcd answers (or no etcd is configured); 0 while serving with the last known membership",
            ),
            etcd_last_ok: gauge(
                r,
                "ctxpod_pod_etcd_last_ok_timestamp_seconds",
                "Unix time of etcd's last answer (0: never, or no etcd)",
            ),
            member_records_rejected: gauge(
                r,
                "ctxpod_pod_member_records_rejected",
                "Member records in etcd left out of the view as invalid (forged or broken)",
            ),
            copies_refused: counter(
                r,
                "ctxpod_copies_refused_total",
                "Copies of a block the pod deleted refused (read repair, backfill)",
            ),
            abandoned_writes: counter(
                r,
                "ctxpod_abandoned_writes_total",
                "CXP1 write requests not applied: read after their client reset or closed the connection",
            ),
        }
    }
}
