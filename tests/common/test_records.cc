#include "test_records.h"

#include <algorithm>
#include <cmath>
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

RealisticMoe::RealisticMoe(uint64_t seed, int layers, int experts)
    : layers_(layers), experts_(experts), rng_(seed),
      share_(static_cast<size_t>(layers) * static_cast<size_t>(experts)) {
  std::lognormal_distribution<double> skew(0.0, 0.25);
  for (double& s : share_) s = skew(rng_);
}

void RealisticMoe::AddTo(v1::StepRecord& r, const std::string& prefix, const std::string& suffix,
                         bool aux_loss) {
  const double mean = 1'048'576.0 * 8 / experts_;
  for (int l = 0; l < layers_; ++l) {
    v1::MoeLayerStats& layer = *r.mutable_moe()->add_layers();
    layer.set_layer(prefix + std::to_string(l) + suffix);
    for (int e = 0; e < experts_; ++e) {
      layer.add_tokens_per_expert(static_cast<uint64_t>(std::max(
          0.0, std::round(mean * share_[static_cast<size_t>(l * experts_ + e)] *
                          (1 + noise_(rng_))))));
    }
    if (aux_loss) layer.set_aux_loss(1.0 + 0.001 * l);
  }
}

}  // namespace trainwatch::testing
