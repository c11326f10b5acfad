#!/usr/bin/env bash
# Call K2 (short budget): steps in priority order, results packed after each (a timeout keeps
# what is done). thr: throughput; lat: latency. bin = this code (fb9fdd0), nopause = 0c79e73
# without b33095d's regular pauses... see the notebook for each build.
set -u
cd "$(dirname "$0")"
t0=$SECONDS
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
i=0
thr() { i=$((i+1)); PEERS_ONLY=throughput PEERS_REPS=3 timeout 30 "$1/peers" > "$R/thr-$i-$1.md" 2>&1
  echo "THR $i $1 STATUS $? at $((SECONDS-t0)) s"
  grep -A6 "^## 64 streams\|^## 8 threads" "$R/thr-$i-$1.md" | grep "^| ours\|^| raw\|^| cuda" | cut -d'|' -f2,3,4; pack; }
lat() { i=$((i+1)); PEERS_ONLY=latency PEERS_SAMPLES=600 PEERS_SAMPLES_LONG=30 PEERS_REPS=2 timeout 30 "$1/peers" > "$R/lat-$i-$1.md" 2>&1
  echo "LAT $i $1 STATUS $? at $((SECONDS-t0)) s"
  grep -E "raw floor|cuda-async 0.5 future \(|ours: CompletionMode::(Auto|LowLatency)\.completion\(&stream\) \|" "$R/lat-$i-$1.md" | cut -d'|' -f2,3,5,6,8; pack; }
thr bin; thr nopause; thr old; lat bin; thr bin; thr nopause; thr old; thr bigfree; thr new2
lat nopause; lat old
GPU_TORTURE_SECONDS=10 OUT="$R/run" timeout 110 ./run > "$R/run-console.log" 2>&1; echo "RUN STATUS $? at $((SECONDS-t0)) s"; pack
grep -h "test result" "$R"/run/*.log | sed 's/finished in.*//' | sort | uniq -c
grep -h "FAILED\|panicked" "$R"/run/*.log | grep -v "differs on the real driver" | head -20
