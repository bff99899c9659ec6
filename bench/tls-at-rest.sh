#!/usr/bin/env bash
# TLS + encryption at rest, on vs off (issue #5): 1 MiB blocks, both protocols, four arms
# per protocol (both off, at-rest only, TLS only, both on), each `--repeat 3`, the whole
# sweep ROUNDS times so that the arms interleave as the virtual disk drifts. Results go to
# OUT/round<r>/<protocol>-<arm>.jsonl; summarize with bench/summarize-arms.py OUT.
#
#   ROUNDS=3 bash bench/tls-at-rest.sh /tmp/tls-at-rest      # about 13 minutes
set -euo pipefail
out=${1:-./tls-at-rest}
rounds=${ROUNDS:-3}
bin=${CTXPOD_BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/ctxpod-target}/debug/ctxpod}
scratch=${BENCH_DIR:-$out/scratch}
for r in $(seq 1 "$rounds"); do
  mkdir -p "$out/round$r"
  for p in cxp1 http; do
    for arm in "off:--no-encrypt-at-rest" "at-rest:" "tls:--tls --no-encrypt-at-rest" "tls+at-rest:--tls"; do
      name=${arm%%:*}
      flags=${arm#*:}
      echo "round $r/$rounds: $p $name $(date +%T)" >&2
      # shellcheck disable=SC2086
      "$bin" bench --dir "$scratch" --sizes 1MiB --bytes 1GiB --device-bytes 1GiB --repeat 3 \
        --protocol "$p" $flags --json "$out/round$r/$p-$name.jsonl" >"$out/round$r/$p-$name.txt" 2>&1
    done
  done
done
python3 "$(dirname "$0")/summarize-arms.py" "$out"
