#!/bin/bash
# Smoke test of trainwatch-loadgen: a real server on free ports with a
# temporary database, 4 streams for 2 seconds, a parseable JSON line with
# records_per_s > 0 and an alert latency; then --ranks: one run of 256 ranks
# (a stream each) at 20 steps a second, one rank 1.5x slow, which
# RankStraggler must name with its host.
# Usage: loadgen_smoke_test.sh SERVER_BINARY LOADGEN_BINARY
set -euo pipefail
server_bin=$1
loadgen_bin=$2
dir=$(mktemp -d)
server_pid=
cleanup() {
  if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

"$server_bin" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --db "$dir/tw.db" \
  >"$dir/server.out" 2>"$dir/server.err" &
server_pid=$!
# First stdout line: "trainwatch-server: gRPC on HOST:PORT, /metrics on http://HOST:PORT/metrics, db ..."
line=
for _ in $(seq 1 100); do
  line=$(head -n 1 "$dir/server.out" 2>/dev/null || true)
  [[ -n "$line" ]] && break
  sleep 0.05
done
grpc=$(sed -n 's/.*gRPC on \([^,]*\),.*/\1/p' <<<"$line")
metrics=$(sed -n 's|.*/metrics on \(http://[^,]*/metrics\).*|\1|p' <<<"$line")
if [[ -z "$grpc" || -z "$metrics" ]]; then
  echo "server did not start: '$line'" >&2
  cat "$dir/server.err" >&2
  exit 1
fi

"$loadgen_bin" --server "$grpc" --metrics "$metrics" --streams 4 --runs 2 --batch 256 \
  --seconds 2 --alert-probes 3 --json | tee "$dir/loadgen.out"
json=$(tail -n 1 "$dir/loadgen.out")
python3 - "$json" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
assert d["records_per_s"] > 0, d
assert d["ack_latency_p99_ms"] > 0, d
assert d["alert_latency_p99_ms"] > 0, d
assert d["errors"] == 0, d
PY

"$loadgen_bin" --server "$grpc" --ranks 256 --steps 60 --slow-rank 200 --slow-factor 1.5 \
  --slow-from 20 --step-seconds 0.05 --server-pid "$server_pid" --json | tee "$dir/ranks.out"
json=$(tail -n 1 "$dir/ranks.out")
python3 - "$json" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
assert d["ranks"] == 256 and d["unacked"] == 0 and d["failed"] == 0, d
assert d["straggler_named"] and d["straggler_rank"] == 200 and d["straggler_host"] == "node-25", d
assert 0 <= d["delay_steps"] <= 50, d
assert d["server_peak_rss_mib"] > 0, d
PY
echo OK
