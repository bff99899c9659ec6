#!/usr/bin/env bash
# The HTTP contract: an independent API fuzzer (schemathesis, from PyPI) runs every operation
# of api/openapi.json against a real node with authentication on, with all its checks
# (server errors, status codes, content types, headers and bodies against the document,
# schema-invalid requests refused, schema-valid ones accepted, 401 without credentials,
# methods, …) and fails on any failure: the document must be exactly as strict as the node.
#
#   CTXPOD_BIN                the node binary (default $CARGO_TARGET_DIR/debug/ctxpod)
#   CTXPOD_VENV               the Python venv (default ~/.cache/ctxpod-venv; schemathesis is
#                             installed into it at the pinned version)
#   CTXPOD_CONTRACT_EXAMPLES  cases per operation and phase (default 100: ~4,100 cases, about
#                             a minute on 2 cores; 300: ~9,700 cases, 3 to 6 minutes)
#   CTXPOD_CONTRACT_SEED      the generator's seed (default 1; any other value explores anew)
#   CTXPOD_CONTRACT_REPORT    where the JUnit report goes (default $CARGO_TARGET_DIR/contract)
#   CTXPOD_CONTRACT_ARGS      extra schemathesis arguments (e.g. --include-path-regex blocks)
#
# No hooks: schemathesis sends only what it generates from the document. scripts/contract.toml
# gives the event stream a 0.5 s read. It also allows one refusal on each of five operations
# whose rule JSON Schema cannot state and the document does: a CRC header that must match
# the body (422, on a block's PUT and an upload part's), a body that must be a CXB1 frame (400), If-None-Match: * on a namespace
# that exists (412), and a Range past the stored value's end (416). Nothing else is relaxed.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
target="${CARGO_TARGET_DIR:-$HOME/.cache/ctxpod-target}"
bin="${CTXPOD_BIN:-$target/debug/ctxpod}"
venv="${CTXPOD_VENV:-$HOME/.cache/ctxpod-venv}"
examples="${CTXPOD_CONTRACT_EXAMPLES:-100}"
seed="${CTXPOD_CONTRACT_SEED:-1}"
report="${CTXPOD_CONTRACT_REPORT:-$target/contract}"
schemathesis_version=4.32.5

[ -x "$bin" ] || { echo "contract: no ctxpod binary at $bin (set CTXPOD_BIN)" >&2; exit 1; }
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "schemathesis==$schemathesis_version"
py="$venv/bin/python"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/ctxpod-contract.XXXXXX")"
node_pid=""
st_pid=""
# SIGTERM, up to 10 s to go, then SIGKILL.
stop() {
  local pid=$1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  stop "$st_pid"
  stop "$node_pid"
  if [ "$rc" -ne 0 ] && [ -f "$tmp/node.log" ]; then
    echo "contract: the node's log (last 40 lines):" >&2
    tail -n 40 "$tmp/node.log" >&2 || true
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A node with authentication on (a token directory holding one admin token), on free
# loopback ports (port 0: the node writes the address it took to <data_dir>/ctxpod.addr),
# a small file device, and every reference sampled so that the live curve has some.
"$bin" token create --id contract-admin --role admin --dir "$tmp/tokens" \
  >"$tmp/admin.token" 2>"$tmp/token.log" || { cat "$tmp/token.log" >&2; exit 1; }
token="$(cat "$tmp/admin.token")"
cat >"$tmp/node.toml" <<EOF
data_dir = "$tmp/data"
listen = "127.0.0.1:0"
transfer_listen = "127.0.0.1:0"
capacity = "256MiB"
dram = "16MiB"
mrc_sample_rate = 1.0
log = "warn"
[auth]
tokens_dir = "$tmp/tokens"
EOF
"$bin" serve --config "$tmp/node.toml" >/dev/null 2>"$tmp/node.log" &
node_pid=$!

base="$("$py" - "$tmp/data/ctxpod.addr" "$node_pid" <<'EOF'
import os, sys, time, urllib.request
addr_file, pid = sys.argv[1], int(sys.argv[2])
end = time.monotonic() + 60
while True:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("contract: the node exited before serving")
    try:
        a = open(addr_file).read()
        if a.endswith("\n"):
            base = "http://" + a.strip()
            if urllib.request.urlopen(base + "/readyz", timeout=2).status == 200:
                print(base)
                break
    except OSError:
        pass
    if time.monotonic() > end:
        sys.exit("contract: the node was not ready within 60 s")
    time.sleep(0.1)
EOF
)"
echo "contract: node at $base (pid $node_pid), schemathesis $schemathesis_version," \
  "$examples examples per operation, seed $seed"

# One block written and read, so that a plan from the live curve has references to plan from.
"$py" - "$base" "$token" <<'EOF'
import sys, urllib.request
base, token = sys.argv[1], sys.argv[2]
url = base + "/v1/namespaces/default/blocks/00ff"
for method, body in (("PUT", b"contract seed block"), ("GET", None)):
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"Authorization": "Bearer " + token})
    urllib.request.urlopen(req, timeout=10).read()
EOF

mkdir -p "$report"
# Run from the temp dir: schemathesis keeps state (.schemathesis/) in its working directory.
# In the background and waited for, so that a signal to this script stops it at once.
# One worker: hypothesis calls ast.parse, which in threads trips CPython 3.11.7's "AST
# constructor recursion depth mismatch" (a tool error, not a finding); one is fast enough.
(
  cd "$tmp"
  unset SCHEMATHESIS_HOOKS
  exec "$venv/bin/schemathesis" --config-file "$repo/scripts/contract.toml" \
      run "$repo/api/openapi.json" \
      --url "$base" \
      --header "Authorization: Bearer $token" \
      --checks all \
      --phases examples,coverage,fuzzing,stateful \
      --max-examples "$examples" \
      --seed "$seed" \
      --workers 1 \
      --request-timeout 30 \
      --generation-database none \
      --no-color \
      --report junit --report-junit-path "$report/contract-junit.xml" \
      ${CTXPOD_CONTRACT_ARGS:-}
) &
st_pid=$!
set +e
wait "$st_pid"
rc=$?
set -e
st_pid=""

# The node must have come through it: alive, healthy, and no handler panicked.
alive=0
kill -0 "$node_pid" 2>/dev/null && alive=1
if [ "$alive" -ne 1 ]; then
  echo "contract: FAILED: the node died during the run" >&2
  rc=1
elif ! "$py" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/healthz", timeout=5)' "$base"; then
  echo "contract: FAILED: the node no longer answers /healthz" >&2
  rc=1
fi
if grep -q "panicked" "$tmp/node.log"; then
  echo "contract: FAILED: a handler panicked:" >&2
  grep -A3 "panicked" "$tmp/node.log" | head -n 20 >&2
  rc=1
fi
if [ "$rc" -eq 0 ]; then
  echo "contract: passed (report: $report/contract-junit.xml)"
else
  echo "contract: FAILED (schemathesis or the node; report: $report/contract-junit.xml)" >&2
fi
exit "$rc"
