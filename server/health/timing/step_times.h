// Step times across ranks and the input pipeline (docs/detectors.md RankStraggler,
// InputPipelineStall): the pure state the detectors read. Single-threaded: fed
// and read by the run's pipeline only.
#ifndef TRAINWATCH_SERVER_HEALTH_TIMING_STEP_TIMES_H_
#define TRAINWATCH_SERVER_HEALTH_TIMING_STEP_TIMES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "health/health_config.h"

namespace trainwatch {

// Per-rank step times of one run, judged against the median rank.
//
// Memory: 16 bytes a rank (level, CUSUM, host index, record count) plus 4
// bytes a rank of scratch for the median, plus each distinct host name once.
// The median over ranks is recomputed once per round of records (every
// `ranks with a level` records), so a record costs O(1) amortized.
//
// Ranks of a synchronous job wait for each other in the collectives, so their
// wall time between optimizer steps converges; a trainer that wants its
// stragglers named reports the time before the wait (compute + its own
// input), which is what step_time_s then carries (docs/goodput-and-stragglers.md).
class RankStepTimes {
 public:
  explicit RankStepTimes(const StragglerConfig& config) : config_(config) {}
  RankStepTimes(const RankStepTimes&) = delete;
  RankStepTimes& operator=(const RankStepTimes&) = delete;

  // The machine `rank` runs on (its RunStart.host; "" = unknown).
  void SetHost(uint32_t rank, std::string_view host);
  // A record of `rank` that took `seconds` (its step_time_s). Non-positive
  // or non-finite times are ignored.
  void Add(uint32_t rank, double seconds);

  // Enough ranks have a level for the median to mean something.
  bool ready() const { return median_.has_value(); }
  // Median over ranks of their levels, and the largest level, in seconds.
  double median_seconds() const;
  double max_seconds() const;
  // 1 - median/max: the share of each step the run spends waiting for its
  // slowest rank (0 when not ready).
  double lost_fraction() const;
  // The rank whose CUSUM passed the threshold, the largest if several.
  std::optional<uint32_t> Suspect() const;
  // A rank's level over the median rank's (1 when unknown).
  double Ratio(uint32_t rank) const;
  // Ranks whose level is at least `ratio` x the median.
  uint32_t RanksAtLeast(double ratio) const;
  const std::string& HostOf(uint32_t rank) const;

  struct RankDetail {
    uint32_t rank = 0;
    std::string host;
    double seconds = 0.0;  // the rank's level
    double ratio = 1.0;    // over the median rank's
  };
  // The `n` slowest ranks by level, slowest first (per-rank detail for
  // `health`; there is no per-rank metric series).
  std::vector<RankDetail> Slowest(size_t n) const;

  size_t ranks() const { return ranks_.size(); }
  // Heap bytes held (for the per-run budget, docs/performance.md).
  size_t MemoryBytes() const;

 private:
  struct Rank {
    float level = 0.0f;  // EMA of log seconds
    float cusum = 0.0f;
    uint32_t host = 0;     // index into hosts_; 0 = unknown ("")
    uint32_t records = 0;  // saturates; 0 = no level yet
  };
  void Recompute();

  const StragglerConfig& config_;
  std::vector<Rank> ranks_;
  std::vector<std::string> hosts_{""};
  absl::flat_hash_map<std::string, uint32_t> host_index_;
  std::vector<float> scratch_;
  std::optional<float> median_;  // log seconds
  float max_level_ = 0.0f;
  uint32_t leveled_ = 0;  // ranks with a level
  uint32_t since_recompute_ = 0;
  std::optional<uint32_t> worst_;  // largest CUSUM over the threshold
};

// The lead rank's input-pipeline waits over its recent steps. 132 bytes.
class InputWait {
 public:
  static constexpr size_t kSteps = 32;
  // A lead record with both times (others are ignored).
  void Add(double step_time_s, double data_wait_s);
  bool ready() const { return count_ >= kSteps / 2; }
  // Median of data_wait_s / step_time_s over the recent steps.
  double MedianFraction() const;
  // The last record's data_wait_s / step_time_s.
  double last_fraction() const { return last_; }

 private:
  std::array<float, kSteps> fractions_{};
  uint32_t next_ = 0;
  uint32_t count_ = 0;
  float last_ = 0.0f;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_TIMING_STEP_TIMES_H_
