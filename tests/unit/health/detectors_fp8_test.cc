// The FP8 detectors (detectors/fp8.cc) on simulated per-tensor delayed
// scaling (the recipe of Transformer Engine: the cast of step t uses
// fmt_max / max(amax history through t-1) / 2^margin), through the real
// RunHealth and alert tracker.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health_test_util.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::trainwatch::testing::HealthHarness;
using ::trainwatch::testing::Rec;

RunInfo Fp8Info(uint32_t world_size = 1) {
  RunInfo info;
  info.run_id = "fp8-run";
  info.precision = v1::BF16;
  info.max_norm = 1.0;
  info.world_size = world_size;
  return info;
}

double FormatMax(v1::Fp8Format f) {
  return f == v1::E4M3 ? 448.0 : f == v1::E4M3_FNUZ ? 240.0 : 57344.0;
}

// One tensor's delayed scaling. `recipe_max` is the format max the recipe
// computes its scale with (a wrong one reproduces Fp8ScaleMismatch).
struct Tensor {
  v1::Fp8Format format = v1::E4M3;
  double recipe_max = 448.0;
  uint32_t history_len = 16;
  // The tensor's values: a Gaussian bulk with amax ~5 sd (bulk_sd 0), or a
  // bulk of fixed sd under an outlier feature that holds `outlier_share` of
  // the elements near the amax.
  double bulk_sd = 0.0;
  double outlier_share = 0.0;
  std::deque<double> history;
  double scale = 1.0;

  // This step's stats with amax `amax` (the scale is the one computed after
  // the previous step), then the recipe's update.
  v1::Fp8TensorStats Step(double amax, bool report_shares = true) {
    v1::Fp8TensorStats s;
    s.set_format(format);
    s.set_amax(amax);
    s.set_scale(scale);
    s.set_amax_history_len(history_len);
    s.set_margin(0);
    if (report_shares) {
      const double scaled = amax * scale / FormatMax(format);
      const double sd = bulk_sd > 0 ? bulk_sd : amax / 5;
      // Past the format max: the outlier feature, and the bulk's tail.
      double over = 0.0;
      if (scaled > 1.0) {
        over = outlier_share + std::erfc(FormatMax(format) / scale / sd / std::sqrt(2.0));
      }
      s.set_overflow_fraction(std::min(1.0, over));
      // The bulk's share below half the smallest subnormal.
      const double tiny = std::ldexp(1.0, format == v1::E4M3 ? -10 : -11) / scale;
      s.set_underflow_fraction(std::erf(tiny / (sd * std::sqrt(2.0))));
    }
    history.push_front(amax);
    if (history.size() > history_len) history.pop_back();
    const double m = *std::max_element(history.begin(), history.end());
    if (m > 0) scale = recipe_max / m;
    return s;
  }
};

// A run whose tensors report every `every` steps (their recipes update
// every step); amax(name, step) gives each tensor's amax.
class Fp8Run {
 public:
  using Amax = std::function<double(const std::string&, uint64_t)>;

  Fp8Run(HealthHarness& h, uint64_t every, uint64_t seed = 3)
      : h_(h), every_(every), rng_(seed) {
    for (const char* name : {"l0.fc1:input", "l0.fc1:weight", "l0.fc2:input",
                             "l0.fc2:weight", "l1.fc1:input", "l1.fc1:weight"}) {
      tensors_[name] = Tensor{};
    }
  }

  std::map<std::string, Tensor>& tensors() { return tensors_; }

  // Ordinary amax noise: lognormal around a level per tensor.
  double Noisy(const std::string& name, double sd = 0.15) {
    std::lognormal_distribution<double> noise(0.0, sd);
    const double level = name.find("weight") != std::string::npos ? 0.2 : 4.0;
    return level * noise(rng_);
  }

  void Feed(uint64_t end, const Amax& amax = nullptr) {
    for (; step_ < end; ++step_) {
      v1::StepRecord r = Rec(step_, 0.5);
      for (auto& [name, t] : tensors_) {
        const double a = amax ? amax(name, step_) : Noisy(name);
        v1::Fp8TensorStats s = t.Step(a);
        if (step_ % every_ == 0) (*r.mutable_fp8())[name] = s;
      }
      h_.Lead(r);
    }
  }
  uint64_t step() const { return step_; }

