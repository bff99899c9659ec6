#!/usr/bin/env bash
# ctxpod beside Mooncake Store and Redis, in one session, ROUNDS times (default 2):
#   1. ../shared/bench-peers/run_peers.sh: Mooncake Store in memory and with its SSD tier,
#      Redis, and ctxpod's HTTP API driven by the same Python harness;
#   2. `ctxpod bench` with ctxpod's own Rust client, right after, on the same machine:
#      CXP1 one block per request, and CXP1 and HTTP with the harness's batch (32 blocks per
#      request; 8 for 4 MiB blocks: a request holds at most 64 MiB with its framing);
#   3. ctxpod through its Python SDK (bench/sdk_bench.py) in the same harness as Mooncake
#      Store's Python client and Redis (benchlib.py: sizes, batches 1/16/32, every byte
#      checked): the zero-copy API (register_buffer, batch_put_from, batch_get_into) and
#      the bytes API. The SDK must be installed in $SDK_PYTHON's environment (the README's
#      test command installs it into ~/.cache/ctxpod-venv);
#   4. bench/ttft.py: time to first token with a 1k/4k/16k-token prefix from ctxpod against
#      a full recompute (a seeded Llama on the CPU), the fetch against its bound.
# Then bench/peers-report.py prints the medians over the rounds and the ratios issue #6's
# targets name. Everything lands in $OUT (default ~/.cache/ctxpod-peers/combined-<time>).
#
#   CTXPOD_BIN=~/.cache/ctxpod-target/debug/ctxpod ROUNDS=2 bash bench/peers.sh   # ~20 min a round
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PEERS=${PEERS:-$here/../../shared/bench-peers}
CTXPOD_BIN=${CTXPOD_BIN:?set CTXPOD_BIN to the ctxpod binary}
ROUNDS=${ROUNDS:-2}
# FIRST_ROUND=3 adds rounds 3.. to an earlier session's OUT.
FIRST_ROUND=${FIRST_ROUND:-1}
DIR=${DIR:-/work/bench}
PEERS_DIR=${PEERS_DIR:-$HOME/.cache/ctxpod-peers}
OUT=${OUT:-$PEERS_DIR/combined-$(date +%Y%m%d-%H%M%S)}
BYTES=${BYTES:-1GiB}
SDK_PYTHON=${SDK_PYTHON:-$HOME/.cache/ctxpod-venv/bin/python}
SDK_BYTES=${SDK_BYTES:-1G}
mkdir -p "$OUT" "$DIR"
# Before each step: the previous step's dirty pages written back and the device quiet, so
# one step's writeback does not land in the next one's timings (a run of 2026-12-02 measured
# the SDK's first config at a third of its rate right after the Rust client's writes).
settle() { sync; sleep "${SETTLE_S:-10}"; }
[[ -d $PEERS ]] || { echo "peers.sh: no bench-peers at $PEERS (set PEERS)" >&2; exit 1; }
for r in $(seq "$FIRST_ROUND" "$ROUNDS"); do
  echo "== round $r of $ROUNDS: bench-peers ($(date +%T))" >&2
  before=$(ls -1d "$PEERS_DIR"/results/2* 2>/dev/null | tail -1 || true)
  (cd "$PEERS" && CTXPOD_BIN=$CTXPOD_BIN PEERS_DIR=$PEERS_DIR bash run_peers.sh) \
    >"$OUT/peers-$r.log" 2>&1
  after=$(ls -1d "$PEERS_DIR"/results/2* | tail -1)
  [[ $after != "$before" ]] || { echo "peers.sh: run_peers.sh left no results" >&2; exit 1; }
  cp "$after/results.jsonl" "$OUT/peers-$r.jsonl"
  echo "== round $r of $ROUNDS: ctxpod bench, Rust client ($(date +%T))" >&2
  limits=0
  [[ $r == "$FIRST_ROUND" ]] && limits=2GiB
  run() { # name, then ctxpod bench arguments
    local name=$1; shift
    settle
    "$CTXPOD_BIN" bench --dir "$DIR" --bytes "$BYTES" --device-bytes 1GiB \
      --json "$OUT/ctxpod-$r-$name.jsonl" "$@" >"$OUT/ctxpod-$r-$name.log" 2>&1
  }
  run cxp1-b1 --protocol cxp1 --sizes 64KiB,1MiB,4MiB --limits-bytes "$limits"
  run cxp1-b32 --protocol cxp1 --sizes 64KiB,1MiB --batch 32 --limits-bytes 0
  run cxp1-b8 --protocol cxp1 --sizes 4MiB --batch 8 --limits-bytes 0
  run http-b32 --protocol http --sizes 64KiB,1MiB --batch 32 --limits-bytes 0
  run http-b8 --protocol http --sizes 4MiB --batch 8 --limits-bytes 0
  echo "== round $r of $ROUNDS: ctxpod through its Python SDK ($(date +%T))" >&2
  for api in zerocopy bytes; do
    settle
    PEERS=$PEERS timeout 900 "$SDK_PYTHON" "$here/sdk_bench.py" --ctxpod-bin "$CTXPOD_BIN" \
      --api "$api" --sizes 64K,1M,4M --batches 1,16,32 --bytes-per-config "$SDK_BYTES" \
      --data-root "$DIR" --jsonl "$OUT/sdk-$r.jsonl" --server-log "$OUT/sdk-$r-$api.server.log" \
      >"$OUT/sdk-$r-$api.log" 2>&1
  done
  echo "== round $r of $ROUNDS: time to first token, prefix from ctxpod vs recompute ($(date +%T))" >&2
  settle
  CTXPOD_BIN=$CTXPOD_BIN timeout 900 "$SDK_PYTHON" "$here/ttft.py" --json "$OUT/ttft-$r.json" \
    >"$OUT/ttft-$r.log" 2>&1
done
python3 "$here/peers-report.py" "$OUT" | tee "$OUT/report.md"
