// One definition of what an MoE layer's routing report says (MoeStats in
// docs/contracts.md, the Moe* alerts in docs/detectors.md, the
// trainwatch_moe_* series in docs/metrics.md): its load
// spread (max/mean, the effective number of experts, the largest share),
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
  double max_over_mean = 0.0;  // the hottest expert's over the mean (1 = even)
  // exp(entropy of the load): num_experts when even, top_k when every token
  // goes to the same top_k experts.
  double effective_experts = 0.0;
  double max_share = 0.0;      // the hottest expert's share of the assignments
  uint32_t hottest = 0;        // its index
  uint32_t dead = 0;           // experts with no assignment
};

// nullopt when the layer carries no counts (aggregates only) or none > 0.
std::optional<MoeLayerLoad> LoadOf(const v1::MoeLayerStats& layer);

// The fewest experts that carry 90% of the layer's assignments (its counts
// sorted: E log E), or, when `load` shows that more than `at_most` experts
// do, at_most + 1 without sorting: a load whose effective number of experts
// is above what 90% on at_most experts and 10% spread over the rest could
// give has no such at_most experts. Exact for "<= at_most".
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
