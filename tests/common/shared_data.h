// Tests that read ../shared/testdata (real logs from real runs, kept beside
// the repository, not in it): a checkout without it skips them, saying so,
// and deploy/test.sh's summary counts them.
#ifndef TRAINWATCH_TESTS_COMMON_SHARED_DATA_H_
#define TRAINWATCH_TESTS_COMMON_SHARED_DATA_H_

#include <filesystem>

#include "gtest/gtest.h"

// GTEST_SKIP()s the test when `path` (a file of the shared test data) is
// not there.
#define TW_SKIP_WITHOUT_SHARED(path)                                        \
  if (!std::filesystem::exists(path))                                      \
  GTEST_SKIP() << "needs the shared test data (" << (path)                 \
               << "), which this checkout does not have beside it"

#endif  // TRAINWATCH_TESTS_COMMON_SHARED_DATA_H_
