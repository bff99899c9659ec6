#!/usr/bin/env bash
# The SDK's small reads beside Redis and the Rust client, in interleaved rounds (issue #35):
# per round, hot GETs of SIZE blocks (default 64K) at batches 1, 16 and 32
#   1. through the Python SDK, zero-copy API (bench/sdk_bench.py: register_buffer and
#      batch_get_into(keys, ptrs, sizes), one call at a time, every byte checked);
#   2. through ctxpod's Rust client over CXP1 at the same depth (`ctxpod bench --batch B
#      --concurrency 1`: one request in flight);
#   3. Redis without persistence, redis-py with hiredis (../shared/bench-peers).
# Then bench/sdk-small-report.py OUT prints per batch the medians and the per-round ratios
# SDK / Redis and SDK / Rust. About a minute a round here.
#
#   CTXPOD_BIN=~/.cache/ctxpod-target/debug/ctxpod ROUNDS=3 bash bench/sdk-small.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PEERS=${PEERS:-$here/../../shared/bench-peers}
CTXPOD_BIN=${CTXPOD_BIN:?set CTXPOD_BIN to the ctxpod binary}
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-64K}
BYTES=${BYTES:-256M}
DIR=${DIR:-/work/bench}
SDK_PYTHON=${SDK_PYTHON:-$HOME/.cache/ctxpod-venv/bin/python}
PEERS_DIR=${PEERS_DIR:-$HOME/.cache/ctxpod-peers}
OUT=${OUT:-$PEERS_DIR/sdk-small-$(date +%Y%m%d-%H%M%S)}
[[ -d $PEERS ]] || { echo "sdk-small.sh: no bench-peers at $PEERS (set PEERS)" >&2; exit 1; }
mkdir -p "$OUT" "$DIR"
settle() { sync; sleep "${SETTLE_S:-3}"; }
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r of $ROUNDS ($(date +%T))" >&2
  settle
  PEERS=$PEERS timeout 600 "$SDK_PYTHON" "$here/sdk_bench.py" --ctxpod-bin "$CTXPOD_BIN" \
    --api zerocopy --sizes "$SIZE" --batches 1,16,32 --bytes-per-config "$BYTES" \
    --data-root "$DIR" --label "round$r" --jsonl "$OUT/sdk.jsonl" >"$OUT/sdk-$r.log" 2>&1
  for b in 1 16 32; do
    settle
    timeout 600 "$CTXPOD_BIN" bench --dir "$DIR" --protocol cxp1 --sizes "${SIZE}iB" \
      --batch "$b" --concurrency 1 --bytes "${BYTES}iB" --device-bytes 256MiB --limits-bytes 0 \
      --json "$OUT/rust-$r-b$b.jsonl" >"$OUT/rust-$r-b$b.log" 2>&1
  done
  settle
  (cd "$PEERS" && BENCHES=redis SIZES="$SIZE" BATCHES=1,16,32 RD_BYTES="$BYTES" \
    WARMUP_BYTES=64M PEERS_DIR="$PEERS_DIR" bash run_peers.sh) >"$OUT/redis-$r.log" 2>&1
  last=$(ls -1d "$PEERS_DIR"/results/2* | tail -1)
  cp "$last/results.jsonl" "$OUT/redis-$r.jsonl"
done
python3 "$here/sdk-small-report.py" "$OUT" | tee "$OUT/report.md"
