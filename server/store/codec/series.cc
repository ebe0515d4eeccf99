#include "store/codec/series.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <optional>
#include <type_traits>

#include "store/codec/golomb.h"

namespace trainwatch::codec {
namespace {

// Calls f(residual) for v[1..m) under predictor P (pred: kPredicted's
// predictions, one per value, as raw bits).
template <Predictor P, bool kOrdered, typename F>
void ResidualLoop(const uint64_t* v, const uint64_t* pred, uint64_t center,
                  size_t m, F& f) {
  auto map = [](uint64_t x) { return kOrdered ? Ordered(x) : x; };
  uint64_t prev = map(v[0]), d1 = 0, d2 = 0;
  for (size_t i = 1; i < m; ++i) {
    const uint64_t cur = map(v[i]);
    const uint64_t d = cur - prev;
    uint64_t r;
    if constexpr (P == kRaw) {
      r = ZigZag(cur);
    } else if constexpr (P == kDelta) {
      r = ZigZag(d);
    } else if constexpr (P == kDeltaOfDelta) {
      r = ZigZag(d - d1);
    } else if constexpr (P == kDelta3) {
      r = ZigZag(d - d1 - d2);
      d2 = d - d1;
    } else if constexpr (P == kPredicted) {
      r = ZigZag(cur - map(pred[i]));
    } else if constexpr (P == kCentered) {
      r = ZigZag(cur - center);
    } else {
      r = cur ^ prev;
    }
    d1 = d;
    prev = cur;
    f(r);
  }
}

template <Predictor P, typename F>
void ResidualLoopOf(SeriesKind kind, const uint64_t* v, const uint64_t* pred,
                    uint64_t center, size_t m, F& f) {
  // XOR works on a double's raw bits, the others on Ordered() ones.
  if (kind == SeriesKind::kDouble && P != kXor) {
    ResidualLoop<P, true>(v, pred, center, m, f);
  } else {
    ResidualLoop<P, false>(v, pred, center, m, f);
  }
}

// Calls f with p as a compile-time constant (std::integral_constant), so
// that the loops over values are compiled once per predictor.
template <typename F>
void WithPredictor(Predictor p, F&& f) {
  switch (p) {
    case kRaw:
      return f(std::integral_constant<Predictor, kRaw>{});
    case kDelta:
      return f(std::integral_constant<Predictor, kDelta>{});
    case kDeltaOfDelta:
      return f(std::integral_constant<Predictor, kDeltaOfDelta>{});
    case kDelta3:
      return f(std::integral_constant<Predictor, kDelta3>{});
    case kPredicted:
      return f(std::integral_constant<Predictor, kPredicted>{});
    case kCentered:
      return f(std::integral_constant<Predictor, kCentered>{});
    case kXor:
    default:
      return f(std::integral_constant<Predictor, kXor>{});
  }
}

template <typename F>
void ForEachResidual(Predictor p, const uint64_t* v, const uint64_t* pred,
                     uint64_t center, size_t m, SeriesKind kind, F&& f) {
  WithPredictor(p, [&](auto P) { ResidualLoopOf<P.value>(kind, v, pred, center, m, f); });
}

// How PutSeries writes a series, and its cost in bits.
struct SeriesPlan {
  Predictor predictor = kRaw;
  GolombChoice code{.cost = ~uint64_t{0}};
  int shift = 0;
  bool zero = false;
  uint64_t center = 0;
  uint64_t cost = ~uint64_t{0};
};

// The mean of v[1..m), mapped as the series' predictors see it.
uint64_t Center(const uint64_t* v, size_t m, SeriesKind kind) {
  __int128 sum = 0;
  for (size_t i = 1; i < m; ++i) {
    sum += static_cast<int64_t>(kind == SeriesKind::kDouble ? Ordered(v[i]) : v[i]);
  }
  return static_cast<uint64_t>(static_cast<int64_t>(sum / static_cast<__int128>(m - 1)));
}

// The candidate whose residuals look cheapest on a sample of a long series:
// kSampleRuns runs of kSampleRun consecutive values spread over it, the
// first residuals of each run (which see no history) not counted. Pricing
// every candidate on every value was most of the encoder's time.
constexpr size_t kSampleRun = 32, kSampleRuns = 8, kWarmUp = 3;

Predictor SampledBest(const uint64_t* v, size_t m, SeriesKind kind,
                      std::initializer_list<Predictor> candidates, const uint64_t* pred) {
  Predictor best = *candidates.begin();
  uint64_t best_cost = ~uint64_t{0};
  const size_t stride = (m - kSampleRun) / (kSampleRuns - 1);
  for (Predictor p : candidates) {
    WidthHistogram hist{};
    uint64_t all_or = 0;
    for (size_t run = 0; run < kSampleRuns; ++run) {
      const size_t start = run * stride;
      const uint64_t center = p == kCentered ? Center(v + start, kSampleRun, kind) : 0;
      size_t seen = 0;
      ForEachResidual(p, v + start, pred == nullptr ? nullptr : pred + start, center,
                      kSampleRun, kind, [&](uint64_t r) {
                        if (++seen <= kWarmUp) return;
                        ++hist[std::bit_width(r)];
                        all_or |= r;
                      });
    }
    const uint64_t cost =
        all_or == 0 ? 0 : BestGolomb(hist, std::countr_zero(all_or)).cost;
    if (cost < best_cost) {
      best_cost = cost;
      best = p;
    }
  }
  return best;
}

SeriesPlan PlanSeries(const uint64_t* v, size_t m, SeriesKind kind,
                      std::initializer_list<Predictor> candidates,
                      bool zero_shortcut, const uint64_t* pred) {
  SeriesPlan best;
  if (m < 2) {
    best.cost = m == 0 ? 0 : 7 + std::bit_width(v[0]);
    return best;
  }
  Predictor sampled = kRaw;
  const bool sample = m >= 2 * kSampleRun * kSampleRuns && candidates.size() > 1;
  if (sample) sampled = SampledBest(v, m, kind, candidates, pred);
  uint64_t best_cost = ~uint64_t{0};
  for (Predictor p : candidates) {
    if (sample && p != sampled) continue;
    const uint64_t center = p == kCentered ? Center(v, m, kind) : 0;
    WidthHistogram hist{};
    uint64_t all_or = 0;
    ForEachResidual(p, v, pred, center, m, kind, [&](uint64_t r) {
      ++hist[std::bit_width(r)];
      all_or |= r;
    });
    // A constant series is kDelta's (kCentered's center is not written then).
    if (p == kCentered && all_or == 0) continue;
    const bool zero = all_or == 0 && zero_shortcut;
    const int shift = all_or == 0 ? 0 : std::countr_zero(all_or);
    const GolombChoice code = zero ? GolombChoice{} : BestGolomb(hist, shift);
    const uint64_t cost = code.cost + (p == kCentered ? 64 : 0);
    if (cost < best_cost) {
      best_cost = cost;
      best = SeriesPlan{.predictor = p, .code = code, .shift = shift, .zero = zero,
                        .center = center};
    }
  }
  best.cost = 7 + std::bit_width(v[0]) + 4 + (best.zero ? 0 : 13) + best_cost;
  return best;
}

void WriteSeries(BitWriter& w, const uint64_t* v, size_t m, SeriesKind kind,
                 const SeriesPlan& plan, const uint64_t* pred) {
  if (m == 0) return;
  const int first_width = std::bit_width(v[0]);
  w.Put(first_width, 7);
  w.Put(v[0], first_width);
  if (m == 1) return;
  w.Put(plan.predictor, 3);
  w.Put(plan.zero ? 1 : 0, 1);
  if (plan.zero) return;
  w.Put(plan.code.zero_flags ? 1 : 0, 1);
  w.Put(plan.shift, 6);
  w.Put(plan.code.k, 6);
  if (plan.predictor == kCentered) w.Put(plan.center, 64);
  const int k = plan.code.k, shift = plan.shift;
  if (plan.code.zero_flags) {
    ForEachResidual(plan.predictor, v, pred, plan.center, m, kind, [&](uint64_t r) {
      w.Put(r != 0, 1);
      if (r != 0) PutGolomb(w, r >> shift, k);
    });
  } else {
    ForEachResidual(plan.predictor, v, pred, plan.center, m, kind,
                    [&](uint64_t r) { PutGolomb(w, r >> shift, k); });
  }
}

// Turns residuals v[1..) (v[0]: the first value) into the values, the
// inverse of ResidualLoop.
template <Predictor P, bool kOrdered>
void ReconstructLoop(std::vector<uint64_t>& v, const uint64_t* pred, uint64_t center) {
  auto map = [](uint64_t x) { return kOrdered ? Ordered(x) : x; };
  uint64_t prev = map(v[0]), d1 = 0, d2 = 0;
  for (size_t i = 1; i < v.size(); ++i) {
    const uint64_t res = v[i];
    uint64_t cur;
    if constexpr (P == kRaw) {
      cur = UnZigZag(res);
    } else if constexpr (P == kDelta) {
      cur = prev + UnZigZag(res);
    } else if constexpr (P == kDeltaOfDelta) {
      cur = prev + d1 + UnZigZag(res);
    } else if constexpr (P == kDelta3) {
      d2 += UnZigZag(res);
      cur = prev + d1 + d2;
    } else if constexpr (P == kPredicted) {
      cur = map(pred[i]) + UnZigZag(res);
    } else if constexpr (P == kCentered) {
      cur = center + UnZigZag(res);
    } else {
      cur = prev ^ res;
    }
    d1 = cur - prev;
    prev = cur;
    v[i] = map(cur);
  }
}

template <Predictor P>
void Reconstruct(SeriesKind kind, std::vector<uint64_t>& v, const uint64_t* pred,
                 uint64_t center) {
  if (kind == SeriesKind::kDouble && P != kXor) {
    ReconstructLoop<P, true>(v, pred, center);
  } else {
    ReconstructLoop<P, false>(v, pred, center);
  }
}

constexpr int kMaxDecimalExponent = 17;

double Pow10(int e) {
  static constexpr std::array<double, kMaxDecimalExponent + 1> kPow10 = {
      1e0, 1e1, 1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,
      1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17};
  return kPow10[e];
}

// q with bits(q / 10^e) == bits, if there is one below 2^53.
std::optional<int64_t> DecimalOf(uint64_t bits, int e) {
  const double v = std::bit_cast<double>(bits);
  const double scaled = v * Pow10(e);
  if (!(std::fabs(scaled) < 9.0e15)) return std::nullopt;  // NaN and Inf too
  const int64_t q = std::llround(scaled);
  if (std::bit_cast<uint64_t>(static_cast<double>(q) / Pow10(e)) != bits) return std::nullopt;
  return q;
}

// An e that makes every value a decimal q / 10^e, and the q, or nullopt;
// cheap when the first value is none. The e is the largest any value needs,
// which the others are checked at (a value of fewer digits usually is one at
// a larger e too, not always: 10^e times a double can round to another q).
std::optional<int> DecimalExponent(const uint64_t* v, size_t m,
                                   std::vector<uint64_t>& q) {
  int e = 0;
  for (size_t i = 0; i < m; ++i) {
    while (!DecimalOf(v[i], e).has_value()) {
      if (++e > kMaxDecimalExponent) return std::nullopt;
    }
  }
  q.resize(m);
  for (size_t i = 0; i < m; ++i) {
    std::optional<int64_t> d = DecimalOf(v[i], e);
    if (!d.has_value()) return std::nullopt;
    q[i] = static_cast<uint64_t>(*d);
  }
  return e;
}

}  // namespace

void PutSeries(BitWriter& w, const uint64_t* v, size_t m, SeriesKind kind,
               std::initializer_list<Predictor> candidates,
               bool zero_shortcut, const uint64_t* pred) {
  WriteSeries(w, v, m, kind, PlanSeries(v, m, kind, candidates, zero_shortcut, pred), pred);
}

bool GetSeries(BitReader& r, size_t m, SeriesKind kind,
               std::vector<uint64_t>& out, const uint64_t* pred) {
  out.resize(m);
  if (m == 0) return true;
  const int first_width = static_cast<int>(r.Get(7));
  if (first_width > 64) return false;
  out[0] = r.Get(first_width);
  if (m == 1) return !r.failed();
  const int code = static_cast<int>(r.Get(3));
  if (code >= kPredictors || (code == kPredicted && pred == nullptr)) return false;
  const auto p = static_cast<Predictor>(code);
  const bool zero = r.Get(1) != 0;
  bool zero_flags = false;
  int shift = 0, k = 0;
  uint64_t center = 0;
  if (!zero) {
    zero_flags = r.Get(1) != 0;
    shift = static_cast<int>(r.Get(6));
    k = static_cast<int>(r.Get(6));
    if (p == kCentered) center = r.Get(64);
  }
  // The residuals first (a read past the end gives zeros and fails the
  // reader, checked once), then the values from them.
  if (zero) {
    std::fill(out.begin() + 1, out.end(), 0);
  } else if (zero_flags) {
    for (size_t i = 1; i < m; ++i) out[i] = r.Get(1) != 0 ? r.GetGolomb(k) << shift : 0;
  } else {
    for (size_t i = 1; i < m; ++i) out[i] = r.GetGolomb(k) << shift;
  }
  if (r.failed()) return false;
  WithPredictor(p, [&](auto P) { Reconstruct<P.value>(kind, out, pred, center); });
  return !r.failed();
}

void PutDoubles(BitWriter& w, const uint64_t* v, size_t m,
                std::initializer_list<Predictor> candidates,
                const uint64_t* pred) {
  if (m == 0) return;
  const SeriesPlan plain = PlanSeries(v, m, SeriesKind::kDouble, candidates, true, pred);
  std::vector<uint64_t> q;
  // Under two bits a value (a constant, a rare change), or for a few values,
  // there is little to win.
  std::optional<int> e;
  if (m >= 16 && plain.cost > 2 * m + 64) e = DecimalExponent(v, m, q);
  if (e.has_value()) {
    const SeriesPlan decimal =
        PlanSeries(q.data(), m, SeriesKind::kInteger,
                   {kDelta, kDeltaOfDelta, kDelta3, kCentered}, true, nullptr);
    if (decimal.cost + 5 < plain.cost) {
      w.Put(1, 1);
      w.Put(*e, 5);
      WriteSeries(w, q.data(), m, SeriesKind::kInteger, decimal, nullptr);
      return;
    }
  }
  w.Put(0, 1);
  WriteSeries(w, v, m, SeriesKind::kDouble, plain, pred);
}

bool GetDoubles(BitReader& r, size_t m, std::vector<uint64_t>& out,
                const uint64_t* pred) {
  if (m == 0) {
    out.clear();
    return true;
  }
  if (r.Get(1) == 0) return GetSeries(r, m, SeriesKind::kDouble, out, pred);
  const int e = static_cast<int>(r.Get(5));
  if (e > kMaxDecimalExponent || !GetSeries(r, m, SeriesKind::kInteger, out)) return false;
  for (uint64_t& x : out) {
    x = std::bit_cast<uint64_t>(static_cast<double>(static_cast<int64_t>(x)) / Pow10(e));
  }
  return true;
}

}  // namespace trainwatch::codec
