// What the unit tests of the store and the engine send: a RunStart and runs
// of step records, built one way for all of them.
#ifndef TRAINWATCH_TESTS_COMMON_TEST_RECORDS_H_
#define TRAINWATCH_TESTS_COMMON_TEST_RECORDS_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::testing {

// A RunStart of a 2-rank BF16 run clipping at max_norm 1.0, labelled
// model=tiny.
v1::RunStart Start(const std::string& run, uint32_t rank = 0,
                   uint32_t attempt = 0, uint64_t warmup_steps = 0);

using StepRecords = google::protobuf::RepeatedPtrField<v1::StepRecord>;

// Records of steps [from, to), each with grad_norm `norm` (clipped when
// above 1.0, the max_norm of Start) and batch id 2 * step.
StepRecords Steps(uint64_t from, uint64_t to, double norm = 0.5);

// The same records as a StepBatch.
v1::StepBatch Batch(uint64_t from, uint64_t to, double norm = 0.5);

// A large MoE run's router counts, as a trainer sends them: 1M tokens a
// global batch at top-8 (65,536 assignments an expert on average), a
// persistent skew over each layer's experts (lognormal, sigma 0.25) drawn
// once, and each count moving 3% (one sigma) from one report to the next.
// Counts are ~3-byte varints. Its draws follow one generator from `seed`,
// so the same calls give the same reports.
class RealisticMoe {
 public:
  explicit RealisticMoe(uint64_t seed, int layers = 48, int experts = 128);
  // Appends one report's layers to `r`, layer l named prefix + l + suffix,
  // with an aux loss of 1 + 0.001 l when `aux_loss`.
  void AddTo(v1::StepRecord& r, const std::string& prefix = "", const std::string& suffix = "",
             bool aux_loss = true);

 private:
  int layers_, experts_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> noise_{0.0, 0.03};
  std::vector<double> share_;  // layer-major
};

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_COMMON_TEST_RECORDS_H_
