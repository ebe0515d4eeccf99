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
  kPrevious = 0,  // the layer's counts in its previous record
  kAverage = 1,   // their moving average over its earlier records
  kOwnMean = 2,   // this record's own mean, stored
};
constexpr int kModes = 3;

// The moving average's weight of the newest record, 2^-kAverageShift: its
// noise is 1/7 of one record's (the previous record's is all of it), and
// it follows a drift within ~4 records.
constexpr int kAverageShift = 2;

// The earlier counts of one layer (name and number of experts) in the
// chunk: the newest, and the moving average of all (integer arithmetic
// modulo 2^64, which the reader repeats exactly).
class History {
 public:
  void Add(const uint64_t* counts, size_t n) {
    if (seen_ == 0) {
      average_.assign(counts, counts + n);
    } else {
      for (size_t i = 0; i < n; ++i) average_[i] = Averaged(average_[i], counts[i]);
    }
    Added(counts);
  }
  // Residuals and Add in one pass over the counts (the writer's, once the
  // layer has an average and one prediction is priced): z[i] is the zigzag
  // of counts[i] less `mode`'s prediction, which is read before the
  // average moves.
  void AddWithResiduals(Mode mode, const uint64_t* counts, size_t n, uint64_t* z) {
    uint64_t* avg = average_.data();
    if (mode == kPrevious) {
      const uint64_t* prev = last_;
      for (size_t i = 0; i < n; ++i) {
        const uint64_t c = counts[i];
        z[i] = ZigZag(c - prev[i]);
        avg[i] = Averaged(avg[i], c);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        const uint64_t c = counts[i];
        const uint64_t a = avg[i];
        z[i] = ZigZag(c - a);
        avg[i] = Averaged(a, c);
      }
    }
    Added(counts);
  }
  bool Empty() const { return seen_ == 0; }
  // kAverage differs from kPrevious from the third record on.
  bool HasAverage() const { return seen_ >= 2; }
  size_t seen() const { return seen_; }
  // The writer's: the prediction that won when both were last priced.
  Mode preferred = kAverage;
  const uint64_t* last() const { return last_; }
  const uint64_t* average() const { return average_.data(); }

 private:
  static uint64_t Averaged(uint64_t average, uint64_t count) {
    return average +
           static_cast<uint64_t>(static_cast<int64_t>(count - average) >> kAverageShift);
  }
  void Added(const uint64_t* counts) {
    last_ = counts;
    ++seen_;
  }

