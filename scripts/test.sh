#!/usr/bin/env bash
# README command 2: build and run the whole test suite (unit, integration against the real
# binary, crash loop, tamper, eviction). CTXPOD_CRASH_CYCLES sets the crash-loop length
# (default 50).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ctxpod-target}"
bash scripts/setup-deps.sh
cargo nextest run --workspace --no-fail-fast --failure-output final "$@"
cargo test --workspace --doc
