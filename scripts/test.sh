#!/usr/bin/env bash
# README command 2: build and run the whole test suite (unit, integration against the real
# binary, crash loop, tamper, eviction) and validate the OpenAPI document.
# Then fuzzes the CXP1 frame decoder for 30 s (scripts/fuzz.sh).
# CTXPOD_CRASH_CYCLES sets the crash-loop length (default 50); extra arguments go to
# `cargo nextest run` (e.g. a filter).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ctxpod-target}"
bash scripts/setup-deps.sh
venv="${CTXPOD_VENV:-$HOME/.cache/ctxpod-venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check openapi-spec-validator==0.9.0
"$venv/bin/python" -m openapi_spec_validator api/openapi.json
cargo nextest run --workspace --no-fail-fast --failure-output final "$@"
cargo test --workspace --doc
# The CXP1 frame decoder's fuzz target, briefly (CTXPOD_FUZZ_SECONDS, default 30).
bash scripts/fuzz.sh
