#include "engine/shard.h"

namespace trainwatch {

Shard::Shard() : thread_([this] { Loop(); }) {}

Shard::~Shard() { Stop(); }

void Shard::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      tasks_.push_back(std::move(task));
      cv_.Signal();
      return;
    }
  }
  task();
}

void Shard::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void Shard::Loop() {
  std::deque<std::function<void()>> batch;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && tasks_.empty()) cv_.Wait(&mu_);
      if (tasks_.empty()) return;
      batch.swap(tasks_);
    }
    for (auto& task : batch) task();
    batch.clear();
  }
}

}  // namespace trainwatch
