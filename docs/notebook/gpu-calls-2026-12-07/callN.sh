#!/usr/bin/env bash
# Call N (eleventh session): is making events what the 8 x 8 enqueuing threads wait for now?
# bin = dd2ddd9; bigfree = dd2ddd9 with pools.rs' MAX_FREE = 1 << 20 (a pool keeps every free
# event). Both with the watcher's idle exit at 10 s (PEERS_POLLER=idle=10000000), so the pools
# live across the repetitions: from the second on, bigfree makes no event, bin makes those beyond
# 4,096 kept. thrk: the throughput section, 4 repetitions; thrkW: the same sampled, 3.
set -u
cd "$(dirname "$0")"
t0=$SECONDS
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
unset CUDA_DL_SYS_LIBRARY CUDA_DL_SYS_PER_THREAD_DEFAULT_STREAM
i=0
step() { # BUILD NAME TIMEOUT ENV...
  local build=$1 name=$2 limit=$3; shift 3
  i=$((i+1)); local f="$R/$i-$name-$build.md"
  env PEERS_POLLER=idle=10000000 PEERS_ONLY=throughput "$@" timeout "$limit" "$build/peers" > "$f" 2>&1
  echo "$i $name $build STATUS $? at $((SECONDS-t0)) s"; pack
  grep "8 threads.*per repetition" "$f" | sed 's/8 threads × 8 streams (the aggregate): items\/s, //' | cut -c1-150
  grep "enqueuing threads per item" "$f" | cut -c1-200; }
for k in 1 2; do
  step bin thrk 40 PEERS_REPS=4
  step bigfree thrk 40 PEERS_REPS=4
done
step bigfree thrkW 50 PEERS_REPS=3 PEERS_WAITS=1
step bin thrkW 50 PEERS_REPS=3 PEERS_WAITS=1
echo "DONE at $((SECONDS-t0)) s"