 private:
  HealthHarness& h_;
  uint64_t every_;
  std::mt19937_64 rng_;
  uint64_t step_ = 0;
  std::map<std::string, Tensor> tensors_;
};

std::vector<std::string> Fp8Fired(const HealthHarness& h) {
  std::vector<std::string> out;
  for (const std::string& n : h.FiredNames()) {
    if (n.rfind("Fp8", 0) == 0) out.push_back(n);
  }
  return out;
}

TEST(Fp8Detectors, HealthyRunsWithAmaxNoiseAreSilent) {
  for (uint64_t every : {1, 10, 100}) {
    HealthHarness h(Fp8Info());
    Fp8Run run(h, every, 11 + every);
    run.Feed(5000);
    EXPECT_THAT(Fp8Fired(h), IsEmpty()) << "reports every " << every << ::testing::PrintToString(h.transitions.empty() ? std::string() : h.transitions[0].description + " @" + std::to_string(h.transitions[0].step));
  }
  // Noisier amaxes (sd 0.3: a 1.8x swing between reports) stay silent too.
  HealthHarness h(Fp8Info());
  Fp8Run run(h, 10);
  run.Feed(5000, [&](const std::string& name, uint64_t) { return run.Noisy(name, 0.3); });
  EXPECT_THAT(Fp8Fired(h), IsEmpty()) << ::testing::PrintToString(h.transitions.empty() ? std::string() : h.transitions[0].description + " @" + std::to_string(h.transitions[0].step));
}

TEST(Fp8Detectors, EarlyGrowthThatLevelsOffIsNotAGrowthAlert) {
  // Weights leaving their init: amax x2.5 over the first 300 steps, flat after.
  HealthHarness h(Fp8Info());
  Fp8Run run(h, 10);
  run.Feed(3000, [&](const std::string& name, uint64_t step) {
    return run.Noisy(name, 0.05) * (1.0 + 1.5 * std::min(1.0, step / 300.0));
  });
  EXPECT_THAT(Fp8Fired(h), IsEmpty());
}

TEST(Fp8Overflow, AGrowingOutlierSaturatesWithinTwentyReports) {
  HealthHarness h(Fp8Info());
  Fp8Run run(h, 10);
  const uint64_t onset = 1000;
  run.tensors()["l0.fc2:input"].outlier_share = 1.0 / 64;
  run.tensors()["l0.fc2:input"].bulk_sd = 0.8;
  run.Feed(1600, [&](const std::string& name, uint64_t step) {
    const double a = run.Noisy(name, 0.05);
    if (name != "l0.fc2:input" || step < onset) return a;
    return a * std::pow(1.05, std::min<double>(step - onset + 1, 150));
  });
  const auto fired = h.Fired(AlertKind::kFp8Overflow);
  ASSERT_EQ(fired.size(), 1u) << ::testing::PrintToString(h.FiredNames());
  EXPECT_GE(fired[0].step, onset);
  EXPECT_LE(fired[0].step, onset + 20 * 10);
  EXPECT_THAT(fired[0].description, HasSubstr("l0.fc2:input"));
  // Flat again after the growth: the scale catches up and it resolves.
  EXPECT_EQ(h.Resolved(AlertKind::kFp8Overflow).size(), 1u);
}

TEST(Fp8Overflow, WithoutSharesTheScaledAmaxAboveTheMaxCounts) {
  HealthHarness h(Fp8Info());
  const uint64_t onset = 500;
  std::map<std::string, Tensor> tensors{{"x:input", Tensor{}}};
  for (uint64_t step = 0; step < 800; ++step) {
    v1::StepRecord r = Rec(step, 0.5);
    const double amax = 4.0 * (step < onset ? 1.0 : std::pow(1.03, step - onset + 1));
    v1::Fp8TensorStats s = tensors["x:input"].Step(amax, /*report_shares=*/false);
    if (step % 10 == 0) (*r.mutable_fp8())["x:input"] = s;
    h.Lead(r);
  }
  const auto fired = h.Fired(AlertKind::kFp8Overflow);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_LE(fired[0].step, onset + 20 * 10);
}

