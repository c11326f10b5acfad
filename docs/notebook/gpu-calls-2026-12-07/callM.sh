#!/usr/bin/env bash
# Call M (eleventh session): bin = dd2ddd9 (a fresh record-pool segment allocated with the pool's
# lock let go; with 9b99729's retried pops and bdf91d5's reaper clearing), prev = 8a14c6e (before
# the pool change). Steps in priority order, results packed after each:
#   probe: tools/probes/context_stack_pops.cu (does a failed cuCtxPopCurrent pop?);
#   thr:   the throughput section, bin and prev alternating, 4 processes each, 3 repetitions;
#   thrW:  bin with the sampler (PEERS_WAITS=1), 2 repetitions;
#   run:   the GPU tests of bin (GPU torture 10 s);
#   lat:   bin's latency, two processes;
#   host:  host functions, bin and prev alternating, 2 processes each.
set -u
cd "$(dirname "$0")"
t0=$SECONDS
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
late() { [ $((SECONDS-t0)) -gt ${LATE:-470} ] && echo "SKIP $*" ; }
( cd /tmp && nvcc -O2 -o context_stack_pops "$OLDPWD/../tools/probes/context_stack_pops.cu" -lcuda \
    && ./context_stack_pops ) > "$R/context_stack_pops.out" 2>&1
echo "PROBE STATUS $?"; cat "$R/context_stack_pops.out"; pack
i=0
step() { # BUILD NAME TIMEOUT ENV...: BUILD/peers with ENV into $R/N-NAME-BUILD.md
  local build=$1 name=$2 limit=$3; shift 3
  late "$name $build" && return
  i=$((i+1)); local f="$R/$i-$name-$build.md"
  env "$@" timeout "$limit" "$build/peers" > "$f" 2>&1
  echo "$i $name $build STATUS $? at $((SECONDS-t0)) s"; pack
  case $name in
    thr) grep -A8 "^## 64 streams\|^## 8 threads" "$f" | grep "^| ours\|^| raw\|^| cuda" | cut -d'|' -f2,3,4 | cut -c1-90 ;;
    host) grep "^| " "$f" | tail -4 | cut -d'|' -f2,3,4,5 | cut -c1-120 ;;
    lat) grep -E "^\| (raw|cuda-async|ours)" "$f" | cut -d'|' -f2,3,5,6,8 | cut -c1-150 ;;
  esac; }
for k in 1 2 3 4; do
  step prev thr 35 PEERS_ONLY=throughput PEERS_REPS=3
  step bin thr 35 PEERS_ONLY=throughput PEERS_REPS=3
done
step bin thrW 45 PEERS_WAITS=1 PEERS_ONLY=throughput PEERS_REPS=2
grep "enqueuing threads per item\|next_segment" "$R/$i-thrW-bin.md" | cut -c1-220
gputests() { late run && return; GPU_TORTURE_SECONDS=10 OUT="$R/run" timeout 120 ./run > "$R/run-console.log" 2>&1; echo "RUN STATUS $? at $((SECONDS-t0)) s"; pack
  grep -h "test result" "$R"/run/*.log | sed 's/finished in.*//' | sort | uniq -c
  grep -h "FAILED\|panicked" "$R"/run/*.log | grep -v "differs on the real driver" | head -20; }
gputests
step bin lat 40 PEERS_ONLY=latency PEERS_SAMPLES=600 PEERS_SAMPLES_LONG=30 PEERS_REPS=2
step bin lat 40 PEERS_ONLY=latency PEERS_SAMPLES=600 PEERS_SAMPLES_LONG=30 PEERS_REPS=2
for k in 1 2; do
  step prev host 40 PEERS_ONLY=host PEERS_REPS=5
  step bin host 40 PEERS_ONLY=host PEERS_REPS=5
done
echo "DONE at $((SECONDS-t0)) s"
