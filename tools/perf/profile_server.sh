#!/usr/bin/env bash
# Where the server's CPU goes under load: perf samples trainwatch-server while
# trainwatch-loadgen drives it with N streams (batch 1024, as perf_table.sh),
# then prints the hottest functions (self time) and a coarse split by part.
#
#   tools/perf/profile_server.sh [BUILD_DIR] [STREAMS] [SECONDS]   (build 16 8)
#
# BATCH (1024) sets loadgen's --batch, LOADGEN_ARGS adds to its flags, as in
# ab_servers.sh: MoE reports are profiled with
#   BATCH=16 LOADGEN_ARGS="--moe 48x128" tools/perf/profile_server.sh build 4 8
#
# Needs perf (Debian linux-perf) and a RelWithDebInfo build.
set -euo pipefail
BUILD=${1:-build}
STREAMS=${2:-16}
SECS=${3:-8}
BATCH=${BATCH:-1024}
read -r -a EXTRA <<<"${LOADGEN_ARGS:-}"
BIN=$BUILD/bin
WORK=$(mktemp -d)
SERVER_PID=
cleanup() { [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null; [[ -n "${KEEP_PERF:-}" ]] && cp "$WORK/perf.data" "$KEEP_PERF"; rm -rf "$WORK"; }
trap cleanup EXIT

source "$(dirname "${BASH_SOURCE[0]}")/server.sh"
tw_start_server "$BIN/trainwatch-server" "$WORK/server.log" "$WORK/p.db" --max-active-runs 20000
runs=$(( STREAMS < 16 ? STREAMS : 16 ))
"$BIN/trainwatch-loadgen" --server "$GRPC" --metrics "$METRICS" --streams "$STREAMS" \
  --runs "$runs" --batch "$BATCH" --seconds $(( SECS + 2 )) --alert-probes 10 --json "${EXTRA[@]}" >"$WORK/load.out" &
LOAD_PID=$!
sleep 1
perf record -e cpu-clock -F 999 ${PERF_CALLGRAPH:--g} -p "$SERVER_PID" -o "$WORK/perf.data" -- sleep "$SECS" 2>/dev/null
wait "$LOAD_PID"
echo "load average $(cut -d' ' -f1-3 /proc/loadavg); loadgen: $(tail -1 "$WORK/load.out")"
echo "--- self time, top 40 ---"
perf report -i "$WORK/perf.data" --stdio --no-children --percent-limit 0.7 \
  --sort symbol 2>/dev/null | grep -E '^ +[0-9]' | head -40
echo "--- by thread ---"
perf report -i "$WORK/perf.data" --stdio --no-children --sort comm 2>/dev/null | grep -E '^ +[0-9]' | head -12