TEST(Fp8Underflow, FiresOnAFlushedBulkNotOnAFewFlushedValues) {
  for (double share : {0.3, 0.05}) {
    HealthHarness h(Fp8Info());
    Fp8Run run(h, 10);
    run.Feed(500);
    for (uint64_t step = 500; step < 800; ++step) {
      v1::StepRecord r = Rec(step, 0.5);
      if (step % 10 == 0) {
        v1::Fp8TensorStats& s = (*r.mutable_fp8())["l1.fc1:weight"];
        s.set_format(v1::E4M3);
        s.set_amax(0.2);
        s.set_scale(448 / 0.2);
        s.set_amax_history_len(16);
        s.set_underflow_fraction(share);
      }
      h.Lead(r);
    }
    EXPECT_EQ(h.Fired(AlertKind::kFp8Underflow).size(), share > 0.1 ? 1u : 0u) << share;
  }
}

TEST(Fp8ScaleMismatch, TheE4M3MaxUsedForE4M3FnuzIsNamedAtTheFirstReport) {
  for (uint64_t every : {1, 10, 100}) {
    HealthHarness h(Fp8Info());
    Fp8Run run(h, every);
    for (auto& [name, t] : run.tensors()) {
      t.format = v1::E4M3_FNUZ;
      t.recipe_max = 448.0;  // the bug
    }
    run.Feed(1000);
    const auto fired = h.Fired(AlertKind::kFp8ScaleMismatch);
    ASSERT_EQ(fired.size(), 1u) << "reports every " << every;
    // Step 0 casts with the initial scale 1: the first report with a
    // recipe scale is the first after it.
    EXPECT_EQ(fired[0].step, every) << "reports every " << every;
    EXPECT_THAT(fired[0].description, HasSubstr("E4M3_FNUZ"));
    EXPECT_THAT(fired[0].description, HasSubstr("448/240"));
    // Its saturated casts are the consequence, not a page of their own.
    for (const auto& t : h.Fired(AlertKind::kFp8Overflow)) {
      EXPECT_EQ(t.caused_by, "Fp8ScaleMismatch");
    }
  }
}

TEST(Fp8ScaleMismatch, TheReverseIsNamedOnceTheWholeHistoryIsReported) {
  // 240 used for E4M3 (448): scales 0.54x what the recipe gives. Only a
  // run that reports every step shows the whole amax history.
  for (uint64_t every : {1, 10}) {
    HealthHarness h(Fp8Info());
    Fp8Run run(h, every);
    for (auto& [name, t] : run.tensors()) t.recipe_max = 240.0;
    run.Feed(600);
    EXPECT_EQ(h.Fired(AlertKind::kFp8ScaleMismatch).size(), every == 1 ? 1u : 0u)
        << "reports every " << every;
    if (every == 1) {
      EXPECT_EQ(h.Fired(AlertKind::kFp8ScaleMismatch)[0].step, 1u);
      EXPECT_THAT(h.Fired(AlertKind::kFp8ScaleMismatch)[0].description, HasSubstr("240/448"));
    }
  }
}

TEST(Fp8ScaleMismatch, OneOddTensorIsNotMostTensors) {
  HealthHarness h(Fp8Info());
  Fp8Run run(h, 1);
  run.tensors()["l0.fc1:input"].recipe_max = 1000.0;
  run.Feed(500);
  EXPECT_THAT(h.Fired(AlertKind::kFp8ScaleMismatch), IsEmpty());
}

// Two tensor-parallel ranks of one amax_group; `synced` reduces the amax.
void FeedRanks(HealthHarness& h, bool synced, bool rank1_first, uint64_t steps,
               uint64_t every) {
  std::mt19937_64 rng(9);
  std::lognormal_distribution<double> noise(0.0, 0.1);
  Tensor t0, t1;
  for (uint64_t step = 0; step < steps; ++step) {
    const double a0 = 0.2 * noise(rng), a1 = 0.2 * noise(rng);
    const double g = std::max(a0, a1);
    v1::Fp8TensorStats s0 = t0.Step(synced ? g : a0), s1 = t1.Step(synced ? g : a1);
    s0.set_amax_group("tp0");
    s1.set_amax_group("tp0");
    v1::StepRecord r0 = Rec(step, 0.5), r1 = Rec(step, 0.5);
    if (step % every == 0) {
      (*r0.mutable_fp8())["l0.qkv:weight"] = s0;
      (*r1.mutable_fp8())["l0.qkv:weight"] = s1;
    }
    if (rank1_first) {
      h.Rank(1, r1);
      h.Lead(r0);
    } else {
      h.Lead(r0);
      h.Rank(1, r1);
    }
  }
}

