// The one way a test waits for something another thread or process does:
// poll `condition` until it holds or the deadline passes (generous: a slow
// CI machine must not fail a correct test). Returns whether it held; assert
// on that, with what was awaited in the message.
#ifndef TRAINWATCH_TESTS_COMMON_EVENTUALLY_H_
#define TRAINWATCH_TESTS_COMMON_EVENTUALLY_H_

#include <chrono>
#include <thread>

namespace trainwatch::testing {

template <typename Condition>
bool Eventually(Condition condition,
                std::chrono::milliseconds deadline = std::chrono::seconds(120),
                std::chrono::milliseconds poll = std::chrono::milliseconds(10)) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_COMMON_EVENTUALLY_H_
