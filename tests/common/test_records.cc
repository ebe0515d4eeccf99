#include "test_records.h"

#include <utility>

namespace trainwatch::testing {

v1::RunStart Start(const std::string& run, uint32_t rank, uint32_t attempt,
                   uint64_t warmup_steps) {
  v1::RunStart s;
  s.set_run_id(run);
  s.set_rank(rank);
  s.set_world_size(2);
  s.set_attempt(attempt);
  s.set_precision(v1::BF16);
  s.set_max_norm(1.0);
  s.set_warmup_steps(warmup_steps);
  (*s.mutable_labels())["model"] = "tiny";
  return s;
}

StepRecords Steps(uint64_t from, uint64_t to, double norm) {
  StepRecords out;
  out.Reserve(to > from ? static_cast<int>(to - from) : 0);
  for (uint64_t step = from; step < to; ++step) {
    v1::StepRecord& r = *out.Add();
    r.set_step(step);
    r.set_grad_norm(norm);
    r.set_clipped(norm > 1.0);
    r.add_batch_ids(static_cast<int64_t>(2 * step));
  }
  return out;
}

v1::StepBatch Batch(uint64_t from, uint64_t to, double norm) {
  v1::StepBatch b;
  *b.mutable_records() = Steps(from, to, norm);
  return b;
}

}  // namespace trainwatch::testing