TEST(Fp8AmaxDesync, UnsynchronisedRanksAreNamedAtTheFirstReportInAnyOrder) {
  std::vector<std::string> descriptions;
  for (bool rank1_first : {false, true}) {
    HealthHarness h(Fp8Info(2));
    FeedRanks(h, /*synced=*/false, rank1_first, 1000, 10);
    const auto fired = h.Fired(AlertKind::kFp8AmaxDesync);
    ASSERT_EQ(fired.size(), 1u) << "rank 1 first: " << rank1_first;
    EXPECT_EQ(fired[0].step, 0u);
    descriptions.push_back(fired[0].description);
    EXPECT_THAT(fired[0].description, HasSubstr("l0.qkv:weight in amax_group tp0"));
    EXPECT_THAT(h.Resolved(AlertKind::kFp8AmaxDesync), IsEmpty());
  }
  EXPECT_EQ(descriptions[0], descriptions[1]);
}

TEST(Fp8AmaxDesync, SynchronisedRanksAreSilent) {
  HealthHarness h(Fp8Info(2));
  FeedRanks(h, /*synced=*/true, false, 1000, 10);
  EXPECT_THAT(h.Fired(AlertKind::kFp8AmaxDesync), IsEmpty());
}

TEST(Fp8AmaxDesync, SparseReportsDoNotFlap) {
  // Reports every 250 steps, farther apart than resolve_after_steps (100).
  HealthHarness h(Fp8Info(2));
  FeedRanks(h, /*synced=*/false, false, 3000, 250);
  EXPECT_EQ(h.Fired(AlertKind::kFp8AmaxDesync).size(), 1u);
  EXPECT_THAT(h.Resolved(AlertKind::kFp8AmaxDesync), IsEmpty());
}

TEST(Fp8AmaxGrowth, AGrowingOutlierIsForecastLongBeforeTheBulkUnderflows) {
  HealthHarness h(Fp8Info());
  Fp8Run run(h, 10);
  const uint64_t onset = 500;
  run.tensors()["l1.fc1:input"].bulk_sd = 0.8;  // the bulk stays, the outliers grow
  run.Feed(3000, [&](const std::string& name, uint64_t step) {
    const double a = run.Noisy(name, 0.05);
    if (name != "l1.fc1:input" || step < onset) return a;
    return a * std::pow(1.008, step - onset);  // x1000 in ~860 steps
  });
  const auto growth = h.Fired(AlertKind::kFp8AmaxGrowth);
  const auto under = h.Fired(AlertKind::kFp8Underflow);
  ASSERT_EQ(growth.size(), 1u);
  ASSERT_EQ(under.size(), 1u);
  EXPECT_GE(under[0].step, growth[0].step + 500);
  EXPECT_EQ(under[0].caused_by, "Fp8AmaxGrowth");
  EXPECT_THAT(growth[0].description, HasSubstr("l1.fc1:input"));
  EXPECT_THAT(growth[0].description, HasSubstr("forecast to reach 100x"));
}

TEST(Fp8Detectors, SparsePersistentConditionsAreOneEpisode) {
  // Reports every 200 steps with a persistent overflow on one tensor.
  HealthHarness h(Fp8Info());
  for (uint64_t step = 0; step < 4000; ++step) {
    v1::StepRecord r = Rec(step, 0.5);
    if (step % 200 == 0) {
      v1::Fp8TensorStats& s = (*r.mutable_fp8())["x:input"];
      s.set_format(v1::E5M2);
      s.set_amax(100);
      s.set_scale(500);
      s.set_amax_history_len(1024);
      s.set_overflow_fraction(step >= 1000 ? 0.01 : 0.0);
    }
    h.Lead(r);
  }
  EXPECT_EQ(h.Fired(AlertKind::kFp8Overflow).size(), 1u);
  EXPECT_THAT(h.Resolved(AlertKind::kFp8Overflow), IsEmpty());
}

}  // namespace
}  // namespace trainwatch
