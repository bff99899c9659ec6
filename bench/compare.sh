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
# working tree, uncommitted changes included), or the path of a `ctxpod` binary. For small
# effects compare two revisions (commit first): both are then built the same way, and two
# builds of one source built differently have differed by a third on one phase here. BENCH ARGS
# go to every `ctxpod bench` run (default: the three block sizes over CXP1, 1 GiB each).
#
#   ROUNDS=5 bash bench/compare.sh main . -- --protocol cxp1 --sizes 64KiB --bytes 1GiB
#
# Environment: ROUNDS (default 3), OUT (default /tmp/ctxpod-compare: binaries, the
# worktree, each run's output and JSON lines, and report.md), BENCH_DIR (the scratch
# folder the benches write their devices in; default OUT/scratch).
#
# `.` builds into this checkout's $CARGO_TARGET_DIR (default ~/.cache/ctxpod-target).
# Revisions build into their own target folder, COMPARE_TARGET_DIR (default
# ~/.cache/ctxpod-compare-target), never this checkout's: cargo names a workspace's units
# by paths relative to the workspace, so a worktree building into the same folder would
# overwrite this checkout's artifacts and fingerprints and leave its next build stale. The
# first use seeds that folder with the dependencies already built here (RocksDB takes 20
# minutes to build from nothing). Each binary's SHA-256 is printed with what it is.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 2 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
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
    local rev target=${COMPARE_TARGET_DIR:-$HOME/.cache/ctxpod-compare-target}
    rev=$(git -C "$here" rev-parse --verify "$what^{commit}") || {
      echo "compare: $what is neither a binary, '.', nor a git revision" >&2
      exit 2
    }
    if [ ! -e "$out/src/.git" ]; then
      # A worktree whose folder was deleted stays registered until pruned.
      git -C "$here" worktree prune
      git -C "$here" worktree add --detach "$out/src" "$rev" >/dev/null
    else
      git -C "$out/src" checkout -q --detach "$rev"
    fi
    if [ ! -d "$target/debug/deps" ] && [ -d "$CARGO_TARGET_DIR/debug/deps" ]; then
      echo "compare: seeding $target with the dependencies built in $CARGO_TARGET_DIR" >&2
      mkdir -p "$target/debug"
      cp -a "$CARGO_TARGET_DIR/debug/deps" "$CARGO_TARGET_DIR/debug/build" \
        "$CARGO_TARGET_DIR/debug/.fingerprint" "$target/debug/"
      # The workspace's own crates are built again from the worktree's sources.
      rm -rf "$target"/debug/.fingerprint/ctxpod-*
    fi
    echo "compare: building $what ($rev) into $target" >&2
    (cd "$out/src" && CARGO_TARGET_DIR=$target cargo build -q -p ctxpod)
    cp "$target/debug/ctxpod" "$dest/ctxpod"
    echo "$what = $(git -C "$here" log -1 --format='%h %s' "$rev")" >"$dest/what"
  fi
  echo "  (sha256 $(sha256sum "$dest/ctxpod" | cut -c1-16))" >>"$dest/what"
}
build "$a" "$out/A"
build "$b" "$out/B"
echo "compare: A is $(tr '\n' ' ' <"$out/A/what")" >&2
echo "compare: B is $(tr '\n' ' ' <"$out/B/what")" >&2

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
  echo "A: $(tr '\n' ' ' <"$out/A/what")"
  echo "B: $(tr '\n' ' ' <"$out/B/what")"
  echo "bench args: ${args[*]}; $rounds rounds"
  echo
  python3 "$here/bench/compare-report.py" "$out"
} | tee "$out/report.md"
