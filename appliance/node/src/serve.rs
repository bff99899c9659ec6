//! `ctxpod serve`: the wiring of the process (the engine opened, the pod joined, both
//! listeners bound, reloads on SIGHUP, shutdown on a signal). No logic of its own.

use crate::auth::Authenticator;
use crate::metrics::NodeMetrics;
use ctxpod_engine::metrics::Metrics;
use ctxpod_engine::Engine;
use ctxpod_format::config::Config;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use tokio::task::JoinHandle;

use crate::http::routes::router;

/// Runs a node until SIGTERM or Ctrl-C, then stops accepting, drains and commits.
pub async fn serve(cfg: Config) -> anyhow::Result<()> {
    use anyhow::Context;
    // One registry: the engine's series, the pod's (registered when it joins) and the node's.
    let metrics = Arc::new(Metrics::new());
    let node_metrics = Arc::new(NodeMetrics::new(&metrics.registry));
    let auth = Arc::new(Authenticator::new(&cfg, node_metrics.clone())?);
    let engine = Arc::new(Engine::open(cfg.clone(), metrics).await?);
    log_auth(&auth);
    let tls = crate::tls::Tls::load(&cfg.tls, node_metrics.clone())?;
    watch_tls(&cfg, &tls);
    tokio::spawn(reload_on_sighup(auth.clone(), tls.clone()));
    // A member of an etcd pod serves no block before it has joined.
    let fence = ctxpod_pod::Pod::fence_before_join(&cfg, &engine)?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("listen on {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let addr_file = cfg.data_dir.join("ctxpod.addr");
    let tmp = cfg.data_dir.join("ctxpod.addr.tmp");
    tracing::info!(%addr, engine = engine.io_engine(), "ctxpod serving HTTP API v1");
    let scheme = if cfg.tls.enabled() { "https" } else { "http" };
    println!("ctxpod listening on {scheme}://{addr}");
    let budgets = crate::budget::Budgets::from_config(&cfg, &engine.metrics().registry);
    let handshakes = crate::conn::Handshakes::new(cfg.tls_handshakes_max);
    let transfer = match cfg.transfer_listen {
        Some(at) => {
            let f = cfg.data_dir.join("ctxpod.transfer.addr");
            let (l, taddr) = bind_published(at, "transfer listener", &tmp, &f).await?;
            tracing::info!(addr = %taddr, "ctxpod serving the CXP1 transfer protocol");
            Some(tokio::spawn(crate::cxp1::serve(
                l,
                engine.clone(),
                auth.clone(),
                tls.clone(),
                budgets.clone(),
                crate::conn::Gate::new(
                    "transfer",
                    crate::conn::Limits::from_config(&cfg),
                    node_metrics.clone(),
                ),
                handshakes.clone(),
            )))
        }
        None => None,
    };
    let taddr = published_transfer_addr(&cfg);
    let pod = ctxpod_pod::Pod::join(&cfg, addr, taddr, &engine, fence).await?;
    pod.start_background(engine.clone(), &cfg, auth.enabled());
    let app = router(
        engine.clone(),
        node_metrics.clone(),
        auth.clone(),
        cfg.max_inflight_requests,
        budgets,
        &pod,
    );
    let s3 = match cfg.s3_listen {
        Some(at) => {
            let f = cfg.data_dir.join("ctxpod.s3.addr");
            let (l, saddr) = bind_published(at, "S3 listener", &tmp, &f).await?;
            tracing::info!(addr = %saddr, "ctxpod serving the S3 door");
            let limits = crate::conn::Limits::from_config(&cfg);
            let gate = crate::conn::Gate::new("s3", limits.clone(), node_metrics.clone());
            let (conns, accepting) =
                crate::tls::accept_loop(l, tls.clone(), gate, handshakes.clone());
            let body_max = crate::s3::body_bytes_max(cfg.value_bytes_max.0);
            let door = crate::s3::router(app.clone(), auth.clone(), node_metrics.clone(), body_max);
            let serving = tokio::spawn(crate::conn::serve_http(
                conns,
                door,
                limits.header_read,
                std::future::pending(),
            ));
            Some((accepting, serving))
        }
        None => None,
    };
    // The HTTP address is published last: once it is there, every listener serves.
    std::fs::write(&tmp, format!("{addr}\n"))?;
    std::fs::rename(&tmp, &addr_file)?;
    let limits = crate::conn::Limits::from_config(&cfg);
    let gate = crate::conn::Gate::new("http", limits.clone(), node_metrics);
    let (conns, accepting) = crate::tls::accept_loop(listener, tls, gate, handshakes);
    crate::conn::serve_http(conns, app, limits.header_read, shutdown_signal()).await;
    stop_listeners(accepting, s3, transfer);
    pod.leave().await;
    tracing::info!("shutting down: committing queued writes");
    engine.shutdown().await;
    let _ = std::fs::remove_file(&addr_file);
    Ok(())
}

/// Says in the log whether authentication is on.
fn log_auth(auth: &Authenticator) {
    if auth.enabled() {
        tracing::info!("authentication is on: every request needs a token or a client certificate");
    } else {
        tracing::warn!(
            "authentication is OFF: every client is an admin of this node (allowed on loopback; \
             configure auth tokens or identities to turn it on)"
        );
    }
}

/// Says in the log whether TLS is on and, when it is, watches its files for changes.
fn watch_tls(cfg: &Config, tls: &Option<Arc<crate::tls::Tls>>) {
    match tls {
        Some(t) => {
            tracing::info!(
                mtls = cfg.tls.client_ca_file.is_some(),
                "TLS on both listeners (files re-read on SIGHUP and on change)"
            );
            tokio::spawn(t.clone().watch());
        }
        None => tracing::warn!(
            "TLS is off: plain TCP (allowed on loopback, or with tls.allow_plaintext)"
        ),
    }
}

/// Binds the `what` listener at `at` and publishes its address in `file` (written to
/// `tmp`, then renamed, so a reader never sees half of it).
async fn bind_published(
    at: SocketAddr,
    what: &str,
    tmp: &Path,
    file: &Path,
) -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    use anyhow::Context;
    let l = tokio::net::TcpListener::bind(at)
        .await
        .with_context(|| format!("{what} on {at}"))?;
    let local = l.local_addr()?;
    std::fs::write(tmp, format!("{local}\n"))?;
    std::fs::rename(tmp, file)?;
    Ok((l, local))
}

