#include "store/codec/moe_counts.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "store/codec/golomb.h"
#include "store/codec/series.h"

namespace trainwatch::codec {
namespace {

// How a (layer, record)'s counts are predicted (2 bits).
enum Mode : int {
  kPrevious = 0,    // the layer's counts in its previous record
  kRecentMean = 1,  // the mean of its last 2, 4 or 8 records
  kOwnMean = 2,     // this record's own mean, stored
};
constexpr int kModes = 3;

// The most records kRecentMean averages: its prediction's noise is 1/8 of
// one record's, and counts that drift move little in 8 steps.
constexpr size_t kHistory = 8;

// The earlier counts of one layer (name and number of experts) in the chunk,
// the newest kHistory of them.
class History {
 public:
  void Add(const uint64_t* counts) { ring_[seen_++ % kHistory] = counts; }
  bool Empty() const { return seen_ == 0; }
  // How many records kRecentMean averages: a power of two, so the mean is a
  // shift; 0 when fewer than 2.
  size_t MeanOf() const {
    const size_t h = std::bit_floor(std::min(seen_, kHistory));
    return h >= 2 ? h : 0;
  }
  // The counts `back` records before the newest (0: the newest).
  const uint64_t* Back(size_t back) const { return ring_[(seen_ - 1 - back) % kHistory]; }

 private:
  std::array<const uint64_t*, kHistory> ring_{};
  size_t seen_ = 0;
};

// Keyed by the layer's name and number of experts: a layer whose experts
// change starts a history of its own.
using Histories = absl::flat_hash_map<std::pair<std::string_view, size_t>, History>;

uint64_t OwnMean(const uint64_t* v, size_t n) {
  unsigned __int128 sum = 0;
  for (size_t i = 0; i < n; ++i) sum += v[i];
  return static_cast<uint64_t>(sum / n);
}

// The prediction of each of n counts under `mode` (mean: kOwnMean's).
void Predict(Mode mode, const History& h, uint64_t mean, size_t n,
             std::vector<uint64_t>& pred) {
  pred.resize(n);
  if (mode == kOwnMean) {
    std::fill(pred.begin(), pred.end(), mean);
  } else if (mode == kPrevious) {
    std::copy(h.Back(0), h.Back(0) + n, pred.begin());
  } else {
    // floor(sum / 2^shift) without 128-bit sums: the quotients of the
    // parts above and below the shift, added (neither can overflow).
    const size_t records = h.MeanOf();
    const int shift = std::countr_zero(records);
    const uint64_t mask = records - 1;
    thread_local std::vector<uint64_t> low;
    low.assign(n, 0);
    std::fill(pred.begin(), pred.end(), 0);
    for (size_t b = 0; b < records; ++b) {
      const uint64_t* v = h.Back(b);
      for (size_t i = 0; i < n; ++i) {
        pred[i] += v[i] >> shift;
        low[i] += v[i] & mask;
      }
    }
    for (size_t i = 0; i < n; ++i) pred[i] += low[i] >> shift;
  }
}

struct Choice {
  Mode mode = kOwnMean;
  GolombChoice code;
};

// The cheapest prediction of `counts` and its code; residuals[mode] holds
// the zigzagged residuals under it.
Choice Choose(const History& h, const uint64_t* counts, size_t n, uint64_t mean,
              std::vector<uint64_t>& pred,
              std::array<std::vector<uint64_t>, kModes>& residuals) {
  Choice best;
  uint64_t best_cost = ~uint64_t{0};
  for (int m = 0; m < kModes; ++m) {
    const Mode mode = static_cast<Mode>(m);
    // A layer seen before is predicted from its history, which the counts
    // of one record's noise rarely beat; its first record from its mean.
    if (h.Empty() != (mode == kOwnMean)) continue;
    if (mode == kRecentMean && h.MeanOf() == 0) continue;
    Predict(mode, h, mean, n, pred);
    std::vector<uint64_t>& z = residuals[m];
    z.resize(n);
    for (size_t i = 0; i < n; ++i) z[i] = ZigZag(counts[i] - pred[i]);
    // Four histograms, so that increments of one width do not wait on
    // each other.
    std::array<WidthHistogram, 4> part{};
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      for (size_t j = 0; j < 4; ++j) ++part[j][std::bit_width(z[i + j])];
    }
    for (; i < n; ++i) ++part[0][std::bit_width(z[i])];
    WidthHistogram hist{};
    for (size_t b = 0; b < hist.size(); ++b) {
      hist[b] = part[0][b] + part[1][b] + part[2][b] + part[3][b];
    }
    const GolombChoice code = BestGolomb(hist, 0);
    const uint64_t cost = code.cost + (mode == kOwnMean ? 7 + std::bit_width(mean) : 0);
    if (cost < best_cost) {
      best_cost = cost;
      best = {.mode = mode, .code = code};
    }
  }
  return best;
}

}  // namespace

