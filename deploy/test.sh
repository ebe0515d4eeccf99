#!/usr/bin/env bash
# Installs what is needed, builds, and runs the whole test suite: unit and
# integration tests (ctest; integration tests start the real server binary on
# loopback ports with a temporary SQLite file), the contract check of the names and shapes docs/contracts.md promises,
# clang's thread-safety analysis of the server (build-clang), and a short run
# of each fuzz target (clang, its own build directory
# build-fuzz; FUZZ_SECONDS each, 30 by default; FUZZ_SECONDS=0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install.sh --with-tests
BUILD_DIR=${BUILD_DIR:-build}

status=0
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 900 -j2 2>&1 | tee ctest.log;
 exit "${PIPESTATUS[0]}") || status=$?
# Tests that read ../shared/testdata (real logs, beside the repository) skip
# without it; say how many, and why.
if [ ! -d ../shared/testdata ]; then
  skipped=$(grep -c '(Skipped)' "$BUILD_DIR/ctest.log" || true)
  echo "test.sh: ../shared/testdata is not beside this checkout: $skipped ctest case(s) that read it were skipped, and import_tests skipped its real TensorBoard files (pytest -rs in its output)"
fi

# The names and shapes docs/contracts.md promises, checked on the built tree:
# ctest's contract_test runs the repo's copy (tests/contract/contract.sh);
# the workplace's own runs here too where it is beside the checkout.
if [ -x ../shared/checks/contract.sh ]; then
  BIN="$BUILD_DIR/bin" ../shared/checks/contract.sh || status=$?
else
  echo "test.sh: ../shared/checks/contract.sh not found; contract check not run"
fi
# The server's mutex annotations (ABSL_GUARDED_BY and friends), checked by
# clang: server/CMakeLists.txt adds -Wthread-safety -Werror=thread-safety
# under clang, so a lock rule broken anywhere in server/ fails this build.
TSA_DIR=${TSA_DIR:-build-clang}
if ! { CC=clang CXX=clang++ cmake -S . -B "$TSA_DIR" -G Ninja -DTRAINWATCH_BUILD_TESTS=OFF \
         -DCMAKE_BUILD_TYPE=Debug >/dev/null &&
       cmake --build "$TSA_DIR" -j"$(nproc)" --target tw_server; }; then
  echo "test.sh: the clang build of the server (thread-safety analysis) failed"
  status=1
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
