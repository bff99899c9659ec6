#!/usr/bin/env bash
# Fuzzes the parsers of untrusted input (api/wire/fuzz, libFuzzer through libfuzzer-sys): the
# CXP1 frame and body decoders (`frame_decoder`: the length and header checks the node's
# socket reader runs too), the node's PUT-body parser fed in arbitrary pieces (`put_body`),
# the HTTP API's CXB1 batch frames (`batch_frame`), record headers read back from the device
# (`record_header`), bearer tokens, token hashes and token files (`token`) and the
# configuration file (`config`), and the pod planner driven by arbitrary answers (`pod_plan`),
# CTXPOD_FUZZ_SECONDS each (default 20; CI runs the default). Builds on stable Rust with
# libFuzzer's coverage instrumentation (no sanitizer: the codec is safe Rust), in a target
# directory of its own so the instrumented build never invalidates the main one. The corpus
# persists under that directory between runs. A long run:
#   CTXPOD_FUZZ_SECONDS=3600 bash scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$HOME/.cache/ctxpod-target}/fuzz"
seconds="${CTXPOD_FUZZ_SECONDS:-20}"
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 -Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps RUSTFLAGS off build scripts and proc macros.
host="$(rustc -vV | sed -n 's/^host: //p')"
cargo build --quiet --release --manifest-path api/wire/fuzz/Cargo.toml --target-dir "$target" \
  --target "$host"
for t in frame_decoder put_body batch_frame record_header token config pod_plan; do
  corpus="$target/corpus/$t"
  mkdir -p "$corpus"
  echo "fuzz: $t for $seconds s"
  "$target/$host/release/$t" -max_total_time="$seconds" -max_len=4096 \
    -rss_limit_mb=2048 -print_final_stats=1 "$corpus" 2>&1 | tail -n 6
done
