#!/usr/bin/env bash
# Installs what trainwatch needs from Debian's packages, then builds it.
#
#   deploy/install.sh               the server's, trainwatchctl's and the Python
#                                   client's packages; builds those targets
#                                   into build/ (no tests, no browser, torch or
#                                   clang: a newcomer's first ack in minutes)
#   deploy/install.sh --start       ... then runs trainwatch-server on its
#                                   embedded default (./trainwatch.db, gRPC
#                                   127.0.0.1:50051, /metrics 127.0.0.1:9464)
#                                   in the foreground
#   deploy/install.sh --with-tests  also what the tests need (deploy/test.sh
#                                   uses it), and builds every target
#
# Needs root (or sudo) for apt-get; runs `apt-get update` only when a package
# is missing. Extra server flags after --start are passed through.
set -euo pipefail
cd "$(dirname "$0")/.."

WITH_TESTS=0
if [ "${1:-}" = "--with-tests" ]; then
  WITH_TESTS=1
  shift
fi

PACKAGES=(
  # build the server and trainwatchctl
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libsqlite3-dev libyaml-cpp-dev libcurl4-openssl-dev
  nlohmann-json3-dev libssl-dev libcrypt-dev
  libgoogle-perftools-dev  # tcmalloc for trainwatch-server
  libmicrohttpd-dev libgnutls28-dev  # the /metrics HTTP layer (epoll, TLS)
  # Python client (built for Debian's /usr/bin/python3)
  python3 python3-dev pybind11-dev python3-pybind11 python3-numpy
)
TEST_PACKAGES=(
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  sqlite3 curl openssl prometheus prometheus-alertmanager python3-yaml python3-pytest
  # the fleet proxy (deploy/fleet, tests/integration/fleet_test.cc)
  nginx
  python3-torch python3-prometheus-client python3-grpcio
  # the HTML report's browser test (tests/import): headless Chromium
  chromium
  # Debian's torch uses the reference BLAS unless an optimized one is present
  libopenblas0
  # fuzzing and the thread-safety build (build-fuzz, build-clang): clang and
  # libFuzzer/ASan/UBSan runtimes
  clang libclang-rt-14-dev
)
[ "$WITH_TESTS" = 1 ] && PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install.sh: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

BUILD_DIR=${BUILD_DIR:-build}
if [ "$WITH_TESTS" = 1 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} \
        -DTRAINWATCH_BUILD_TESTS=ON >/dev/null
  cmake --build "$BUILD_DIR" -j"$(nproc)"
else
  # Only what the server, trainwatchctl and the Python client need.
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} \
        -DTRAINWATCH_BUILD_TESTS=OFF >/dev/null
  cmake --build "$BUILD_DIR" -j"$(nproc)" --target trainwatch-server trainwatchctl _trainwatch
fi
echo "install.sh: built $BUILD_DIR/bin/trainwatch-server and $BUILD_DIR/bin/trainwatchctl"

if [ "${1:-}" = "--start" ]; then
  shift
  exec "$BUILD_DIR/bin/trainwatch-server" --db ./trainwatch.db "$@"
fi
