#!/usr/bin/env bash
# README command 1: build ctxpod and run a node on the embedded single-node default
# (data in ./ctxpod-data, HTTP on 127.0.0.1:7400, no TLS, no etcd). Extra arguments go to
# `ctxpod serve` (e.g. --capacity 8GiB --dram 1GiB).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ctxpod-target}"
bash scripts/setup-deps.sh
cargo build --bin ctxpod
exec "$CARGO_TARGET_DIR/debug/ctxpod" serve "$@"
