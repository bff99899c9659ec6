//! The pod tests' etcd: ctxpod-testkit's [`EtcdServer`], and a client of it made the way the
//! nodes make theirs (the pod's own etcd client, which ctxpod-testkit may not depend on).

pub use ctxpod_testkit::etcd::EtcdServer;

/// [`EtcdServer`] as the pod tests reach it.
pub trait PodEtcd {
    /// The `[pod]` configuration that reaches it (user `ctxpod`, TLS, client certificate).
    fn pod_config(&self) -> ctxpod_format::config::PodConfig;

    /// A client as the nodes make it (user `ctxpod`).
    fn client(&self) -> std::sync::Arc<dyn ctxpod_pod::meta::Meta>;

    /// The pod's coordination store on it, as the nodes make it (user `ctxpod`).
    fn meta(&self) -> ctxpod_pod::meta::etcd::EtcdMeta;
}

impl PodEtcd for EtcdServer {
    fn pod_config(&self) -> ctxpod_format::config::PodConfig {
        toml::from_str(&self.pod_lines()).expect("the pod lines parse")
    }

    fn client(&self) -> std::sync::Arc<dyn ctxpod_pod::meta::Meta> {
        std::sync::Arc::new(self.meta())
    }

    fn meta(&self) -> ctxpod_pod::meta::etcd::EtcdMeta {
        ctxpod_pod::meta::etcd::EtcdMeta::from_config(&self.pod_config()).expect("etcd store")
    }
}
