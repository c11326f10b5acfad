#!/usr/bin/env bash
# Call O (eleventh session): the watcher's query gap while it spins (PollerSettings::query_gap,
# 5 us by default) against Auto's latency after 2 ms and 20 ms and against throughput. bin =
# dd2ddd9; PEERS_POLLER=gap=N (us) per process, the default (gap=5) alternating with gap=0 and 1.
set -u
cd "$(dirname "$0")"
t0=$SECONDS
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
i=0
step() { # NAME GAP TIMEOUT ENV...
  local name=$1 gap=$2 limit=$3; shift 3
  i=$((i+1)); local f="$R/$i-$name-gap$gap.md"
  env PEERS_POLLER=gap=$gap "$@" timeout "$limit" bin/peers > "$f" 2>&1
  echo "$i $name gap=$gap STATUS $? at $((SECONDS-t0)) s"; pack
  case $name in
    lat) grep -E "^\| [0-9.]+ (µs|ms) \| (raw|cuda-async 0.5 future \(|ours: CompletionMode::(Auto|LowLatency).completion\(&stream\) \|)" "$f" | cut -d'|' -f2,3,5,6,8 | sed 's/CompletionMode:://; s/.completion(&stream)//' | cut -c1-130 ;;
    thr) grep -A8 "^## 64 streams\|^## 8 threads" "$f" | grep "^| ours\|^| raw\|^| cuda" | cut -d'|' -f2,3,4 | cut -c1-90 ;;
  esac; }
for k in 1 2; do
  for g in 5 0 1; do step lat $g 40 PEERS_ONLY=latency PEERS_SAMPLES=600 PEERS_SAMPLES_LONG=30 PEERS_REPS=2; done
done
for k in 1 2; do
  for g in 5 0; do step thr $g 35 PEERS_ONLY=throughput PEERS_REPS=3; done
done
echo "DONE at $((SECONDS-t0)) s"
