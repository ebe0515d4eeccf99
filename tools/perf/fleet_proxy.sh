#!/usr/bin/env bash
# The fleet proxy's cost (docs/fleet.md "Cost of the proxy"): the same load,
# one run, sent straight to a trainwatch-server and through nginx with the
# configuration of deploy/fleet/render.sh (one upstream: the same server).
#
#   tools/perf/fleet_proxy.sh [BUILD_DIR] [SECONDS] [STREAMS]
#
# Runs trainwatch-loadgen (--run-header through the proxy) twice, direct and
# proxied, alternating, ROUNDS=3 times each, and prints per round: records/s
# acknowledged, ack latency p50/p99, and the CPU seconds the nginx processes
# used per million records (from /proc, user + system). Needs Debian's nginx.
set -euo pipefail
BUILD=${1:-build}
SECONDS_PER_RUN=${2:-10}
STREAMS=${3:-1}
ROUNDS=${ROUNDS:-3}
BIN=$BUILD/bin
HERE=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
SERVER_PID=; NGINX_PID=
cleanup() {
  [[ -n "$NGINX_PID" ]] && kill "$NGINX_PID" 2>/dev/null
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/trainwatch-server" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --db "$WORK/tw.db" >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do grep -q "gRPC on" "$WORK/server.log" && break; sleep 0.1; done
GRPC=$(sed -n 's/.*gRPC on \([0-9.:]*\),.*/\1/p' "$WORK/server.log" | head -1)
[[ -n "$GRPC" ]] || { cat "$WORK/server.log"; exit 1; }

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$WORK/nginx"
"$HERE/deploy/fleet/render.sh" --standalone "$WORK/nginx" --listen "127.0.0.1:$PORT" \
  --access-log off "$GRPC" >"$WORK/nginx/nginx.conf"
nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" -e "$WORK/nginx/error.log" \
  -g 'daemon off;' &
NGINX_PID=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done

# CPU seconds (user + system) of nginx's master and workers so far.
nginx_cpu() {
  local ticks=0 pid
  for pid in $NGINX_PID $(pgrep -P "$NGINX_PID"); do
    ticks=$(( ticks + $(awk '{print $14 + $15}' "/proc/$pid/stat") ))
  done
  echo "$ticks $(getconf CLK_TCK)" | awk '{printf "%.3f", $1 / $2}'
}

load() {  # load NAME ADDRESS [ARGS...]: one loadgen run; prints its summary
  local name=$1 addr=$2; shift 2
  local before after
  before=$(nginx_cpu)
  "$BIN/trainwatch-loadgen" --server "$addr" --streams "$STREAMS" --runs 1 --batch 1024 \
    --inflight 8 --seconds "$SECONDS_PER_RUN" --alert-probes 0 --json "$@" >"$WORK/load.out" 2>&1
  after=$(nginx_cpu)
  tail -1 "$WORK/load.out" | python3 -c '
import json, sys
name, before, after = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
r = json.loads(sys.stdin.read())
rec = r["records_acked"]
cpu = (after - before) / rec * 1e6 if rec else float("nan")
rate, p50, p99 = r["records_per_s"], r["ack_latency_p50_ms"], r["ack_latency_p99_ms"]
print(f"{name:8s} {rate:>10.0f} records/s  ack p50 {p50:.2f} ms  p99 {p99:.2f} ms"
      f"  nginx CPU {cpu:.3f} s per 1e6 records")' "$name" "$before" "$after"
}

echo "$(nproc) cores; $STREAMS stream(s) of run 1, batches of 1024, ${SECONDS_PER_RUN} s each"
for round in $(seq "$ROUNDS"); do
  load direct "$GRPC"
  load proxied "127.0.0.1:$PORT" --run-header
done
