#!/usr/bin/env bash
# Call R (eleventh session): the latency section with the flag floor (a thread spinning on a
# mapped word the stream writes after the hold, unparked and parked): a559640's library, the
# benchmark of this commit. Three processes.
set -u
cd "$(dirname "$0")"
t0=$SECONDS
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
for k in 1 2 3; do
  f="$R/$k-lat.md"
  PEERS_ONLY=latency PEERS_SAMPLES=600 PEERS_SAMPLES_LONG=30 PEERS_REPS=2 timeout 45 bin/peers > "$f" 2>&1
  echo "$k lat STATUS $? at $((SECONDS-t0)) s"; pack
  grep -E "^\| [0-9.]+ (µs|ms) \| (raw|cuda-async|ours: CompletionMode::(Auto|LowLatency))" "$f" | cut -d'|' -f2,3,5,6 | sed 's/CompletionMode:://; s/.completion(&stream)//; s/: cuEventQuery spin on an event recorded after the wait//; s/: a word the stream writes after the wait, spun on//' | cut -c1-100
done
echo "DONE at $((SECONDS-t0)) s"
