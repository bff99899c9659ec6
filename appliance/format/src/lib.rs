//! Parsers of ctxpod's untrusted input that need no I/O, kept in a crate of their own so
//! that the fuzz targets (`api/wire/fuzz`) build them without RocksDB or the node:
//! - [`record`]: the on-device record header (read back from a device anyone with the drive
//!   may have written);
//! - [`token`]: bearer tokens and their stored hashes and token files;
//! - [`config`]: the node's configuration (TOML, environment, flags).

pub mod config;
pub mod record;
pub mod token;

/// Alignment and granularity of device I/O, in bytes.
pub const IO_ALIGN_BYTES: usize = 4096;
