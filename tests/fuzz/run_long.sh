#!/usr/bin/env bash
# A long run of one fuzz target, at the lowest CPU priority:
#
#   tests/fuzz/run_long.sh steplog -max_len=1024
#   tests/fuzz/run_long.sh ingest -max_len=2048
#
# Runs 10,000,000 executions (RUNS=N to change) from the seed corpus plus
# what earlier long runs found (build-fuzz/long/TARGET/), and writes the
# libFuzzer log with /usr/bin/time -v (peak RSS) to build-fuzz/long/TARGET.log
# and crashes to build-fuzz/long/artifacts_TARGET/. Extra arguments go to
# libFuzzer. Run one target at a time on a shared machine.
set -u
# The braces make bash read the whole script before running it: bash reads a
# script as it goes, so editing this file during an hour-long run once made
# it run the fuzzer a second time, truncating the first run's log.
{
name=$1; shift
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=${FUZZ_DIR:-$root/build-fuzz}/long
mkdir -p "$dir/$name" "$dir/artifacts_$name"
dict=()
[ -f "$root/tests/fuzz/$name.dict" ] && dict=(-dict="$root/tests/fuzz/$name.dict")
# A smaller quarantine, and no allocation/free stacks: ASan keeps every
# distinct stack it records for good, and steplog_fuzzer's (protobuf's JSON
# parser, recursive) grew its RSS by ~200 MiB a million runs until libFuzzer's
# 2 GiB limit would stop it short of 10M (the heap profile at the limit: 25 MB
# live, 26 MB quarantined). A crash still prints where it happened; rerun its
# artifact with the default ASAN_OPTIONS for the allocation stacks. Also ~1.5x
# the executions a second.
export ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=32:malloc_context_size=0}
# Keep an earlier run's log (a rerun must not truncate the figures of one).
[ -f "$dir/$name.log" ] && mv "$dir/$name.log" "$dir/$name.$(date -r "$dir/$name.log" +%Y%m%d-%H%M%S).log"
start=$(date +%s)
/usr/bin/time -v nice -n 19 "$dir/../bin/${name}_fuzzer" -runs="${RUNS:-10000000}" \
  -print_final_stats=1 -artifact_prefix="$dir/artifacts_$name/" "${dict[@]}" "$@" \
  "$dir/$name" "$root/tests/fuzz/corpus/$name" > "$dir/$name.log" 2>&1
rc=$?
echo "rc=$rc seconds=$(( $(date +%s) - start ))" >> "$dir/$name.log"
exit $rc
}
