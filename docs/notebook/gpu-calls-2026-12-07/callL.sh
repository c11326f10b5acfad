#!/usr/bin/env bash
# Call L (eleventh session): where the time goes. bin = bdf91d5 (the reaper clears every context
# left on its stack) with the peers benchmark's sampler (PEERS_WAITS=1: benches/peers/src/waits.rs).
# Steps in priority order, results packed after each (a timeout keeps what is done):
#   thrW:  the throughput section, 2 repetitions, the 8 × 8 row's enqueuing threads sampled and
#          their scheduler counters;
#   run:   the GPU tests (GPU torture 5 s);
#   hostW: host functions, 3 repetitions, every thread sampled, the busiest threads;
#   lat:   latency, 600 samples (30 at 20 ms), 2 repetitions (the parked waiters included);
#   thr, host: the plain sections (no sampler) for the figures.
# The libraries' exported symbols go along (nm -D) to name the sampled frames here
# (benches/peers/symbolize-waits).
set -u
cd "$(dirname "$0")"
t0=$SECONDS
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
for f in /usr/local/nvidia/lib64/libcuda.so.5* /usr/lib/x86_64-linux-gnu/libcuda.so.5* \
         /lib/x86_64-linux-gnu/libc.so.6 /usr/lib/x86_64-linux-gnu/libc.so.6; do
  [ -f "$f" ] && nm -D --defined-only "$f" > "$R/$(basename "$f").nm" 2>/dev/null
done
ls -la "$R"
late() { [ $((SECONDS-t0)) -gt ${LATE:-470} ] && echo "SKIP $*" ; }
step() { # NAME TIMEOUT ENV...: bin/peers with ENV into $R/NAME.md
  local name=$1 limit=$2; shift 2
  late "$name" && return
  env "$@" timeout "$limit" bin/peers > "$R/$name.md" 2>&1
  echo "$name STATUS $? at $((SECONDS-t0)) s"; pack; }
step thrW 45 PEERS_WAITS=1 PEERS_ONLY=throughput PEERS_REPS=2
grep -A8 "^## 8 threads" "$R/thrW.md" | grep "^| ours\|^| raw" | cut -d'|' -f2,3
grep "enqueuing threads per item" "$R/thrW.md" | cut -c1-200
gputests() { late run && return; GPU_TORTURE_SECONDS=5 OUT="$R/run" timeout 110 ./run > "$R/run-console.log" 2>&1; echo "RUN STATUS $? at $((SECONDS-t0)) s"; pack
  grep -h "test result" "$R"/run/*.log | sed 's/finished in.*//' | sort | uniq -c
  grep -h "FAILED\|panicked" "$R"/run/*.log | grep -v "differs on the real driver" | head -20; }
gputests
step hostW 45 PEERS_WAITS=1 PEERS_ONLY=host PEERS_REPS=3
grep "^| " "$R/hostW.md" | tail -5 | cut -c1-150; grep "busiest" "$R/hostW.md" | cut -c1-220
step lat 40 PEERS_ONLY=latency PEERS_SAMPLES=600 PEERS_SAMPLES_LONG=30 PEERS_REPS=2
grep -E "^\| (raw|cuda-async|ours)" "$R/lat.md" | cut -d'|' -f2,3,5,6,8 | cut -c1-160
step thr 35 PEERS_ONLY=throughput PEERS_REPS=3
grep -A8 "^## 64 streams\|^## 8 threads" "$R/thr.md" | grep "^| ours\|^| raw\|^| cuda" | cut -d'|' -f2,3,4
step host 40 PEERS_ONLY=host PEERS_REPS=5
grep "^| " "$R/host.md" | tail -5 | cut -c1-150
echo "DONE at $((SECONDS-t0)) s"
