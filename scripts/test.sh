#!/usr/bin/env bash
# README command 2: build and run the whole test suite (unit, integration against the real
# binary, crash loop, tamper, eviction, the pod with a real etcd), validate the OpenAPI
# document, check the Helm chart, test the dashboard in headless chromium and fuzz the HTTP
# contract (schemathesis, scripts/contract.sh).
# Then fuzzes every parser of untrusted input for 20 s each (scripts/fuzz.sh).
# CTXPOD_CRASH_CYCLES sets the crash-loop length (default 50); extra arguments go to
# `cargo nextest run` (e.g. a filter).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ctxpod-target}"
bash scripts/setup-deps.sh
venv="${CTXPOD_VENV:-$HOME/.cache/ctxpod-venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check openapi-spec-validator==0.9.0 \
  helm-python-sdk==0.2.2 kubernetes-validate==1.31.0 pyyaml==6.0.2 selenium==4.51.0 \
  maturin==1.16.0 pytest==9.2.0 numpy==2.4.6 cbor2==6.3.0 xxhash==4.1.0
# Real S3 clients for the S3 door's suite (api/python/tests/test_s3.py): boto3 and the AWS CLI.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check boto3==1.44.8 awscli==1.46.3
# A real engine for the SDK's end-to-end test: torch from PyPI (the CUDA build; it runs on
# the CPU here; about 2.5 minutes and 5.6 GB the first time, then cached in the venv) and
# Hugging Face transformers.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check torch==2.15.0 transformers==5.24.0
# The real upstream engines the connectors (ctxpod.integrations) are tested against: LMCache,
# SGLang and vLLM from PyPI, with a curated list of dependencies (--no-deps: their pins would
# replace torch; see the file). About 600 MB the first time.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
  -r api/python/tests/connectors.txt
"$venv/bin/python" -m openapi_spec_validator api/openapi.json
cargo nextest run --workspace --no-fail-fast --failure-output final "$@"
# The Python SDK (api/python/): built from the workspace's Rust client with maturin into the
# venv (the dev profile shares this build's artifacts), then its pytest suites against real
# nodes: one node, one with authentication on, a 3-node pod over etcd, and a seeded Llama
# (transformers, on the CPU) restoring a prompt's prefix from ctxpod with identical tokens.
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation --config-settings=build-args="--profile dev" ./api/python
# CTXPOD_REQUIRE_ENGINES: a suite whose engine does not import fails instead of skipping.
# A run's temporary directories (about 12 GB: model chunks, node devices) are kept only for
# failed tests: pytest's default keeps the last three runs whole, which filled this
# machine's disk in a later run.
CTXPOD_REQUIRE_ENGINES=1 LMCACHE_TRACK_USAGE=false CTXPOD_BIN="$CARGO_TARGET_DIR/debug/ctxpod" \
  "$venv/bin/python" -m pytest -q -o tmp_path_retention_policy=failed api/python/tests
# The Helm chart: every values file renders, lints and validates (Helm v4's engine in
# process, Kubernetes 1.31 schemas), and the real binary accepts each rendered config.
CTXPOD_BIN="$CARGO_TARGET_DIR/debug/ctxpod" "$venv/bin/python" scripts/helm-check.py
# The dashboard at /ui in headless chromium (Selenium) against a real node: live numbers
# after writes, the miss-ratio curve, the planner form == `ctxpod plan`, no console error;
# screenshots land in $CARGO_TARGET_DIR/ui-artifacts.
CTXPOD_BIN="$CARGO_TARGET_DIR/debug/ctxpod" "$venv/bin/python" scripts/ui-check.py
# The HTTP contract: schemathesis runs every operation of api/openapi.json against a node
# with authentication on, all checks, 0 failures (CTXPOD_CONTRACT_EXAMPLES per operation).
CTXPOD_BIN="$CARGO_TARGET_DIR/debug/ctxpod" CTXPOD_VENV="$venv" bash scripts/contract.sh
# The HTTP API, CXP1 and KV-event suites again over TLS, then over mTLS (the harness makes a
# CA, the node's certificate and an admin client certificate with rcgen).
for transport in tls mtls; do
  CTXPOD_TEST_TRANSPORT=$transport cargo nextest run --workspace --no-fail-fast \
    --failure-output final -E 'binary(it) & test(/^(api|transfer|events)::/)' "$@"
done
cargo test --workspace --doc
# The fuzz targets, briefly (CTXPOD_FUZZ_SECONDS each, default 20).
bash scripts/fuzz.sh
