#include "mpmc_queue.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace trainwatch::internal {
namespace {

TEST(MpmcQueue, RoundsCapacityUpToPowerOfTwo) {
  EXPECT_EQ(MpmcQueue<int>(1).capacity(), 2u);
  EXPECT_EQ(MpmcQueue<int>(100).capacity(), 128u);
  EXPECT_EQ(MpmcQueue<int>(128).capacity(), 128u);
}

TEST(MpmcQueue, SingleThreadFifo) {
  MpmcQueue<int> queue(8);
  EXPECT_FALSE(queue.TryPop().has_value());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(queue.TryEmplace(i));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(queue.TryPop(), i);
  EXPECT_FALSE(queue.TryPop().has_value());
}

TEST(MpmcQueue, PushFailsWhenFullAndLeavesArgumentAlone) {
  MpmcQueue<std::unique_ptr<int>> queue(4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(queue.TryEmplace(std::make_unique<int>(i)));
  }
  auto extra = std::make_unique<int>(99);
  EXPECT_FALSE(queue.TryEmplace(std::move(extra)));
  ASSERT_NE(extra, nullptr);  // not consumed by the failed push
  EXPECT_EQ(*extra, 99);
  EXPECT_EQ(*queue.TryPop().value(), 0);
  EXPECT_TRUE(queue.TryEmplace(std::move(extra)));
}

TEST(MpmcQueue, WrapsAroundManyLaps) {
  MpmcQueue<int> queue(4);
  int next_in = 0;
  int next_out = 0;
  // Uneven pushes and pops so head and tail cross the end at every offset.
  for (int round = 0; round < 1000; ++round) {
    const int pushes = 1 + round % 4;
    for (int i = 0; i < pushes && queue.TryEmplace(next_in); ++i) ++next_in;
    const int pops = 1 + (round * 7) % 4;
    for (int i = 0; i < pops; ++i) {
      std::optional<int> value = queue.TryPop();
      if (!value) break;
      ASSERT_EQ(*value, next_out++);
    }
  }
  while (std::optional<int> value = queue.TryPop()) {
    ASSERT_EQ(*value, next_out++);
  }
  EXPECT_EQ(next_out, next_in);
  EXPECT_GT(next_in, 1000);
}

TEST(MpmcQueue, DestroysItemsLeftInQueue) {
  auto counted = std::make_shared<int>(0);
  {
    MpmcQueue<std::shared_ptr<int>> queue(4);
    ASSERT_TRUE(queue.TryEmplace(counted));
    ASSERT_TRUE(queue.TryEmplace(counted));
    EXPECT_EQ(counted.use_count(), 3);
  }
  EXPECT_EQ(counted.use_count(), 1);
}

TEST(MpmcQueue, ManyProducersManyConsumersDeliverEachItemOnce) {
  constexpr int kProducers = 4;
  constexpr int kConsumers = 2;
  constexpr int kPerProducer = 100000;
  constexpr int kTotal = kProducers * kPerProducer;
  // Small, so producers keep running into a full queue and laps wrap often.
  MpmcQueue<int> queue(1024);
  std::vector<std::atomic<int>> seen(kTotal);
  std::atomic<int> consumed{0};

  std::vector<std::thread> threads;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&queue, p] {
      for (int i = 0; i < kPerProducer; ++i) {
        while (!queue.TryEmplace(p * kPerProducer + i)) std::this_thread::yield();
      }
    });
  }
  for (int c = 0; c < kConsumers; ++c) {
    threads.emplace_back([&] {
      // Per producer, items must come out in the order they went in.
      std::vector<int> last(kProducers, -1);
      while (consumed.load() < kTotal) {
        std::optional<int> value = queue.TryPop();
        if (!value) {
          std::this_thread::yield();
          continue;
        }
        const int producer = *value / kPerProducer;
        EXPECT_GT(*value, last[producer]);
        last[producer] = *value;
        seen[*value].fetch_add(1);
        consumed.fetch_add(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  EXPECT_FALSE(queue.TryPop().has_value());
  int missing = 0;
  int duplicated = 0;
  for (const std::atomic<int>& count : seen) {
    if (count.load() == 0) ++missing;
    if (count.load() > 1) ++duplicated;
  }
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(duplicated, 0);
}

}  // namespace
}  // namespace trainwatch::internal
