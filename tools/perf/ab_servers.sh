#!/usr/bin/env bash
# Two trainwatch-server binaries side by side: alternating runs of the same
# load (trainwatch-loadgen from BUILD_DIR, batch 1024, no alert probes), each
# on a fresh temporary database, printing records/s acked and the server's
# CPU (utime + stime from /proc) per acked record. These VMs move by ±15%
# from minute to minute, so compare the pairs, not runs an hour apart.
#
#   tools/perf/ab_servers.sh OLD_SERVER NEW_SERVER [ROUNDS] [STREAMS] [SECONDS] [BUILD_DIR]
#                                                   (defaults: 4, 16, 8, build)
#
# BATCH (1024) sets loadgen's --batch, LOADGEN_ARGS adds to its flags: MoE
# reports as docs/performance.md measures them are
#   BATCH=16 LOADGEN_ARGS="--moe 48x128" tools/perf/ab_servers.sh OLD NEW 3 4 8
#
# For an older commit: git worktree add /tmp/old <rev> && cmake -S /tmp/old
# -B /tmp/old/build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake
# --build /tmp/old/build --target trainwatch-server.
set -euo pipefail
OLD=$1
NEW=$2
ROUNDS=${3:-4}
STREAMS=${4:-16}
SECS=${5:-8}
BUILD=${6:-build}
BATCH=${BATCH:-1024}
read -r -a EXTRA <<<"${LOADGEN_ARGS:-}"
LOADGEN=$BUILD/bin/trainwatch-loadgen
WORK=$(mktemp -d)
SERVER_PID=
cleanup() { [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

# One load against `server`; prints "records/s cpu_us_per_record".
source "$(dirname "${BASH_SOURCE[0]}")/server.sh"

one() {
  local server=$1 db
  db=$(mktemp -d -p "$WORK")
  tw_start_server "$server" "$db/server.log" "$db/ab.db" --max-active-runs 20000
  local grpc=$GRPC metrics=$METRICS runs t0 t1 out acked rate
  runs=$(( STREAMS < 16 ? STREAMS : 16 ))
  t0=$(awk '{print $14 + $15}' "/proc/$SERVER_PID/stat")
  out=$("$LOADGEN" --server "$grpc" --metrics "$metrics" --streams "$STREAMS" --runs "$runs" \
          --batch "$BATCH" --seconds "$SECS" --alert-probes 0 --json "${EXTRA[@]}" | tail -1)
  t1=$(awk '{print $14 + $15}' "/proc/$SERVER_PID/stat")
  kill "$SERVER_PID"
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
  acked=$(sed -n 's/.*"records_acked": \([0-9]*\).*/\1/p' <<<"$out")
  rate=$(sed -n 's/.*"records_per_s": \([0-9.]*\).*/\1/p' <<<"$out")
  # /proc times are in clock ticks (getconf CLK_TCK, 100 here).
  awk -v r="$rate" -v a="$t0" -v b="$t1" -v n="$acked" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%.0f %.3f\n", r, (b - a) / hz * 1e6 / n }'
}

echo "round  old records/s  old us/record  new records/s  new us/record"
for round in $(seq "$ROUNDS"); do
  read -r old_rate old_cpu < <(one "$OLD")
  read -r new_rate new_cpu < <(one "$NEW")
  printf "%5d  %13s  %13s  %13s  %13s\n" "$round" "$old_rate" "$old_cpu" "$new_rate" "$new_cpu"
done
