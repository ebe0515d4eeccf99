#include "health/timing/spike_replay.h"

#include <algorithm>

namespace trainwatch {

SpikeOutcome SpikeReplay::Judge(Watched& w, bool recurred,
                                uint64_t recurrence_step) {
  w.judged = true;
  w.replaying = false;
  return SpikeOutcome{.spike_step = w.step,
                      .recurred = recurred,
                      .batches_skipped = !w.batch_ids.empty() && !w.batches_seen,
                      .recurrence_step = recurrence_step,
                      .batch_ids = w.batch_ids};
}

std::vector<SpikeOutcome> SpikeReplay::OnSpike(
    uint64_t step, const std::vector<int64_t>& batch_ids) {
  std::vector<SpikeOutcome> out;
  bool recurrence = false;
  for (Watched& w : watched_) {
    if (!w.replaying || w.judged) continue;
    const uint64_t lo = w.step > config_.tolerance_steps
                            ? w.step - config_.tolerance_steps
                            : 0;
    if (step >= lo && step <= w.step + config_.tolerance_steps) {
      out.push_back(Judge(w, /*recurred=*/true, step));
      recurrence = true;
    }
  }
  // A recurrence is judged already: watching it again would only wait for a
  // replay that says the same thing.
  if (recurrence) return out;
  watched_.erase(std::remove_if(watched_.begin(), watched_.end(),
                                [&](const Watched& w) {
                                  return w.judged || w.step == step;
                                }),
                 watched_.end());
  if (watched_.size() >= kMaxWatched) watched_.erase(watched_.begin());
  Watched w{.step = step, .batch_ids = batch_ids};
  w.ids.insert(batch_ids.begin(), batch_ids.end());
  watched_.push_back(std::move(w));
  return out;
}

void SpikeReplay::OnRewind(uint64_t first_step) {
  for (Watched& w : watched_) {
    if (!w.judged && w.step >= first_step) {
      w.replaying = true;
      w.batches_seen = false;
    }
  }
}

std::vector<SpikeOutcome> SpikeReplay::OnLeadRecord(
    uint64_t step, const std::vector<int64_t>& batch_ids) {
  std::vector<SpikeOutcome> out;
  for (Watched& w : watched_) {
    if (!w.replaying || w.judged) continue;
    if (!w.batches_seen) {
      for (int64_t id : batch_ids) {
        if (w.ids.contains(id)) {
          w.batches_seen = true;
          break;
        }
      }
    }
    if (step >= w.step + config_.judge_after_steps) {
      out.push_back(Judge(w, /*recurred=*/false, 0));
    }
  }
  return out;
}

std::vector<SpikeOutcome> SpikeReplay::OnFinish(uint64_t step) {
  std::vector<SpikeOutcome> out;
  for (Watched& w : watched_) {
    if (w.replaying && !w.judged && step > w.step) {
      out.push_back(Judge(w, /*recurred=*/false, 0));
    }
  }
  return out;
}

}  // namespace trainwatch
