#!/usr/bin/env bash
# Ranks by host streams against a stream a rank, side by side: one run of
# RANKS ranks at a step a second (STEP_SECONDS), STEPS steps, rank 3N/4 + 1 1.5x slow from
# step 20, each with a fresh server; per ranks-per-stream K (default "1 8"):
# server CPU per rank-record, peak RSS, the straggler's delay.
#
#   tools/perf/host_streams.sh [BUILD_DIR] [RANKS] [STEPS] [K ...]
# STEP_SECONDS (environment, default 1): the pace, for runs whose ranks a
# step a second would take more than the machine.
set -euo pipefail
build=${1:-build}
ranks=${2:-16384}
steps=${3:-45}
shift $(( $# < 3 ? $# : 3 ))
per=("$@")
[[ ${#per[@]} -gt 0 ]] || per=(1 8)
here=$(cd "$(dirname "$0")" && pwd)
source "$here/server.sh"
tmp=$(mktemp -d)
trap 'kill $SERVER_PID 2>/dev/null || true; rm -rf "$tmp"' EXIT
pace=${STEP_SECONDS:-1}
echo "ranks $ranks, $steps steps, one every $pace s, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| ranks a stream | streams | server CPU per rank-record | server CPU (cores) | server peak RSS | RankStraggler named after | load after |"
echo "|---|---|---|---|---|---|---|"
for k in "${per[@]}"; do
  tw_start_server "$build/bin/trainwatch-server" "$tmp/server-$k.log" "$tmp/tw-$k.db"
  out=$("$build/bin/trainwatch-loadgen" --server "$GRPC" --ranks "$ranks" --steps "$steps" \
        --slow-rank $((ranks * 3 / 4 + 1)) --slow-factor 1.5 --slow-from 20 \
        --ranks-per-stream "$k" --step-seconds "$pace" --server-pid "$SERVER_PID" --json | tail -1)
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
  /usr/bin/python3 - "$k" "$ranks" "$out" "$(cut -d' ' -f1 /proc/loadavg)" <<'PY'
import json, sys
k, ranks, out, load = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
us = out["server_cpu_us_per_record"]
named = (f"{out['delay_steps']} steps, {out['straggler_host']}" if out["straggler_named"]
         else "not named")
pace = float(__import__("os").environ.get("STEP_SECONDS", "1"))
print(f"| {k} | {-(-ranks // k):,} | {us:.1f} us | {us * ranks / 1e6 / pace:.2f} | "
      f"{out['server_peak_rss_mib']:.1f} MiB | {named} | {load} |")
PY
done
