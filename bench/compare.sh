#!/usr/bin/env bash
# Two builds of ctxpod side by side in one run: `ctxpod bench` of build A and of build B,
# alternating (A B, then B A, …) for ROUNDS rounds so that both see the same drift of a
# virtual disk and a shared machine; then, per phase, the medians of each build and B's
# figure over A's (the median of the per-round ratios, and their range). A change's
# effect is a ratio measured in one run, not two absolutes measured on two days.
#
#   bash bench/compare.sh A B [-- BENCH ARGS]
#
# A and B are each a git revision (built in a worktree under OUT), `.` (this checkout's
# working tree, uncommitted changes included), or the path of a `ctxpod` binary. BENCH ARGS
# go to every `ctxpod bench` run (default: the three block sizes over CXP1, 1 GiB each).
#
#   ROUNDS=5 bash bench/compare.sh main . -- --protocol cxp1 --sizes 64KiB --bytes 1GiB
#
# Environment: ROUNDS (default 3), OUT (default /tmp/ctxpod-compare: binaries, the
# worktree, each run's output and JSON lines, and report.md), BENCH_DIR (the scratch
# folder the benches write their devices in; default OUT/scratch).
#
# Builds share $CARGO_TARGET_DIR (default ~/.cache/ctxpod-target), so a revision's build is
# incremental; because every build links the same `debug/ctxpod`, the script links this
# checkout's own binary back at the end (`cargo build -p ctxpod`, a no-op when fresh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 2 ]; then
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
a=$1 b=$2
shift 2
[ "${1:-}" = "--" ] && shift
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
  args=(--protocol cxp1 --sizes 64KiB,1MiB,4MiB --bytes 1GiB --device-bytes 512MiB --limits-bytes 1GiB)
fi
rounds=${ROUNDS:-3}
out=${OUT:-/tmp/ctxpod-compare}
scratch=${BENCH_DIR:-$out/scratch}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/ctxpod-target}
mkdir -p "$out/A" "$out/B"

# Builds (or copies) the binary of `$1` into `$2/ctxpod` and records what it is.
build() {
  local what=$1 dest=$2
  if [ -f "$what" ] && [ -x "$what" ]; then
    cp "$what" "$dest/ctxpod"
    echo "binary $what" >"$dest/what"
  elif [ "$what" = "." ]; then
    (cd "$here" && cargo build -q -p ctxpod)
    cp "$CARGO_TARGET_DIR/debug/ctxpod" "$dest/ctxpod"
    echo "working tree of $here at $(git -C "$here" rev-parse --short HEAD)$(git -C "$here" diff --quiet HEAD || echo ' + uncommitted changes')" >"$dest/what"
  else
    local rev
    rev=$(git -C "$here" rev-parse --verify "$what^{commit}") || {
      echo "compare: $what is neither a binary, '.', nor a git revision" >&2
      exit 2
    }
    if [ ! -e "$out/src/.git" ]; then
      git -C "$here" worktree add --detach "$out/src" "$rev" >/dev/null
    else
      git -C "$out/src" checkout -q --detach "$rev"
    fi
    echo "compare: building $what ($rev)" >&2
    (cd "$out/src" && cargo build -q -p ctxpod)
    cp "$CARGO_TARGET_DIR/debug/ctxpod" "$dest/ctxpod"
    echo "$what = $(git -C "$here" log -1 --format='%h %s' "$rev")" >"$dest/what"
  fi
}
build "$a" "$out/A"
build "$b" "$out/B"
if [ "$a" != "." ] && [ "$b" != "." ] && [ -f "$here/Cargo.toml" ]; then
  (cd "$here" && cargo build -q -p ctxpod) || true
fi
echo "compare: A is $(cat "$out/A/what")" >&2
echo "compare: B is $(cat "$out/B/what")" >&2

for r in $(seq 1 "$rounds"); do
  order="A B"
  [ $((r % 2)) -eq 0 ] && order="B A"
  for arm in $order; do
    echo "compare: round $r/$rounds, $arm, $(date +%T)" >&2
    rm -rf "$scratch"
    "$out/$arm/ctxpod" bench --dir "$scratch" "${args[@]}" --json "$out/round$r-$arm.jsonl" \
      >"$out/round$r-$arm.txt" 2>&1 || {
      echo "compare: round $r of $arm failed; its output:" >&2
      tail -20 "$out/round$r-$arm.txt" >&2
      exit 1
    }
  done
done
rm -rf "$scratch"
{
  echo "A: $(cat "$out/A/what")"
  echo "B: $(cat "$out/B/what")"
  echo "bench args: ${args[*]}; $rounds rounds"
  echo
  python3 "$here/bench/compare-report.py" "$out"
} | tee "$out/report.md"
