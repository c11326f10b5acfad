#!/usr/bin/env bash
# Call J (the last of the budget): the throughput section, this code (per-thread hand-over) and
# 1781f08 (base/peers), alternating, with the 8 × 8 diagnostic sides; the latency section, this
# code and afb1988; then GPU tests in what is left.
set -u
cd "$(dirname "$0")"
t0=$SECONDS
limit=${LIMIT:-300}
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
i=0
for v in new base; do
  i=$((i+1))
  b=bin/peers; [ $v = base ] && b=base/peers
  PEERS_ONLY=throughput PEERS_REPS=3 PEERS_ITEMS=500 timeout 50 "$b" > "$R/thr-$i-$v.md" 2>&1
  echo "THROUGHPUT $i $v STATUS $? at $((SECONDS-t0)) s"; pack
  grep -A8 "^## 8 threads" "$R/thr-$i-$v.md" | grep "^| ours\|^| raw" | cut -d'|' -f2,3,4
done
i=0
for v in new old; do
  i=$((i+1))
  b=bin/peers; [ $v = old ] && b=old/peers
  PEERS_ONLY=latency PEERS_SAMPLES=500 PEERS_SAMPLES_LONG=25 PEERS_REPS=2 timeout 40 "$b" > "$R/peers-$i-$v.md" 2>&1
  echo "PEERS $i $v STATUS $? at $((SECONDS-t0)) s"; pack
  grep -E "raw floor|cuda-async 0.5 future \(|ours: CompletionMode::(Auto|LowLatency)\.completion\(&stream\) \|" "$R/peers-$i-$v.md" | cut -d'|' -f2,3,5,6,8
done
left=$((limit - (SECONDS - t0)))
if [ $left -gt 90 ]; then
  GPU_TORTURE_SECONDS=15 OUT="$R/run" timeout $((left - 5)) ./run > "$R/run-console.log" 2>&1; echo "RUN STATUS $? at $((SECONDS-t0)) s"; pack
  grep -h "test result" "$R"/run/*.log | sed 's/finished in.*//' | sort | uniq -c
  grep -h "FAILED\|panicked" "$R"/run/*.log | grep -v "differs on the real driver" | head -20
fi
