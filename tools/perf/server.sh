# Sourced by the perf scripts: the one way they start a trainwatch-server
# (the shell twin of tools/tw_harness.py). On free loopback ports; waits for
# its ready line ("trainwatch-server: gRPC on HOST:PORT, /metrics on
# http://HOST:PORT/metrics, ..."), then sets SERVER_PID, GRPC and METRICS.
# A server that does not start prints its log and exits the script.
#
#   tw_start_server SERVER_BIN LOG DB [FLAGS...]
tw_start_server() {
  local bin=$1 log=$2 db=$3
  shift 3
  "$bin" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --db "$db" "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 100); do grep -q "gRPC on" "$log" && break; sleep 0.1; done
  GRPC=$(sed -n 's/.*gRPC on \([0-9.:]*\),.*/\1/p' "$log" | head -1)
  METRICS=$(sed -n 's|.*/metrics on \(http://[0-9.:]*/metrics\).*|\1|p' "$log" | head -1)
  [[ -n "$GRPC" && -n "$METRICS" ]] || { echo "server did not start:"; cat "$log"; exit 1; }
}
