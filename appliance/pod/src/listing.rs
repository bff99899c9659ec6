//! A namespace's keys listed for the whole pod: every member asked for the same page at
//! once, the pages merged in key order, each key once
//! ([`ctxpod_wire::pod_plan::fold_pages`]). A member that cannot answer fails the page, since
//! a page without its keys would look complete; one that does not know the namespace yet
//! holds none of its keys. How a member is asked is a [`Pages`]: the node's engine for
//! itself and HTTP for the others in production, the simulated network in the simulation.
//!
//! A member lists only while it serves ([`own_page`]): one fenced out of the pod may hold
//! blocks the pod deleted meanwhile, and lists none of them.

use crate::coordinator::Coordinator;
use crate::membership::{MemberInfo, PodView};
use ctxpod_engine::{Engine, EngineError};
use ctxpod_wire::pod_plan::{fold_pages, ListFailure, PageAnswer};
use ctxpod_wire::types::ListedBlock;
use std::sync::Arc;

/// A page of keys with each key's entry, and whether the listing goes on after it.
pub type Page<T> = (Vec<(Vec<u8>, T)>, bool);

/// Why a member gave no page.
#[derive(Debug)]
pub enum PageError<E> {
    /// It does not know the namespace (yet): it holds none of its keys.
    UnknownNamespace,
    /// It could not be reached, or refused: the listing fails with this.
    Failed(E),
}

/// One member's page of a namespace's keys (from `after`, under `prefix`, at most
/// `limit`), as the listing's member asks it.
#[async_trait::async_trait]
pub trait Pages: Sync {
    /// A key's entry in the page (its length, CRC32C, when it was stored).
    type Entry: Send;
    /// Why a page failed, passed on to the client.
    type Error: Send;

    /// The page of member `m`; `None`: this member's own.
    async fn page(
        &self,
        m: Option<&MemberInfo>,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page<Self::Entry>, PageError<Self::Error>>;
}

impl Coordinator<'_> {
    /// One page of a namespace's keys: this member's, merged with every other member's in
    /// `view` when `whole_pod`. Fails with this member's error, or the first member's (in
    /// view order) that could not answer.
    pub async fn list<P: Pages>(
        &self,
        view: &PodView,
        whole_pod: bool,
        pages: &P,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page<P::Entry>, P::Error> {
        let me = view.members.iter().position(|m| m.id == self.me);
        let mine = match pages.page(None, prefix, after, limit).await {
            Ok((keys, more)) => PageAnswer::Page(keys, more),
            Err(PageError::UnknownNamespace) => PageAnswer::UnknownNamespace,
            Err(PageError::Failed(e)) => return Err(e),
        };
        let mut answers = vec![(me.unwrap_or(usize::MAX), mine)];
        let mut errors = std::collections::HashMap::new();
        if whole_pod {
            let others = view
                .members
                .iter()
                .enumerate()
                .filter(|(_, m)| m.id != self.me);
            let asked =
                futures::future::join_all(others.map(|(i, m)| async move {
                    (i, pages.page(Some(m), prefix, after, limit).await)
                }))
                .await;
            for (i, got) in asked {
                answers.push((
                    i,
                    match got {
                        Ok((keys, more)) => PageAnswer::Page(keys, more),
                        Err(PageError::UnknownNamespace) => PageAnswer::UnknownNamespace,
                        Err(PageError::Failed(e)) => {
                            errors.insert(i, e);
                            PageAnswer::Unreachable
                        }
                    },
                ));
            }
        }
        match fold_pages(answers, limit) {
            Ok(page) => Ok(page),
            Err(ListFailure::Unreachable(i)) => Err(errors.remove(&i).expect("its failure")),
            // Every member that answered does not know the namespace: no keys.
            Err(ListFailure::UnknownNamespace) => Ok((Vec::new(), false)),
        }
    }
}

/// Why this member gives no page of its own.
#[derive(Debug, thiserror::Error)]
pub enum OwnPageError {
    /// It cannot show it is in the pod now (etcd unreachable): it lists no keys until it
    /// can (an empty page would look like a namespace without keys).
    #[error(
        "this member cannot show it is in the pod now (etcd unreachable): it lists no keys \
         until it can; list through another member"
    )]
    Fenced,
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("listing: {0}")]
    Join(String),
}

/// This member's own page of namespace `scoped` (its name in the engine): its keys from
/// `after`, under `prefix`, at most `limit`, and whether its listing goes on.
pub async fn own_page(
    engine: &Arc<Engine>,
    scoped: &str,
    prefix: &[u8],
    after: Option<&[u8]>,
    limit: usize,
) -> Result<Page<ListedBlock>, OwnPageError> {
    if !engine.may_serve() {
        return Err(OwnPageError::Fenced);
    }
    // One more than the page, to know whether the listing goes on.
    let listed = {
        let (engine, scoped, prefix, after) = (
            engine.clone(),
            scoped.to_string(),
            prefix.to_vec(),
            after.map(<[u8]>::to_vec),
        );
        tokio::task::spawn_blocking(move || {
            engine.list_blocks(&scoped, &prefix, after.as_deref(), limit + 1)
        })
        .await
        .map_err(|e| OwnPageError::Join(e.to_string()))??
    };
    let more = listed.len() > limit;
    let page = listed
        .into_iter()
        .take(limit)
        .map(|(k, m)| {
            let entry = ListedBlock {
                len: m.len as u64,
                crc32c: ctxpod_wire::crc32c_hex(m.crc32c),
                stored_ms: m.stored_ms,
            };
            (k, entry)
        })
        .collect();
    Ok((page, more))
}
