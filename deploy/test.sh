#!/usr/bin/env bash
# Installs what is needed, builds, and runs the whole test suite: unit and
# integration tests (ctest; integration tests start the real server binary on
# loopback ports with a temporary SQLite file) and the DESIGN.md contract check.
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
exit $status
