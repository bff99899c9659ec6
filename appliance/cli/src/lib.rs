//! `ctxpod`, the binary: [`cli`] parses the command line and calls the node
//! (`ctxpod_node::serve::serve`), a client (`ctxpod-client`) or a tool (`ctxpod-tools`).
//! Every layer below is a crate of its own (docs/ARCHITECTURE.md); this one holds no logic
//! of theirs.

pub mod cli;