bool HasMoeCounts(const v1::MoeStats& report) {
  for (const v1::MoeLayerStats& layer : report.layers()) {
    if (!layer.tokens_per_expert().empty()) return true;
  }
  return false;
}

void PutMoeCounts(BitWriter& w, absl::Span<const v1::MoeStats* const> reports) {
  std::vector<uint64_t> lengths;
  for (const v1::MoeStats* report : reports) {
    for (const v1::MoeLayerStats& layer : report->layers()) {
      lengths.push_back(static_cast<uint64_t>(layer.tokens_per_expert_size()));
    }
  }
  PutSeries(w, lengths.data(), lengths.size(), SeriesKind::kInteger, {kRaw, kDelta});
  Histories histories;
  std::vector<uint64_t> pred;
  std::array<std::vector<uint64_t>, kModes> residuals;
  for (const v1::MoeStats* report : reports) {
    for (const v1::MoeLayerStats& layer : report->layers()) {
      const size_t n = static_cast<size_t>(layer.tokens_per_expert_size());
      if (n == 0) continue;
      const uint64_t* counts = layer.tokens_per_expert().data();
      History& h = histories[{layer.layer(), n}];
      const uint64_t mean = h.Empty() ? OwnMean(counts, n) : 0;
      const Choice c = Choose(h, counts, n, mean, pred, residuals);
      w.Put(c.mode, 2);
      if (c.mode == kOwnMean) {
        w.Put(std::bit_width(mean), 7);
        w.Put(mean, std::bit_width(mean));
      }
      w.Put(c.code.zero_flags ? 1 : 0, 1);
      w.Put(c.code.k, 6);
      for (const uint64_t z : residuals[c.mode]) {
        if (c.code.zero_flags) w.Put(z != 0, 1);
        if (!c.code.zero_flags || z != 0) PutGolomb(w, z, c.code.k);
      }
      h.Add(counts);
    }
  }
}

bool GetMoeCounts(BitReader& r, absl::Span<v1::MoeStats* const> reports) {
  size_t layers = 0;
  for (const v1::MoeStats* report : reports) layers += report->layers_size();
  std::vector<uint64_t> lengths;
  if (!GetSeries(r, layers, SeriesKind::kInteger, lengths)) return false;
  // Every count costs at least a bit (a zero flag or a Golomb code).
  uint64_t total = 0;
  const uint64_t bits_left = r.size_bits() - r.bit_pos();
  for (uint64_t n : lengths) {
    if (n > bits_left - total || n > INT32_MAX) return false;
    total += n;
  }
  Histories histories;
  std::vector<uint64_t> pred;
  size_t next = 0;
  for (v1::MoeStats* report : reports) {
    for (v1::MoeLayerStats& layer : *report->mutable_layers()) {
      const size_t n = lengths[next++];
      if (n == 0) continue;
      History& h = histories[{layer.layer(), n}];
      const int mode = static_cast<int>(r.Get(2));
      if (mode >= kModes || h.Empty() != (mode == kOwnMean) ||
          (mode == kRecentMean && h.MeanOf() == 0)) {
        return false;
      }
      uint64_t mean = 0;
      if (mode == kOwnMean) {
        const int width = static_cast<int>(r.Get(7));
        if (width > 64) return false;
        mean = r.Get(width);
      }
      const bool zero_flags = r.Get(1) != 0;
      const int k = static_cast<int>(r.Get(6));
      if (r.failed()) return false;
      Predict(static_cast<Mode>(mode), h, mean, n, pred);
      google::protobuf::RepeatedField<uint64_t>& counts = *layer.mutable_tokens_per_expert();
      counts.Resize(static_cast<int>(n), 0);
      uint64_t* out = counts.mutable_data();
      for (size_t i = 0; i < n; ++i) {
        const uint64_t z = !zero_flags || r.Get(1) != 0 ? r.GetGolomb(k) : 0;
        out[i] = pred[i] + UnZigZag(z);
      }
      if (r.failed()) return false;
      h.Add(out);
    }
  }
  return true;
}

}  // namespace trainwatch::codec
