#!/usr/bin/env bash
# Installs what is needed, builds, and runs the whole test suite: unit and
# integration tests (ctest; integration tests start the real server binary on
# loopback ports with a temporary SQLite file), the DESIGN.md contract check,
# and a short run of each fuzz target (clang, its own build directory
# build-fuzz; FUZZ_SECONDS each, 30 by default; FUZZ_SECONDS=0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install.sh
BUILD_DIR=${BUILD_DIR:-build}

status=0
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 900 -j2) || status=$?

# The names and shapes DESIGN.md promises, checked on the built tree.
if [ -x ../shared/checks/contract.sh ]; then
  BIN="$BUILD_DIR/bin" ../shared/checks/contract.sh || status=$?
else
  echo "test.sh: ../shared/checks/contract.sh not found; contract check not run"
fi
# Fuzz smoke: each libFuzzer target from its seed corpus for a bounded time;
# a crash, leak, sanitizer report or broken invariant fails the step.
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
if [ "$FUZZ_SECONDS" != 0 ]; then
  FUZZ_DIR=${FUZZ_DIR:-build-fuzz}
  if CC=clang CXX=clang++ cmake -S . -B "$FUZZ_DIR" -G Ninja -DTRAINWATCH_FUZZ=ON \
       -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAINWATCH_FUZZ_SECONDS="$FUZZ_SECONDS" >/dev/null &&
     cmake --build "$FUZZ_DIR" -j"$(nproc)"; then
    (cd "$FUZZ_DIR" && ctest --output-on-failure -L fuzz) || status=$?
  else
    echo "test.sh: building the fuzz targets failed"
    status=1
  fi
fi
exit $status