/// The transfer listener's address as published (what the pod announces), if it has one.
fn published_transfer_addr(cfg: &Config) -> Option<SocketAddr> {
    match cfg.transfer_listen {
        Some(_) => std::fs::read_to_string(cfg.data_dir.join("ctxpod.transfer.addr"))
            .ok()
            .and_then(|s| s.trim().parse().ok()),
        None => None,
    }
}

/// Stops the listeners' tasks: the HTTP one's accepting, the S3 door's accepting and
/// serving, and the transfer listener.
fn stop_listeners(
    accepting: JoinHandle<()>,
    s3: Option<(JoinHandle<()>, JoinHandle<()>)>,
    transfer: Option<JoinHandle<()>>,
) {
    accepting.abort();
    if let Some((accepting, serving)) = s3 {
        accepting.abort();
        serving.abort();
    }
    if let Some(t) = transfer {
        t.abort();
    }
}

/// Re-reads credentials (and TLS files) on SIGHUP; a bad reload keeps what was loaded.
async fn reload_on_sighup(auth: Arc<Authenticator>, tls: Option<Arc<crate::tls::Tls>>) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        if let Some(t) = &tls {
            match t.reload() {
                Ok(()) => tracing::info!("SIGHUP: TLS certificate, key and client CA reloaded"),
                Err(e) => {
                    tracing::error!("SIGHUP: TLS files not reloaded, keeping the old ones: {e:#}")
                }
            }
        }
        match auth.reload() {
            Ok(n) => tracing::info!(tokens = n, "SIGHUP: credentials reloaded"),
            Err(e) => {
                tracing::error!("SIGHUP: credentials not reloaded, keeping the old ones: {e}")
            }
        }
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
