// One definition of what an MoE layer's routing report says (MoeStats in
// docs/contracts.md, the Moe* alerts in docs/detectors.md, the
// trainwatch_moe_* series in docs/metrics.md): its load
// spread (max/mean, n90: the fewest experts that carry 90% of it),
// its dead experts, the assignments per expert-parallel block, and the
// report's worst layer. The detectors and /metrics both read it.
//
// Pure: no state, no allocation beyond the result.
#ifndef TRAINWATCH_SERVER_HEALTH_SIGNALS_MOE_LOAD_H_
#define TRAINWATCH_SERVER_HEALTH_SIGNALS_MOE_LOAD_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

struct MoeLayerLoad {
  uint64_t total = 0;          // assignments in the report
  uint64_t max = 0;            // the hottest expert's
  double max_over_mean = 0.0;  // the hottest expert's over the mean (1 = even)
  uint32_t dead = 0;           // experts with no assignment
};

// nullopt when the layer carries no counts (aggregates only) or none > 0.
std::optional<MoeLayerLoad> LoadOf(const v1::MoeLayerStats& layer);

// The fewest experts that carry 90% of the layer's assignments (its counts
// sorted: E log E), or, when more than `at_most` experts must, at_most + 1
// without sorting: an upper bound on what the at_most busiest carry, from
// the counts in 32 buckets up to the largest, is under 90%. Exact for
// "<= at_most".
uint32_t ExpertsFor90(const v1::MoeLayerStats& layer, const MoeLayerLoad& load,
                      uint32_t at_most);

// Assignments per expert-parallel block (experts in contiguous blocks of
// num_experts / ep_size); empty when the counts do not divide evenly.
std::vector<uint64_t> BlockLoads(const v1::MoeLayerStats& layer, uint32_t ep_size);

// The share of a report's routed assignments dropped over capacity, over
// the layers with counts that say what they dropped (nullopt: none said).
class MoeDrops {
 public:
  void Add(const v1::MoeLayerStats& layer, const MoeLayerLoad& load) {
    assigned_ += load.total;
    if (layer.has_dropped()) {
      any_ = true;
      dropped_ += layer.dropped();
    }
  }
  std::optional<double> fraction() const {
    if (!any_ || assigned_ == 0) return std::nullopt;
    return static_cast<double>(dropped_) / static_cast<double>(assigned_);
  }

 private:
  uint64_t assigned_ = 0, dropped_ = 0;
  bool any_ = false;
};

// The report's worst layer for each series (trainwatch_moe_*): nullopt where
// no layer said.
struct MoeReportSummary {
  std::optional<double> load_max_over_mean;  // the largest over layers
  std::optional<uint32_t> dead_experts;      // summed over layers
  std::optional<double> dropped_fraction;    // sum dropped / sum assignments
  std::optional<double> aux_loss;            // the largest over layers
  std::optional<double> router_z_loss;       // the largest over layers
};
MoeReportSummary Summarize(const v1::MoeStats& moe);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SIGNALS_MOE_LOAD_H_
