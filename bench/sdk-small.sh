#!/usr/bin/env bash
# The SDK's small reads beside Redis and the Rust client, in interleaved rounds (issue #35):
# per round, hot GETs of SIZE blocks (default 64K) at batches 1, 16 and 32
#   1. through the Python SDK, zero-copy API (bench/sdk_bench.py: register_buffer and
#      batch_get_into(keys, ptrs, sizes), one call at a time, every byte checked);
#   2. through ctxpod's Rust client over CXP1 at the same depth (`ctxpod bench --batch B
#      --concurrency 1`: one request in flight);
#   3. Redis without persistence, redis-py with hiredis (../shared/bench-peers).
# With SHARED_TOO=1 the SDK runs a second time per round with its direct connections off
# (Store.connect(direct_connections=0)), for the ratio direct / shared.
# Then bench/sdk-small-report.py OUT prints per batch the medians and the per-round ratios
# SDK / Redis and SDK / Rust (and direct / shared). About a minute a round here.
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
  # The SDK as shipped; with SHARED_TOO=1 also with its direct connections off (every call
  # over the shared connection), the two in alternating order from round to round.
  arms=(direct)
  [[ ${SHARED_TOO:-0} == 1 ]] && { ((r % 2)) && arms=(direct shared) || arms=(shared direct); }
  for arm in "${arms[@]}"; do
    settle
    label=round$r extra=()
    [[ $arm == shared ]] && { label=round$r-shared; extra=(--direct-connections 0); }
    PEERS=$PEERS timeout 600 "$SDK_PYTHON" "$here/sdk_bench.py" --ctxpod-bin "$CTXPOD_BIN" \
      --api zerocopy --sizes "$SIZE" --batches 1,16,32 --bytes-per-config "$BYTES" \
      --data-root "$DIR" --label "$label" --jsonl "$OUT/sdk.jsonl" "${extra[@]}" \
      >"$OUT/sdk-$r-$arm.log" 2>&1
  done
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
