#include "engine/shard.h"

namespace trainwatch {

Shard::Shard() : thread_([this] { Loop(); }) {}

Shard::~Shard() { Stop(); }

void Shard::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      tasks_.push_back(std::move(task));
      cv_.notify_one();
      return;
    }
  }
  task();
}

void Shard::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void Shard::Loop() {
  std::deque<std::function<void()>> batch;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      batch.swap(tasks_);
    }
    for (auto& task : batch) task();
    batch.clear();
  }
}

}  // namespace trainwatch
