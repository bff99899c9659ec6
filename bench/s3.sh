#!/usr/bin/env bash
# The S3 door beside HTTP API v1 and CXP1 (issue #22): starts a node with authentication on
# and the S3 door on loopback, makes a token with S3 credentials, and runs
# appliance/cli/examples/s3_bench.rs (PUT then GET of COUNT blocks of 64 KiB, 1 MiB and 4 MiB
# through each, CONCURRENCY in flight). docs/PERFORMANCE.md has a run.
#   COUNT=256 CONCURRENCY=8 bash bench/s3.sh
#   SIZES=33554432 COUNT=32 CONCURRENCY=4 bash bench/s3.sh   (large values: 32 MiB each)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ctxpod-target}"
cargo build --quiet --workspace --bins --examples
bin="$CARGO_TARGET_DIR/debug/ctxpod"
dir=$(mktemp -d)
trap 'kill $node 2>/dev/null || true; wait $node 2>/dev/null || true; rm -rf "$dir"' EXIT
out=$("$bin" token create --s3 --id bench --role admin --dir "$dir/tokens" 2>/dev/null)
token=$(echo "$out" | head -1)
ak=$(echo "$out" | sed -n 's/^aws_access_key_id = //p')
sk=$(echo "$out" | sed -n 's/^aws_secret_access_key = //p')
cat > "$dir/node.toml" <<TOML
data_dir = "$dir/data"
listen = "127.0.0.1:0"
transfer_listen = "127.0.0.1:0"
s3_listen = "127.0.0.1:0"
capacity = "${CAPACITY:-8GiB}"
dram = "${DRAM:-2GiB}"
[auth]
tokens_dir = "$dir/tokens"
TOML
CTXPOD_ZERO_FILL=false "$bin" serve --config "$dir/node.toml" >/dev/null 2>"$dir/node.log" &
node=$!
for _ in $(seq 600); do [ -s "$dir/data/ctxpod.addr" ] && break; sleep 0.1; done
http="http://$(cat "$dir/data/ctxpod.addr")"
"$CARGO_TARGET_DIR/debug/examples/s3_bench" --s3 "http://$(cat "$dir/data/ctxpod.s3.addr")" \
  --http "$http" --transfer "$(cat "$dir/data/ctxpod.transfer.addr")" --token "$token" \
  --ak "$ak" --sk "$sk" --count "${COUNT:-256}" --concurrency "${CONCURRENCY:-8}" \
  ${SIZES:+--sizes "$SIZES"}
