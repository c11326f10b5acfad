#!/usr/bin/env bash
# Call T (eleventh session): the library as it ends the session (f554866, 1bcb936, ba3d4f2 after
# a559640): the GPU tests (GPU torture 10 s), then the latency section once.
set -u
cd "$(dirname "$0")"
t0=$SECONDS
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
GPU_TORTURE_SECONDS=10 OUT="$R/run" timeout 130 ./run > "$R/run-console.log" 2>&1; echo "RUN STATUS $? at $((SECONDS-t0)) s"; pack
grep -h "test result" "$R"/run/*.log | awk '{p+=$4; f+=$6} END {print "passed", p, "failed", f}'
grep -h "FAILED\|panicked" "$R"/run/*.log | grep -v "differs on the real driver" | head -20
f="$R/lat.md"
PEERS_ONLY=latency PEERS_SAMPLES=600 PEERS_SAMPLES_LONG=30 PEERS_REPS=2 timeout 45 bin/peers > "$f" 2>&1
echo "lat STATUS $? at $((SECONDS-t0)) s"; pack
grep -E "^\| [0-9.]+ (µs|ms) \| (raw|cuda-async|ours: CompletionMode::(Auto|LowLatency))" "$f" | cut -d'|' -f2,3,5,6,8 | sed 's/CompletionMode:://; s/.completion(&stream)//; s/: cuEventQuery spin on an event recorded after the wait//; s/: a word the stream writes after the wait, spun on//' | cut -c1-110
echo "DONE at $((SECONDS-t0)) s"
