#!/usr/bin/env bash
# The performance table of docs/performance.md, in one run on this
# machine: end to end records/s at 1 / 16 / 64 streams with ack and alert
# latency, the server's CPU per record and peak RSS, the raw SQLite reference
# measured right after (the ratio server/reference), memory per active run at
# 100 / 1,000 / 10,000 runs, /metrics with 1,000 runs, and how long the
# server takes to exit on SIGTERM with 10,000 active runs, and the bytes on
# disk per step record against Prometheus's TSDB on the same values
# (tools/perf/storage_bytes.sh: a 200,000-step fp16 run, both in this run).
#
#   tools/perf/perf_table.sh [BUILD_DIR] [SECONDS]     (defaults: build, 10)
#
# Needs a built tree (trainwatch-server, trainwatch-loadgen, trainwatchctl,
# bench_store), curl and promtool (without it the bytes row says so). Prints a Markdown table, then one JSON object as the last line.
set -euo pipefail
BUILD=${1:-build}
SECONDS_PER_LOAD=${2:-10}
BIN=$BUILD/bin
PY=/usr/bin/python3
WORK=$(mktemp -d)
SERVER_PID=
cleanup() { [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

source "$(dirname "${BASH_SOURCE[0]}")/server.sh"
start_server() {  # $1: name; sets SERVER_PID, GRPC, METRICS
  tw_start_server "$BIN/trainwatch-server" "$WORK/$1.log" "$WORK/$1.db" --max-active-runs 20000
}
stop_server() { kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true; SERVER_PID=; }
cpu_seconds() {  # utime + stime of the server, in seconds
  awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$SERVER_PID/stat"
}
rss_kib() { awk '/^VmRSS/ { print $2 }' "/proc/$SERVER_PID/status"; }
hwm_kib() { awk '/^VmHWM/ { print $2 }' "/proc/$SERVER_PID/status"; }
json_field() { $PY -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
     "$(. /etc/os-release; echo "$PRETTY_NAME"), load average $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A RATE P50 P99 ALERT US
start_server load
for n in 1 16 64; do
  runs=$(( n < 16 ? n : 16 ))
  cpu0=$(cpu_seconds)
  # The alert probes run as a process of their own, as a trainer does: inside
  # the load generator they shared its gRPC client with the load, and at 64
  # streams that client's own queue held a probe's spike for up to ~600 ms
  # before it was sent (measured: the server saw it that late; the shard
  # then took < 12 ms).
  "$BIN/trainwatch-loadgen" --server "$GRPC" --streams "$n" --runs "$runs" \
    --batch 1024 --seconds "$SECONDS_PER_LOAD" --alert-probes 0 --json >"$WORK/load.$n" &
  load_pid=$!
  sleep 1
  probes=$("$BIN/trainwatch-loadgen" --server "$GRPC" --metrics "$METRICS" --streams 1 \
           --runs 1 --batch 1 --rate 100 --seconds $(( SECONDS_PER_LOAD > 3 ? SECONDS_PER_LOAD - 2 : 1 )) \
           --alert-probes 20 --json)
  wait "$load_pid"
  cpu1=$(cpu_seconds)
  last=$(tail -1 "$WORK/load.$n")
  RATE[$n]=$(json_field records_per_s <<<"$last")
  P50[$n]=$(json_field ack_latency_p50_ms <<<"$last")
  P99[$n]=$(json_field ack_latency_p99_ms <<<"$last")
  ALERT[$n]=$(json_field alert_latency_p99_ms <<<"$(tail -1 <<<"$probes")")
  acked=$(json_field records_acked <<<"$last")
  US[$n]=$($PY -c "print(round(($cpu1 - $cpu0) * 1e6 / max(1, $acked), 2))")
done
PEAK_RSS_MIB=$(( $(hwm_kib) / 1024 ))
stop_server
REF=$("$BIN/bench_store" --benchmark_filter=BM_RawSqliteRowPerStep --benchmark_min_time=2 \
      --benchmark_format=json 2>/dev/null | $PY -c \
      "import json,sys; print(round(json.load(sys.stdin)['benchmarks'][0]['items_per_second']))")
RATIO=$($PY -c "print(round(${RATE[16]} / $REF, 2))")

start_server memory
sleep 1
rss0=$(rss_kib); total=0
declare -A PER_RUN
for m in 100 1000 10000; do
  "$BIN/trainwatch-loadgen" --server "$GRPC" --streams 16 --batch 1024 \
    --populate-runs $(( m - total )) --records-per-run 1200 >/dev/null
  total=$m
  PER_RUN[$m]=$($PY -c "print(round(($(rss_kib) - $rss0) / $m, 1))")
  if [[ $m == 1000 ]]; then
    METRICS_MS=$(for _ in $(seq 11); do curl -s -o /dev/null -w '%{time_total}\n' "$METRICS"; done |
                 sort -n | sed -n 6p | $PY -c "import sys; print(round(float(sys.stdin.read()) * 1000, 1))")
    METRICS_KB=$(( $(curl -s "$METRICS" | wc -c) / 1024 ))
    SERIES=$(curl -s "$METRICS" | grep -vc '^#')
  fi
done
t0=$(date +%s.%N)
stop_server  # SIGTERM with 10,000 active runs, waits for the exit
SIGTERM_S=$($PY -c "print(round($(date +%s.%N) - $t0, 2))")

# Ranks in one run: RANKS ranks (RANKS_MAX, 16,384 by default), a record a
# rank a second for 45 s, one rank 1.5x slow from step 20 on.
declare -A RANK_RSS RANK_US RANK_DELAY
for n in 1024 ${RANKS_MAX:-16384}; do
  start_server "ranks$n"
  R=$("$BIN/trainwatch-loadgen" --server "$GRPC" --ranks "$n" --steps 45 \
        --slow-rank $((n * 3 / 4 + 1)) --slow-factor 1.5 --slow-from 20 \
        --server-pid "$SERVER_PID" --json | tail -1)
  stop_server
  RANK_RSS[$n]=$(json_field server_peak_rss_mib <<<"$R")
  RANK_US[$n]=$(json_field server_cpu_us_per_record <<<"$R")
  RANK_DELAY[$n]=$(json_field delay_steps <<<"$R")
done
RMAX=${RANKS_MAX:-16384}

if command -v promtool >/dev/null; then
  BYTES=$("$(dirname "$0")/storage_bytes.sh" "$BUILD" 200000 | tail -1)
  TW_BYTES=$(json_field trainwatch_bytes_per_step <<<"$BYTES")
  PROM_BYTES=$(json_field prometheus_bytes_per_step <<<"$BYTES")
  BYTES_RATIO=$(json_field ratio <<<"$BYTES")
else
  TW_BYTES=null PROM_BYTES=null BYTES_RATIO=null
fi

cat <<TABLE

| what | figure |
|---|---|
| end to end, acked, records/s at 1 / 16 / 64 streams (batch 1024, ${SECONDS_PER_LOAD} s) | ${RATE[1]} / ${RATE[16]} / ${RATE[64]} |
| ack latency p50 / p99 at 1 / 16 / 64 streams (ms) | ${P50[1]}/${P99[1]} / ${P50[16]}/${P99[16]} / ${P50[64]}/${P99[64]} |
| alert latency p99 at 1 / 16 / 64 streams (ms) | ${ALERT[1]} / ${ALERT[16]} / ${ALERT[64]} |
| server CPU per acked record at 1 / 16 / 64 streams (us) | ${US[1]} / ${US[16]} / ${US[64]} |
| server peak RSS over the load runs | ${PEAK_RSS_MIB} MiB |
| raw SQLite reference (row per step, 1,024 rows a txn, WAL, synchronous=NORMAL), right after | ${REF} rows/s |
| server at 16 streams / reference | ${RATIO} |
| RSS per active run at 100 / 1,000 / 10,000 runs (1,200 records each) | ${PER_RUN[100]} / ${PER_RUN[1000]} / ${PER_RUN[10000]} KiB |
| /metrics with 1,000 runs: median of 11 scrapes, size, samples | ${METRICS_MS} ms, ${METRICS_KB} KiB, ${SERIES} |
| SIGTERM to exit with 10,000 active runs (everything acked committed) | ${SIGTERM_S} s |
| bytes on disk a step record, 200,000-step fp16 run: trainwatch / Prometheus TSDB, same values, every value read back (<= 0.8x) | ${TW_BYTES} / ${PROM_BYTES} (${BYTES_RATIO}x) |
| one run of 1,024 / ${RMAX} ranks at a step a second: server peak RSS (MiB), CPU per rank-record (us), a 1.5x slow rank named after (steps) | ${RANK_RSS[1024]} / ${RANK_RSS[$RMAX]}, ${RANK_US[1024]} / ${RANK_US[$RMAX]}, ${RANK_DELAY[1024]} / ${RANK_DELAY[$RMAX]} |
TABLE
echo "{\"records_per_s\": {\"1\": ${RATE[1]}, \"16\": ${RATE[16]}, \"64\": ${RATE[64]}}," \
     "\"alert_latency_p99_ms\": {\"1\": ${ALERT[1]}, \"16\": ${ALERT[16]}, \"64\": ${ALERT[64]}}," \
     "\"cpu_us_per_record\": {\"1\": ${US[1]}, \"16\": ${US[16]}, \"64\": ${US[64]}}," \
     "\"reference_rows_per_s\": $REF, \"ratio_16\": $RATIO, \"peak_rss_mib\": $PEAK_RSS_MIB," \
     "\"kib_per_run\": {\"100\": ${PER_RUN[100]}, \"1000\": ${PER_RUN[1000]}, \"10000\": ${PER_RUN[10000]}}," \
     "\"metrics_ms_1000_runs\": $METRICS_MS, \"sigterm_s_10000_runs\": $SIGTERM_S," \
     "\"bytes_per_step\": {\"trainwatch\": $TW_BYTES, \"prometheus\": $PROM_BYTES, \"ratio\": $BYTES_RATIO}," \
     "\"ranks\": {\"1024\": {\"rss_mib\": ${RANK_RSS[1024]}, \"cpu_us\": ${RANK_US[1024]}, \"delay_steps\": ${RANK_DELAY[1024]}}," \
     "\"$RMAX\": {\"rss_mib\": ${RANK_RSS[$RMAX]}, \"cpu_us\": ${RANK_US[$RMAX]}, \"delay_steps\": ${RANK_DELAY[$RMAX]}}}}"
