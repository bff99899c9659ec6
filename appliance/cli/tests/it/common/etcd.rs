//! The pod tests' etcd: ctxpod-testkit's [`EtcdServer`], and a client of it made the way the
//! nodes make theirs (the pod's own etcd client, which ctxpod-testkit may not depend on).

pub use ctxpod_testkit::etcd::EtcdServer;

/// [`EtcdServer`] as the pod tests reach it.
pub trait PodEtcd {
    /// A client as the nodes make it (user `ctxpod`).
    fn client(&self) -> std::sync::Arc<dyn ctxpod_pod::meta::Meta>;
}

impl PodEtcd for EtcdServer {
    fn client(&self) -> std::sync::Arc<dyn ctxpod_pod::meta::Meta> {
        let cfg: ctxpod_format::config::PodConfig =
            toml::from_str(&self.pod_lines()).expect("the pod lines parse");
        std::sync::Arc::new(ctxpod_pod::etcd::Etcd::from_config(&cfg).expect("etcd client"))
    }
}
