#!/usr/bin/env python3
"""Summarise a `ctxpod bench --perf` profile: CPU samples per process, and the top
symbols of each, as shares of all samples (both CPUs). Usage:

    python3 bench/perf-summary.py /tmp/perf/GET-hot--DRAM--1MiB.data [--top 15] [--groups]

Processes are told apart by pid; the bench client is the `ctxpod` process whose child is
the node (`ctxpod serve`). Kernel symbols are kept (copies into and out of sockets show as
`copy_user_*`/`_copy_to_iter`), idle (pid 0) is reported as one line.
"""
import argparse
import collections
import re
import subprocess
import sys

# Buckets for --groups, first match wins (symbol regexes).
GROUPS = [
    ("AES-GCM", r"aes_gcm|aesni|gcm_|ghash"),
    ("CRC32C", r"crc32c|crc_u64"),
    ("socket copies (kernel)", r"_copy_to_iter|_copy_from_iter|copy_user|skb_copy|__skb_datagram_iter"),
    ("memcpy / memcmp (user)", r"memmove|memcpy|memcmp|memset"),
    ("page faults and zeroing", r"page_fault|clear_page|handle_mm_fault|do_anonymous_page|memcg|lruvec|folio|alloc_pages|pte_"),
    ("allocator", r"malloc|_int_free|cfree|free@|realloc|mallo|tcache|arena|_int_malloc|sdallocx|je_"),
    ("RocksDB index", r"rocksdb|Rocksdb|leveldb|Bloom|MemTable|SkipList|InlineSkipList"),
    ("io_uring and block layer", r"io_uring|io_submit|io_issue|blk_|bio_|gup_|iomap|nvme|virtio|iowrite|ext4|dio"),
    ("TCP/IP stack", r"tcp_|ip_|skb|sock|inet|__dev_queue|netif|napi|softirq|net_rx"),
    ("kernel scheduler, wakeups, syscalls", r"finish_task_switch|schedule|spin_unlock|spin_lock|futex|try_to_wake|wake_up|enqueue|dequeue|select_task|pick_next|update_curr|__switch_to|ttwu|epoll|irqentry|syscall|entry_SYSCALL|do_syscall|sched_yield|exit_to_user|fdget|rcu_read|read_tsc|clock_gettime"),
    ("tokio and thread hand-offs (user)", r"tokio::|parking_lot|park|Condvar|mpmc|crossbeam|futures_util|futures_core|std::sys::|pthread|__rust_begin_short_backtrace|call_once"),
    ("ctxpod's own code, hashing, metrics", r"ctxpod|hashbrown|hash::|Hasher|prometheus|bytes::|alloc::|core::"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--groups", action="store_true",
                    help="bucket each process's samples by kind of work instead of by symbol")
    a = ap.parse_args()
    out = subprocess.run(
        ["perf", "script", "-i", a.data, "-F", "pid,tid,comm,ip,sym"],
        capture_output=True, text=True, check=True).stdout
    per_pid = collections.Counter()
    per_sym = collections.defaultdict(collections.Counter)
    threads = collections.defaultdict(collections.Counter)
    total = 0
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 2:
            continue
        comm, pidtid = parts[0], parts[1]
        if "/" not in pidtid:
            # comm may hold a space ("tokio-rt-worker" does not, but be safe)
            continue
        pid = int(pidtid.split("/")[0])
        # the rest is "<ip> <symbol>"
        rest = parts[2].split(None, 1) if len(parts) > 2 else []
        sym = rest[1].strip() if len(rest) > 1 else "[unknown]"
        total += 1
        per_pid[pid] += 1
        per_sym[pid][sym] += 1
        threads[pid][comm] += 1
    if not total:
        sys.exit("no samples")
    print(f"{total} samples")
    for pid, n in per_pid.most_common():
        if n * 100 / total < 1:
            continue
        names = ", ".join(f"{c} {k * 100 / n:.0f}%" for c, k in threads[pid].most_common(4))
        print(f"\npid {pid}: {n * 100 / total:.1f} % of samples ({names})")
        if pid == 0:
            continue
        if a.groups:
            buckets = collections.Counter()
            for sym, k in per_sym[pid].items():
                name = next((g for g, rx in GROUPS if re.search(rx, sym)), "other")
                buckets[name] += k
            for name, k in buckets.most_common():
                print(f"  {k * 100 / total:5.1f} %  {name}")
            continue
        for sym, k in per_sym[pid].most_common(a.top):
            print(f"  {k * 100 / total:5.1f} %  {sym[:110]}")


if __name__ == "__main__":
    main()
