#!/usr/bin/env bash
# Call K3 (callK2 with the host-function section added). Builds: bin = 93aacc7 (a dry pool's
# events made with the pools' lock let go); prev = 6d41da8 (before it); refill = 6d41da8 with an
# enqueue taking 32 events per take of the pools' lock into its stash (not kept: /tmp/refill.patch);
# bigfree = 6d41da8 with MAX_FREE 1 << 20; nopause, old, new2 as in callK2.sh.: steps in priority order, results packed after each (a timeout keeps
# what is done). thr: throughput; thrk: throughput with the pools kept between repetitions;
# lat: latency. Builds (each FOLDER/peers; docs/notebook/2026-12-07-peers-9.md says how to make
# them): bin = this code; nopause = 0c79e73 without b33095d's regular pauses (learned_wait's
# `adjust` not extending a pause to the first window); old = afb1988; new2 = 0c79e73 + the slot
# changes of fb9fdd0 alone; bigfree = fb9fdd0 with pools.rs' MAX_FREE = 1 << 20.
set -u
cd "$(dirname "$0")"
t0=$SECONDS
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
i=0
late() { [ $((SECONDS-t0)) -gt ${LATE:-470} ] && echo "SKIP $*" ; }
thr() { late thr $1 && return; i=$((i+1)); PEERS_ONLY=throughput PEERS_REPS=3 timeout 30 "$1/peers" > "$R/thr-$i-$1.md" 2>&1
  echo "THR $i $1 STATUS $? at $((SECONDS-t0)) s"
  grep -A6 "^## 64 streams\|^## 8 threads" "$R/thr-$i-$1.md" | grep "^| ours\|^| raw\|^| cuda" | cut -d'|' -f2,3,4; pack; }
# The 8 × 8 row with the pools kept between repetitions (PEERS_POLLER idle=10 s): with bigfree
# (MAX_FREE 2^20) the later repetitions make no events; beside bin, the share of event making.
thrk() { late thrk $1 && return; i=$((i+1)); PEERS_POLLER=idle=10000000 PEERS_ONLY=throughput PEERS_REPS=4 timeout 40 "$1/peers" > "$R/thrk-$i-$1.md" 2>&1
  echo "THRK $i $1 STATUS $? at $((SECONDS-t0)) s"
  grep -A8 "^## 8 threads" "$R/thrk-$i-$1.md" | grep "^| ours\|^| raw" | cut -d'|' -f2,3,4; grep "per repetition" "$R/thrk-$i-$1.md" | grep "8 threads" | cut -c1-160; pack; }
lat() { late lat $1 && return; i=$((i+1)); PEERS_ONLY=latency PEERS_SAMPLES=600 PEERS_SAMPLES_LONG=30 PEERS_REPS=2 timeout 30 "$1/peers" > "$R/lat-$i-$1.md" 2>&1
  echo "LAT $i $1 STATUS $? at $((SECONDS-t0)) s"
  grep -E "raw floor|cuda-async 0.5 future \(|ours: CompletionMode::(Auto|LowLatency)\.completion\(&stream\) \|" "$R/lat-$i-$1.md" | cut -d'|' -f2,3,5,6,8; pack; }
host() { late host $1 && return; i=$((i+1)); PEERS_ONLY=host PEERS_REPS=5 timeout 40 "$1/peers" > "$R/host-$i-$1.md" 2>&1
  echo "HOST $i $1 STATUS $? at $((SECONDS-t0)) s"; grep "^| " "$R/host-$i-$1.md" | tail -8 | cut -c1-150; pack; }
gputests() { late run && return; GPU_TORTURE_SECONDS=10 OUT="$R/run" timeout 100 ./run > "$R/run-console.log" 2>&1; echo "RUN STATUS $? at $((SECONDS-t0)) s"; pack
  grep -h "test result" "$R"/run/*.log | sed 's/finished in.*//' | sort | uniq -c
  grep -h "FAILED\|panicked" "$R"/run/*.log | grep -v "differs on the real driver" | head -20; }
thr prev; thr bin; thr refill; thr old; lat bin; host bin; gputests
thr prev; thr bin; thr refill; thr old; lat old; thrk bigfree; thrk prev; lat prev; thr nopause; lat nopause; host prev
