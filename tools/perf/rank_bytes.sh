#!/usr/bin/env bash
# Bytes on disk per rank-record of a many-rank run, with the non-lead ranks
# kept whole (--rank-records full) and as digests (digest, the default), side
# by side on the same load: trainwatch-loadgen --ranks RANKS --steps STEPS
# sends each rank's record every step (global norm, clip, shard_sq_sum, loss,
# lr, step time, data wait) a record a batch, as trainers at a step a second
# do, only faster (--step-seconds). Each side runs a fresh server on a fresh
# file; the file's growth over the empty schema is measured after a clean
# stop (the WAL checkpointed into it). The merged figure is what a record
# costs once its stream's chunks are merged (a long run's steady state): the
# blob bytes of rank > 0 chunks of more than one record over their records.
#
#   tools/perf/rank_bytes.sh [BUILD_DIR] [RANKS] [STEPS] [STEP_SECONDS]
#                            (defaults: build, 64, 3000, 0.002)
#
# Prints a line per side and the ratio, then one JSON object as the last line.
set -euo pipefail
BUILD=${1:-build}
RANKS=${2:-64}
STEPS=${3:-3000}
STEP_SECONDS=${4:-0.002}
BIN=$BUILD/bin
WORK=$(mktemp -d)
SERVER_PID=
cleanup() { [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

start_server() {  # MODE DB; sets SERVER_PID, GRPC
  local log=$WORK/server.log
  : >"$log"
  "$BIN/trainwatch-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --rank-records "$1" --db "$2" >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 100); do grep -q "gRPC on" "$log" && break; sleep 0.1; done
  GRPC=$(sed -n 's/.*gRPC on \([0-9.:]*\),.*/\1/p' "$log" | head -1)
  [[ -n "$GRPC" ]] || { echo "server did not start:"; cat "$log"; exit 1; }
}
stop_server() { kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true; SERVER_PID=; }
file_bytes() { local t=0 f; for f in "$1"*; do t=$(( t + $(stat -c %s "$f") )); done; echo $t; }

declare -A PER_RECORD IN_USE MERGED SMALL
for mode in full digest; do
  db=$WORK/$mode.db
  start_server "$mode" "$db"
  stop_server
  base=$(file_bytes "$db")
  start_server "$mode" "$db"
  "$BIN/trainwatch-loadgen" --server "$GRPC" --ranks "$RANKS" --steps "$STEPS" \
    --step-seconds "$STEP_SECONDS" --json >"$WORK/$mode.json"
  sleep 5  # the writer merges small chunks once its queue is idle
  stop_server
  grown=$(( $(file_bytes "$db") - base ))
  PER_RECORD[$mode]=$(awk -v b="$grown" -v n=$(( RANKS * STEPS )) 'BEGIN { printf "%.1f", b / n }')
  # Pages freed by merges are reused by later writes but stay in the file.
  free=$(( $(sqlite3 "$db" "PRAGMA freelist_count") * $(sqlite3 "$db" "PRAGMA page_size") ))
  IN_USE[$mode]=$(awk -v b="$(( grown - free ))" -v n=$(( RANKS * STEPS )) 'BEGIN { printf "%.1f", b / n }')
  MERGED[$mode]=$(sqlite3 "$db" "SELECT printf('%.1f', 1.0 * sum(length(records)) / sum(n))
                                 FROM step_chunks WHERE rank > 0 AND n > 1")
  SMALL[$mode]=$(sqlite3 "$db" "SELECT count(*) FROM step_chunks WHERE n = 1")
  echo "$mode: $RANKS ranks x $STEPS steps, file ${PER_RECORD[$mode]} bytes a rank-record" \
       "(${IN_USE[$mode]} in use, ${SMALL[$mode]} one-record chunks left);" \
       "a non-lead record in merged chunks ${MERGED[$mode]} bytes"
done
RATIO=$(awk -v a="${IN_USE[digest]}" -v b="${IN_USE[full]}" 'BEGIN { printf "%.2f", a / b }')
echo "digest / full, bytes in use per rank-record: ${RATIO}x"
echo "{\"ranks\": $RANKS, \"steps\": $STEPS, \"full\": {\"file_bytes_per_record\": ${PER_RECORD[full]}," \
     "\"in_use_bytes_per_record\": ${IN_USE[full]}, \"merged_bytes_per_record\": ${MERGED[full]}}, \"digest\": {\"file_bytes_per_record\": ${PER_RECORD[digest]}," \
     "\"in_use_bytes_per_record\": ${IN_USE[digest]}, \"merged_bytes_per_record\": ${MERGED[digest]}}, \"ratio\": $RATIO}"
