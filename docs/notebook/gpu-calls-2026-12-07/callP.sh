#!/usr/bin/env bash
# Call P (eleventh session): bin = a559640 (no query gap inside the learned window of long work),
# prev = dd2ddd9 (before it). Steps, results packed after each:
#   run: the GPU tests of bin (GPU torture 10 s);
#   lat: latency, prev and bin alternating, 3 processes each (600 samples, 30 at 20 ms, 2 reps);
#   thr: throughput, prev and bin alternating, 3 processes each (3 reps);
#   host: host functions, bin and prev, one process each (5 reps).
set -u
cd "$(dirname "$0")"
t0=$SECONDS
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
late() { [ $((SECONDS-t0)) -gt ${LATE:-500} ] && echo "SKIP $*" ; }
gputests() { late run && return; GPU_TORTURE_SECONDS=10 OUT="$R/run" timeout 120 ./run > "$R/run-console.log" 2>&1; echo "RUN STATUS $? at $((SECONDS-t0)) s"; pack
  grep -h "test result" "$R"/run/*.log | sed 's/finished in.*//' | sort | uniq -c
  grep -h "FAILED\|panicked" "$R"/run/*.log | grep -v "differs on the real driver" | head -20; }
i=0
step() { # BUILD NAME TIMEOUT ENV...
  local build=$1 name=$2 limit=$3; shift 3
  late "$name $build" && return
  i=$((i+1)); local f="$R/$i-$name-$build.md"
  env "$@" timeout "$limit" "$build/peers" > "$f" 2>&1
  echo "$i $name $build STATUS $? at $((SECONDS-t0)) s"; pack
  case $name in
    lat) grep -E "^\| [0-9.]+ (µs|ms) \| (raw|cuda-async 0.5 future \(|ours: CompletionMode::(Auto|LowLatency).completion\(&stream\) \|)" "$f" | cut -d'|' -f2,3,5,6,8 | sed 's/CompletionMode:://; s/.completion(&stream)//; s/raw floor: cuEventQuery spin on an event recorded after the wait/floor/' | cut -c1-110 ;;
    thr) grep -A8 "^## 64 streams\|^## 8 threads" "$f" | grep "^| ours\|^| raw\|^| cuda" | cut -d'|' -f2,3,4 | cut -c1-90 ;;
    host) grep "^| " "$f" | tail -4 | cut -d'|' -f2,3,4,5 | cut -c1-120 ;;
  esac; }
gputests
for k in 1 2 3; do
  step prev lat 40 PEERS_ONLY=latency PEERS_SAMPLES=600 PEERS_SAMPLES_LONG=30 PEERS_REPS=2
  step bin lat 40 PEERS_ONLY=latency PEERS_SAMPLES=600 PEERS_SAMPLES_LONG=30 PEERS_REPS=2
done
for k in 1 2 3; do
  step prev thr 35 PEERS_ONLY=throughput PEERS_REPS=3
  step bin thr 35 PEERS_ONLY=throughput PEERS_REPS=3
done
step bin host 40 PEERS_ONLY=host PEERS_REPS=5
step prev host 40 PEERS_ONLY=host PEERS_REPS=5
echo "DONE at $((SECONDS-t0)) s"
