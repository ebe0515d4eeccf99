#!/usr/bin/env bash
# Bytes on disk per step record, trainwatch against Prometheus's TSDB on the
# same values, in one run: storage_gen.py writes a synthetic fp16 run (ten
# float fields, flags, two batch ids a step) as a JSONL step log and as
# OpenMetrics gauges (one series per float field, a sample per step, one
# second apart). The log is replayed through a real trainwatch-server into a
# fresh SQLite file; the file's growth is measured after a clean stop (the
# WAL checkpointed into it and removed), and every value is read back with
# `trainwatchctl steps --json` and compared with the generator's (shortest
# round-trip decimals, so equal strings are equal doubles). The OpenMetrics
# file goes through `promtool tsdb create-blocks-from openmetrics`; its
# blocks' bytes are the files under them (chunks, index, meta.json,
# tombstones) and, as `du -b` counts them, with the directories too.
#
#   tools/perf/storage_bytes.sh [BUILD_DIR] [STEPS] [GEN_FLAGS...]
#                               (defaults: build, 200000; e.g. --full-precision)
#   tools/perf/storage_bytes.sh [BUILD_DIR] [STEPS] --all
#
# Prints a line per side and the ratio, then one JSON object as the last line.
# GEN_FLAGS go to storage_gen.py: none (float32 tensor values, clip_coef the
# C++ client's double), --float32 (clip_coef too a float32, as
# trainwatch.torch's StepHook sends it) or --full-precision (arbitrary
# doubles). --all runs the three in turn, then prints a table of them.
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-200000}
shift $(( $# > 2 ? 2 : $# ))
if [[ "${1:-}" == "--all" ]]; then
  ROWS=()
  for flags in "" --float32 --full-precision; do
    # shellcheck disable=SC2086  # no flags is no argument
    ROWS+=("$("$0" "$BUILD" "$STEPS" $flags | tee /dev/stderr | tail -1)")
  done
  /usr/bin/python3 - "${ROWS[@]}" <<'TABLE'
import json, sys
print("| data | trainwatch bytes/step | prometheus bytes/step | ratio |")
for row in map(json.loads, sys.argv[1:]):
    print(f"| {row['generator_flags'] or '(default)'} | {row['trainwatch_bytes_per_step']} "
          f"| {row['prometheus_bytes_per_step']} | {row['ratio']} |")
TABLE
  exit 0
fi
BIN=$BUILD/bin
PY=/usr/bin/python3
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
SERVER_PID=
cleanup() { [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

source "$(dirname "${BASH_SOURCE[0]}")/server.sh"
start_server() {  # sets SERVER_PID, GRPC
  tw_start_server "$BIN/trainwatch-server" "$WORK/server.log" "$WORK/tw.db"
}
# SIGTERM: the server commits what it acked and closes the database, which
# checkpoints the WAL into the file.
stop_server() { kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true; SERVER_PID=; }
file_bytes() { local t=0 f; for f in "$WORK"/tw.db*; do t=$(( t + $(stat -c %s "$f") )); done; echo $t; }

$PY "$HERE/storage_gen.py" "$STEPS" "$WORK/run.jsonl" "$WORK/run.om" "$@"

# The empty database (schema only) first, so only the records' growth counts.
start_server
stop_server
BASE=$(file_bytes)
start_server
"$BIN/trainwatchctl" --server "$GRPC" replay "$WORK/run.jsonl" >/dev/null
"$BIN/trainwatchctl" --server "$GRPC" steps --run storage --json >"$WORK/back.json"
stop_server
TW=$(( $(file_bytes) - BASE ))
$PY - "$WORK/run.jsonl" "$WORK/back.json" <<'CHECK'
import json, sys
want = [json.loads(l) for l in open(sys.argv[1])][1:]
got = json.load(open(sys.argv[2]))
assert len(got) == len(want), f"{len(got)} records read back, {len(want)} sent"
def same(a, b):  # repr-exact: the shortest strings of equal doubles are equal
    if isinstance(a, float) or isinstance(b, float):
        return repr(float(a)) == repr(float(b))
    return a == b
bad = 0
for w, g in zip(want, got):
    for k, v in w.items():
        if not same(v, g.get(k)):
            bad += 1
            if bad <= 5:
                print(f"step {w['step']}: {k} sent {v!r}, read back {g.get(k)!r}", file=sys.stderr)
if bad:
    sys.exit(f"{bad} values differ")
print(f"read back: {len(got)} records, every value equal")
CHECK

promtool tsdb create-blocks-from openmetrics "$WORK/run.om" "$WORK/prom" >/dev/null
PROM=$(find "$WORK/prom" -type f -printf '%s\n' | awk '{ t += $1 } END { print t }')
PROM_DU=$(du -sb "$WORK/prom" | cut -f1)
BLOCKS=$(find "$WORK/prom" -name meta.json | wc -l)
$PY - "$STEPS" "$TW" "$PROM" "$PROM_DU" "$BLOCKS" "$*" <<'REPORT'
import json, sys
steps, tw, prom, prom_du, blocks = (int(x) for x in sys.argv[1:6])
flags = sys.argv[6]
print(f"trainwatch: {tw} bytes, {tw / steps:.1f} bytes/step (SQLite file growth, WAL checkpointed)")
print(f"prometheus: {prom} bytes in {blocks} blocks, {prom / steps:.1f} bytes/step "
      f"(du -b: {prom_du / steps:.1f})")
print(f"ratio trainwatch / prometheus: {tw / prom:.2f} (du -b: {tw / prom_du:.2f})")
print(json.dumps({"steps": steps, "generator_flags": flags, "trainwatch_bytes": tw,
                  "prometheus_bytes": prom, "prometheus_du_bytes": prom_du,
                  "trainwatch_bytes_per_step": round(tw / steps, 2),
                  "prometheus_bytes_per_step": round(prom / steps, 2),
                  "ratio": round(tw / prom, 3)}))
REPORT
