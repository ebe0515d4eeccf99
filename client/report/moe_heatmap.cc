#include "report/moe_heatmap.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "report/report.h"

namespace trainwatch::cli {
namespace {

// One layer's assignments per (column, expert), summed over the column's
// records.
struct LayerCounts {
  std::string name;
  uint32_t experts = 0;
  std::vector<std::vector<uint64_t>> counts;  // [column][expert]
  std::vector<uint64_t> total;                // [column]
};

// How far an expert strays from an even share over the run: its largest
// ratio to 1/E, or the inverse of its smallest (capped, so that a dead expert
// counts as 100x off). Picks the rows drawn when a layer has more experts
// than kMoeExpertRows.
double Deviation(const LayerCounts& layer, uint32_t expert) {
  double worst = 1.0;
  for (size_t c = 0; c < layer.total.size(); ++c) {
    if (layer.total[c] == 0) continue;
    const double ratio = static_cast<double>(layer.counts[c][expert]) *
                         layer.experts / layer.total[c];
    worst = std::max({worst, ratio, 1.0 / std::max(ratio, 0.01)});
  }
  return worst;
}

std::vector<uint32_t> RowsDrawn(const LayerCounts& layer) {
  std::vector<uint32_t> rows(layer.experts);
  for (uint32_t e = 0; e < layer.experts; ++e) rows[e] = e;
  if (rows.size() <= kMoeExpertRows) return rows;
  std::vector<double> deviation(layer.experts);
  for (uint32_t e = 0; e < layer.experts; ++e) deviation[e] = Deviation(layer, e);
  std::stable_sort(rows.begin(), rows.end(), [&](uint32_t a, uint32_t b) {
    return deviation[a] > deviation[b];
  });
  rows.resize(kMoeExpertRows);
  std::sort(rows.begin(), rows.end());
  return rows;
}

// Percent of an even share, at least 1 for any assignment: 0 stays "none".
int32_t Load(uint64_t count, uint64_t total, uint32_t experts) {
  if (count == 0) return 0;
  const double percent = 100.0 * static_cast<double>(count) * experts / total;
  return std::max<int32_t>(1, static_cast<int32_t>(std::llround(percent)));
}

}  // namespace

std::optional<MoeHeatmap> BuildMoeHeatmap(
    const std::vector<v1::StepRecord>& records, uint64_t first, uint64_t last) {
  // The layers and their expert counts first: they set the column budget.
  std::vector<LayerCounts> layers;
  std::map<std::string, size_t> index;
  for (const v1::StepRecord& r : records) {
    for (const v1::MoeLayerStats& l : r.moe().layers()) {
      if (l.tokens_per_expert().empty()) continue;
      auto [it, added] = index.emplace(l.layer(), layers.size());
      if (added) layers.push_back(LayerCounts{.name = l.layer()});
      LayerCounts& layer = layers[it->second];
      layer.experts = std::max<uint32_t>(layer.experts, l.tokens_per_expert_size());
    }
  }
  if (layers.empty()) return std::nullopt;
  size_t rows = 0;
  for (const LayerCounts& l : layers) {
    rows += std::min<size_t>(l.experts, kMoeExpertRows);
  }
  const Downsampler ds(
      first, last,
      std::clamp<size_t>(kMoeHeatmapCells / rows, 1, kMoeHeatmapColumns));

  for (LayerCounts& l : layers) {
    l.counts.assign(ds.columns(), std::vector<uint64_t>(l.experts, 0));
    l.total.assign(ds.columns(), 0);
  }
  std::vector<bool> used(ds.columns(), false);
  std::vector<uint64_t> first_step(ds.columns(), 0);
  for (const v1::StepRecord& r : records) {
    const size_t c = ds.Column(r.step());
    for (const v1::MoeLayerStats& l : r.moe().layers()) {
      if (l.tokens_per_expert().empty()) continue;
      LayerCounts& layer = layers[index.at(l.layer())];
      for (int e = 0; e < l.tokens_per_expert_size(); ++e) {
        layer.counts[c][e] += l.tokens_per_expert(e);
        layer.total[c] += l.tokens_per_expert(e);
      }
      if (!used[c]) first_step[c] = r.step();
      used[c] = true;
    }
  }

  MoeHeatmap heatmap;
  std::vector<size_t> drawn;
  for (size_t c = 0; c < ds.columns(); ++c) {
    if (!used[c]) continue;
    drawn.push_back(c);
    heatmap.x.push_back(first_step[c]);
  }
  for (const LayerCounts& l : layers) {
    MoeHeatmapLayer out{.name = l.name, .experts = l.experts, .rows = RowsDrawn(l)};
    for (uint32_t e : out.rows) {
      std::vector<int32_t>& row = out.load.emplace_back();
      row.reserve(drawn.size());
      for (size_t c : drawn) {
        row.push_back(l.total[c] == 0 ? -1 : Load(l.counts[c][e], l.total[c], l.experts));
      }
    }
    heatmap.layers.push_back(std::move(out));
  }
  return heatmap;
}

void WriteMoeHeatmap(JsonWriter& w, const MoeHeatmap& heatmap,
                     const std::vector<std::string>& alerts) {
  w.BeginObject();
  w.Key("x");
  w.BeginArray();
  for (uint64_t x : heatmap.x) w.Uint(x);
  w.EndArray();
  w.Key("layers");
  w.BeginArray();
  for (const MoeHeatmapLayer& l : heatmap.layers) {
    w.BeginObject();
    w.Key("layer");
    w.String(l.name);
    w.Key("experts");
    w.Uint(l.experts);
    w.Key("rows");
    w.BeginArray();
    for (uint32_t e : l.rows) w.Uint(e);
    w.EndArray();
    w.Key("load");
    w.BeginArray();
    for (const std::vector<int32_t>& row : l.load) {
      w.BeginArray();
      for (int32_t v : row) {
        if (v < 0) {
          w.Null();
        } else {
          w.Int(v);
        }
      }
      w.EndArray();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.Key("alerts");
  w.BeginArray();
  for (const std::string& a : alerts) w.String(a);
  w.EndArray();
  w.EndObject();
}

}  // namespace trainwatch::cli