  const uint64_t* last_ = nullptr;
  std::vector<uint64_t> average_;
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

// The prediction of each of n counts under `mode` (mean: kOwnMean's;
// `own`: room for its n predictions).
const uint64_t* Predict(Mode mode, const History& h, uint64_t mean, size_t n,
                        std::vector<uint64_t>& own) {
  if (mode == kPrevious) return h.last();
  if (mode == kAverage) return h.average();
  own.assign(n, mean);
  return own.data();
}

struct Choice {
  Mode mode = kOwnMean;
  GolombChoice code;
  bool added = false;  // the counts are in the history already
};

// Both histories are priced on a layer's third record and every 8th after;
// between, the one that won then (a layer's noise and drift change slowly,
// and pricing both took a third of the writer's time).
constexpr size_t kReprice = 8;
constexpr size_t kSample = 4;

// The cheapest prediction of `counts` and its code; residuals[mode] holds
// the zigzagged residuals under it.
Choice Choose(History& h, const uint64_t* counts, size_t n, uint64_t mean,
              std::vector<uint64_t>& own,
              std::array<std::vector<uint64_t>, kModes>& residuals) {
  const bool reprice = h.seen() % kReprice == 2;
  if (h.HasAverage() && !reprice) {
    // The prediction that won when last priced: its residuals and the
    // history's update in one pass, its code from every kSample-th residual.
    const Mode mode = h.preferred;
    std::vector<uint64_t>& z = residuals[mode];
    z.resize(n);
    h.AddWithResiduals(mode, counts, n, z.data());
    WidthHistogram hist{};
    const size_t stride = n < 4 * kSample ? 1 : kSample;
    for (size_t i = 0; i < n; i += stride) ++hist[std::bit_width(z[i])];
    return {.mode = mode, .code = BestGolomb(hist, 0), .added = true};
  }
  Choice best;
  uint64_t best_cost = ~uint64_t{0};
  for (int m = 0; m < kModes; ++m) {
    const Mode mode = static_cast<Mode>(m);
    // A layer seen before is predicted from its history, which the counts
    // of one record's noise rarely beat; its first record from its mean.
    if (h.Empty() != (mode == kOwnMean)) continue;
    if (mode == kAverage && !h.HasAverage()) continue;
    if (h.HasAverage() && !reprice && mode != h.preferred) continue;
    const uint64_t* pred = Predict(mode, h, mean, n, own);
    std::vector<uint64_t>& z = residuals[m];
    z.resize(n);
    for (size_t i = 0; i < n; ++i) z[i] = ZigZag(counts[i] - pred[i]);
    // The code is chosen on every kSample-th residual when only one mode
    // is priced (a layer's residuals are alike; pricing every one was a
    // quarter of the writer's time), on all when modes are compared. Four
    // histograms, so that increments of one width do not wait on each other.
    const size_t stride = reprice || n < 4 * kSample ? 1 : kSample;
    std::array<WidthHistogram, 4> part{};
    size_t i = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
      ++part[0][std::bit_width(z[i])];
      ++part[1][std::bit_width(z[i + stride])];
      ++part[2][std::bit_width(z[i + 2 * stride])];
      ++part[3][std::bit_width(z[i + 3 * stride])];
    }
    for (; i < n; i += stride) ++part[0][std::bit_width(z[i])];
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
  if (reprice) h.preferred = best.mode;
  return best;
}

// One residual's code: `len` bits, the value in `bits`.
struct Code {
  uint64_t bits;
  int len;
};

template <bool kZeroFlags>
[[gnu::always_inline]] inline Code Form(uint64_t z, int k) {
  // bit_width(z >> k), and the n = 0 case, by arithmetic: the compiler's
  // own bit_width branches on zero, which k makes half the codes.
  const uint64_t v = z >> k;
  const int small = v == 0 ? 1 : 0;
  const int n = 64 - std::countl_zero(v | 1) - small;
  int len = 2 * n + k + small;
  uint64_t code = z | (static_cast<uint64_t>(small) << k);
  if (kZeroFlags) {
    // A zero is the flag 0 alone; any other value the flag 1, then its code.
    const bool zero = z == 0;
    code = zero ? 0 : (code | (uint64_t{1} << (len & 63)));
    len = zero ? 1 : len + 1;
  }
  return {code, len};
}

// Writes `c`, z's code; one over what one store takes (56 bits) through
// PutGolomb, outside `out`, which it ends and begins again.
template <bool kZeroFlags>
[[gnu::always_inline]] inline void PutCode(BitWriter& w, BitWriter::Reserved& out, Code c,
                                           uint64_t z, int k, size_t room) {
  if (c.len > 56) [[unlikely]] {
    w.End(out);
    if (kZeroFlags) w.Put(1, 1);
    PutGolomb(w, z, k);
    out = w.Begin(room);
    out.Flush();
    return;
  }
  out.PutFlushed(c.bits, c.len);
}

// Writes one Exp-Golomb code of order k per residual (PutGolomb's bits),
// each preceded by a zero flag if asked (a nonzero's flag joins its code in
// one write), into room reserved once and through the writer's state in
// registers (not inlined, so that they stay there). A code's form is
// arithmetic and every write stores a whole word (Reserved::PutFlushed): a
// branch on whether the word filled mispredicted every few codes. Two codes
// that fit one store (nearly all) are written as one: the writer's state is
// a chain from each write to the next, their forms are not.
template <bool kZeroFlags>
[[gnu::noinline]] void PutCodes(BitWriter& w, absl::Span<const uint64_t> residuals, int k) {
  const size_t room = 64 * residuals.size();
  BitWriter::Reserved out = w.Begin(room);
  out.Flush();
  const uint64_t* z = residuals.data();
  const size_t n = residuals.size();
  size_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const Code a = Form<kZeroFlags>(z[i], k), b = Form<kZeroFlags>(z[i + 1], k);
    if (a.len + b.len <= 56) [[likely]] {
      out.PutFlushed((a.bits << b.len) | b.bits, a.len + b.len);
      continue;
    }
    PutCode<kZeroFlags>(w, out, a, z[i], k, room);
    PutCode<kZeroFlags>(w, out, b, z[i + 1], k, room);
  }
  if (i < n) PutCode<kZeroFlags>(w, out, Form<kZeroFlags>(z[i], k), z[i], k, room);
  w.End(out);
}

