#!/usr/bin/env bash
# Call K (what the budget allows): the throughput section, this code (per-thread hand-over) and
# 1781f08 (base/peers), one process each, with the 8 × 8 diagnostic sides.
set -u
cd "$(dirname "$0")"
R="$OUT/r"; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
for v in new base; do
  b=bin/peers; [ $v = base ] && b=base/peers
  PEERS_ONLY=throughput PEERS_REPS=2 PEERS_ITEMS=300 timeout 50 "$b" > "$R/thr-$v.md" 2>&1
  echo "THROUGHPUT $v STATUS $? at $SECONDS s"; tar czf "$OUT/results.tgz" -C "$R" .
  grep -A9 "^## 8 threads" "$R/thr-$v.md" | grep "^| ours\|^| raw" | cut -d'|' -f2,3,4
done
