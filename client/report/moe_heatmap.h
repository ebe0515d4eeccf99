// The report's MoE section: each layer's load per expert over the run, as the
// share of the layer's routed assignments each expert got in each column of
// steps, relative to an even share (1/E). A healthy layer is even, a dead
// expert is 0 and a collapse shows as a few hot rows over cold ones.
#ifndef TRAINWATCH_CLIENT_REPORT_MOE_HEATMAP_H_
#define TRAINWATCH_CLIENT_REPORT_MOE_HEATMAP_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "output/json_out.h"
#include "report/columns.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::cli {

struct MoeHeatmapLayer {
  std::string name;            // MoeLayerStats.layer
  uint32_t experts = 0;        // E: the longest tokens_per_expert seen
  std::vector<uint32_t> rows;  // the experts drawn, ascending
  // load[row][column]: the row's expert's assignments over the column's
  // steps in percent of an even share (100 = 1/E of the layer's), rounded,
  // and at least 1 when it got any: 0 means none. -1: the layer sent no
  // counts in that column.
  std::vector<std::vector<int32_t>> load;
};

struct MoeHeatmap {
  std::vector<uint64_t> x;  // the first step with counts of each column drawn
  std::vector<MoeHeatmapLayer> layers;  // in the order they first appear
};

// The heatmap of `records` (ascending steps) over the report's step range
// [first, last], or nullopt when no record carries tokens_per_expert (a run
// without MoE, or an import with aggregates only). At most
// kMoeExpertRows experts per layer (the ones furthest from an even share)
// and kMoeHeatmapCells cells, in at most kMoeHeatmapColumns columns.
std::optional<MoeHeatmap> BuildMoeHeatmap(
    const std::vector<v1::StepRecord>& records, uint64_t first, uint64_t last);

// The heatmap as the page's "moe" object; `alerts` are the alert names
// marked over it.
void WriteMoeHeatmap(JsonWriter& w, const MoeHeatmap& heatmap,
                     const std::vector<std::string>& alerts);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_REPORT_MOE_HEATMAP_H_