void PutCodes(BitWriter& w, absl::Span<const uint64_t> residuals, int k, bool zero_flags) {
  if (zero_flags) {
    PutCodes<true>(w, residuals, k);
  } else {
    PutCodes<false>(w, residuals, k);
  }
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
  size_t total = 0;
  for (const v1::MoeStats* report : reports) {
    for (const v1::MoeLayerStats& layer : report->layers()) {
      lengths.push_back(static_cast<uint64_t>(layer.tokens_per_expert_size()));
      total += lengths.back();
    }
  }
  // ~1.7 bytes a count as trainers' counts go (bench_store), 3 with room.
  w.Expect(3 * total + 8 * lengths.size());
  PutSeries(w, lengths.data(), lengths.size(), SeriesKind::kInteger, {kRaw, kDelta});
  Histories histories;
  std::vector<uint64_t> own;
  std::array<std::vector<uint64_t>, kModes> residuals;
  for (const v1::MoeStats* report : reports) {
    for (const v1::MoeLayerStats& layer : report->layers()) {
      const size_t n = static_cast<size_t>(layer.tokens_per_expert_size());
      if (n == 0) continue;
      const uint64_t* counts = layer.tokens_per_expert().data();
      History& h = histories[{layer.layer(), n}];
      const uint64_t mean = h.Empty() ? OwnMean(counts, n) : 0;
      const Choice c = Choose(h, counts, n, mean, own, residuals);
      w.Put(c.mode, 2);
      if (c.mode == kOwnMean) {
        w.Put(std::bit_width(mean), 7);
        w.Put(mean, std::bit_width(mean));
      }
      w.Put(c.code.zero_flags ? 1 : 0, 1);
      w.Put(c.code.k, 6);
      PutCodes(w, residuals[c.mode], c.code.k, c.code.zero_flags);
      if (!c.added) h.Add(counts, n);
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
  std::vector<uint64_t> own;
  size_t next = 0;
  for (v1::MoeStats* report : reports) {
    for (v1::MoeLayerStats& layer : *report->mutable_layers()) {
      const size_t n = lengths[next++];
      if (n == 0) continue;
      History& h = histories[{layer.layer(), n}];
      const int mode = static_cast<int>(r.Get(2));
      if (mode >= kModes || h.Empty() != (mode == kOwnMean) ||
          (mode == kAverage && !h.HasAverage())) {
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
      const uint64_t* pred = Predict(static_cast<Mode>(mode), h, mean, n, own);
      google::protobuf::RepeatedField<uint64_t>& counts = *layer.mutable_tokens_per_expert();
      counts.Resize(static_cast<int>(n), 0);
      uint64_t* out = counts.mutable_data();
      for (size_t i = 0; i < n; ++i) {
        const uint64_t z = !zero_flags || r.Get(1) != 0 ? r.GetGolomb(k) : 0;
        out[i] = pred[i] + UnZigZag(z);
      }
      if (r.failed()) return false;
      h.Add(out, n);
    }
  }
  return true;
}

}  // namespace trainwatch::codec
