#!/usr/bin/env bash
# Soak: the server under a steady load for a long time, sampled every 10 s,
# to show that nothing grows but the data itself.
#
#   tools/perf/soak.sh RATE [MINUTES] [BUILD_DIR] [OUT.csv]
#     RATE: records/s offered over 16 streams (e.g. half the peak of
#           tools/perf/perf_table.sh); MINUTES default 30.
#
# Samples: elapsed s, records stored (trainwatch_ingest_records_total), server
# RSS KiB, open fds, threads, store bytes (db + wal + shm). Prints a summary:
# RSS and fds at 10% of the run and at the end, and store bytes per record.
set -euo pipefail
RATE=${1:?usage: soak.sh RATE [MINUTES] [BUILD_DIR] [OUT.csv]}
MINUTES=${2:-30}
BUILD=${3:-build}
OUT=${4:-soak.csv}
BIN=$BUILD/bin
WORK=$(mktemp -d)
SERVER_PID=; LOAD_PID=
cleanup() {
  [[ -n "$LOAD_PID" ]] && kill "$LOAD_PID" 2>/dev/null
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

source "$(dirname "${BASH_SOURCE[0]}")/server.sh"
tw_start_server "$BIN/trainwatch-server" "$WORK/server.log" "$WORK/soak.db"

SECS=$(( MINUTES * 60 ))
"$BIN/trainwatch-loadgen" --server "$GRPC" --metrics "$METRICS" --streams 16 --runs 16 \
  --batch 1024 --rate "$RATE" --seconds "$SECS" --alert-probes 5 --json >"$WORK/load.out" 2>&1 &
LOAD_PID=$!

echo "elapsed_s,records,rss_kib,fds,threads,store_bytes" >"$OUT"
start=$(date +%s)
while kill -0 "$LOAD_PID" 2>/dev/null; do
  now=$(( $(date +%s) - start ))
  records=$(curl -s "$METRICS" | awk '/^trainwatch_ingest_records_total/ { printf "%d", $2 }')
  rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$SERVER_PID/status")
  threads=$(awk '/^Threads/ { print $2 }' "/proc/$SERVER_PID/status")
  fds=$(ls "/proc/$SERVER_PID/fd" | wc -l)
  store=$(stat -c %s "$WORK"/soak.db* 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
  echo "$now,${records:-0},$rss,$fds,$threads,$store" >>"$OUT"
  sleep 10
done
wait "$LOAD_PID" || true
LOAD_PID=
tail -3 "$WORK/load.out"
/usr/bin/python3 - "$OUT" "$RATE" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]))]
rows = [r for r in rows if int(r["records"]) > 0]
early = rows[max(0, len(rows) // 10)]
last = rows[-1]
rss = [int(r["rss_kib"]) for r in rows]
fds = [int(r["fds"]) for r in rows]
rec = int(last["records"]) - int(early["records"])
store = int(last["store_bytes"]) - int(early["store_bytes"])
secs = int(last["elapsed_s"]) - int(early["elapsed_s"])
print(f"samples {len(rows)} over {last['elapsed_s']} s; offered {sys.argv[2]} records/s, "
      f"stored {rec / max(secs, 1):.0f} records/s after the first 10%")
print(f"RSS at 10%: {int(early['rss_kib']) // 1024} MiB, at the end: {int(last['rss_kib']) // 1024} MiB, "
      f"max {max(rss) // 1024} MiB")
print(f"open fds at 10%: {early['fds']}, at the end: {last['fds']}, min {min(fds)}, max {max(fds)}; "
      f"threads {early['threads']} -> {last['threads']}")
print(f"store: {int(last['store_bytes']) / 2**30:.2f} GiB for {int(last['records'])} records; "
      f"{store / max(rec, 1):.1f} bytes per record after the first 10%")
PY
