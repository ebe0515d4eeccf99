#include "engine/shard.h"

#include <pthread.h>

namespace trainwatch {

Shard::Shard() : thread_([this] { Loop(); }) {}

Shard::~Shard() { Stop(); }

void Shard::Post(std::function<void()> task, Lane lane) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      (lane == Lane::kPrompt ? prompt_ : tasks_).push_back(std::move(task));
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
  pthread_setname_np(pthread_self(), "tw-shard");  // for top -H and perf
  std::deque<std::function<void()>> prompt;
  std::function<void()> next;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && tasks_.empty() && prompt_.empty()) cv_.Wait(&mu_);
      if (tasks_.empty() && prompt_.empty()) return;  // stopping, drained
      // Every prompt task queued, then one normal task: prompt ones posted
      // meanwhile go first, and a stream of them cannot starve the normal
      // lane.
      prompt.swap(prompt_);
      if (!tasks_.empty()) {
        next = std::move(tasks_.front());
        tasks_.pop_front();
      }
    }
    for (auto& task : prompt) task();
    prompt.clear();
    if (next) {
      next();
      next = nullptr;
    }
  }
}

}  // namespace trainwatch
