//! Several connections to one node, for callers that spread requests over them.

use super::*;

/// Several connections to one node, used round robin.
pub struct TransferPool {
    pub(crate) conns: Vec<TransferClient>,
    pub(crate) next: AtomicU64,
}

impl TransferPool {
    pub async fn connect(addr: &str, connections: usize) -> Result<TransferPool, TransferError> {
        Self::connect_with(addr, connections, &crate::connect::Connect::default()).await
    }

    pub async fn connect_with(
        addr: &str,
        connections: usize,
        how: &crate::connect::Connect,
    ) -> Result<TransferPool, TransferError> {
        let mut conns = Vec::with_capacity(connections.max(1));
        for _ in 0..connections.max(1) {
            conns.push(TransferClient::connect_with(addr, how).await?);
        }
        Ok(TransferPool {
            conns,
            next: AtomicU64::new(0),
        })
    }

    /// The next connection, round robin.
    pub fn conn(&self) -> &TransferClient {
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize % self.conns.len();
        &self.conns[i]
    }

    /// Every connection (a region is registered on one; prefetch into it through that one).
    pub fn conns(&self) -> &[TransferClient] {
        &self.conns
    }

    pub fn busy_retries(&self) -> u64 {
        self.conns.iter().map(|c| c.busy_retries()).sum()
    }
}
