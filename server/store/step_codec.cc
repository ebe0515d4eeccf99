#include "store/step_codec.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"

namespace trainwatch {
namespace {

using google::protobuf::RepeatedPtrField;
using v1::StepRecord;

// ---------------------------------------------------------------------------
// Bits, most significant first.

class BitWriter {
 public:
  // Appends to *out, which it sizes ahead and trims in Finish().
  explicit BitWriter(std::string* out) : out_(out), len_(out->size()) {}

  // The low `bits` (0..64) bits of v.
  void Put(uint64_t v, int bits) {
    if (bits == 0) return;
    if (bits < 64) v &= (uint64_t{1} << bits) - 1;
    const int free = 64 - n_;  // 1..64
    if (bits < free) {
      acc_ = (acc_ << bits) | v;
      n_ += bits;
      return;
    }
    const int rest = bits - free;  // bits of v left over, 0..63
    const uint64_t full = (free == 64 ? 0 : acc_ << free) | (v >> rest);
    Store64(full);
    acc_ = v;  // its low `rest` bits are the pending ones
    n_ = rest;
  }
  // Writes the pending bits, the last byte padded with zeros.
  void Finish() {
    const uint64_t top = n_ == 0 ? 0 : acc_ << (64 - n_);
    const int bytes = (n_ + 7) / 8;
    Store64(top);
    len_ -= 8 - bytes;
    out_->resize(len_);
    n_ = 0;
  }

 private:
  void Store64(uint64_t w) {
    if (out_->size() < len_ + 8) out_->resize(std::max(2 * out_->size(), len_ + 64));
    w = __builtin_bswap64(w);
    std::memcpy(out_->data() + len_, &w, 8);
    len_ += 8;
  }

  std::string* out_;
  size_t len_;        // bytes of *out_ written
  uint64_t acc_ = 0;  // the low n_ bits are pending
  int n_ = 0;         // 0..63
};

// Reads past the end give zeros and set failed(); callers check it once per
// column, so no read is ever out of bounds and a bad blob costs nothing more.
class BitReader {
 public:
  BitReader(const unsigned char* data, size_t size)
      : data_(data), size_(size), size_bits_(size * 8) {}

  uint64_t Get(int bits) {  // 0..64
    if (bits > 56) {
      uint64_t hi = Get(bits - 32);
      return (hi << 32) | Get(32);
    }
    if (bits == 0) return 0;
    if (pos_ + bits > size_bits_) return Fail();
    const uint64_t w = Load64(pos_ >> 3) << (pos_ & 7);
    pos_ += bits;
    return w >> (64 - bits);
  }
  // Zeros before the next one bit, which is consumed; at most `max`.
  int GetUnary(int max) {
    int zeros = 0;
    while (pos_ < size_bits_) {
      const int off = static_cast<int>(pos_ & 7);
      const uint64_t w = Load64(pos_ >> 3) << off;
      const int avail =
          static_cast<int>(std::min<size_t>(64 - off, size_bits_ - pos_));
      const int lead = w == 0 ? 64 : std::countl_zero(w);
      if (lead < avail) {
        zeros += lead;
        pos_ += lead + 1;
        if (zeros > max) break;
        return zeros;
      }
      zeros += avail;
      pos_ += avail;
      if (zeros > max) break;
    }
    Fail();
    return 0;
  }
  // An Exp-Golomb code of order k (PutGolomb), from one 64-bit window when
  // it fits in one.
  uint64_t GetGolomb(int k) {
    const int off = static_cast<int>(pos_ & 7);
    const uint64_t w = Load64(pos_ >> 3) << off;
    const int n = w == 0 ? 64 : std::countl_zero(w);
    const int len = n == 0 ? k + 1 : 2 * n + k;
    if (len <= 64 - off && pos_ + len <= size_bits_) {
      pos_ += len;
      if (n == 0) return k == 0 ? 0 : (w << 1) >> (64 - k);
      return (w << n) >> (64 - (n + k));
    }
    const int zeros = GetUnary(64);
    uint64_t v = 0;
    if (zeros > 0) v = (uint64_t{1} << (zeros - 1)) | Get(zeros - 1);
    return (v << k) | Get(k);
  }
  bool failed() const { return failed_; }
  size_t bit_pos() const { return pos_; }
  size_t size_bits() const { return size_bits_; }
  // Skips to the next byte boundary; the index of that byte.
  size_t AlignToByte() {
    pos_ = (pos_ + 7) & ~size_t{7};
    return pos_ >> 3;
  }

 private:
  uint64_t Fail() {
    failed_ = true;
    pos_ = size_bits_;
    return 0;
  }
  uint64_t Load64(size_t byte) const {
    unsigned char b[8] = {};
    if (byte + 8 <= size_) {
      std::memcpy(b, data_ + byte, 8);
    } else if (byte < size_) {
      std::memcpy(b, data_ + byte, size_ - byte);
    }
    uint64_t w;
    std::memcpy(&w, b, 8);
    return __builtin_bswap64(w);
  }

  const unsigned char* data_;
  size_t size_;
  size_t size_bits_;
  size_t pos_ = 0;
  bool failed_ = false;
};

// ---------------------------------------------------------------------------
// Exp-Golomb of order k: v = x >> k as its bit width n in unary then the n-1
// bits below its leading one, then the k low bits of x. Costs k + 1 bits for
// x < 2^k and two more per doubling above it, so one outlier costs little.

// The same bits as one write: n zeros, then x in n + k bits (its top bit is
// v's leading one), or for n = 0 a one and the k bits.
void PutGolomb(BitWriter& w, uint64_t x, int k) {
  const int n = std::bit_width(x >> k);
  if (n == 0) {
    w.Put((uint64_t{1} << k) | x, k + 1);
  } else if (2 * n + k <= 64) {
    w.Put(x, 2 * n + k);
  } else {
    w.Put(0, n);
    w.Put(x, n + k);
  }
}

uint64_t GetGolomb(BitReader& r, int k) { return r.GetGolomb(k); }

// Counts of values by bit width (0..64), to price every k at once.
using WidthHistogram = std::array<uint32_t, 65>;

// The cheapest way to write values of `hist` shifted right by `shift`
// (their common trailing zeros): the Golomb k, whether each value is
// preceded by a bit saying whether it is zero (cheaper when most are zero
// and the rest large, as a field that is 1.0 except when clipping), and the
// total bits.
struct GolombChoice {
  int k = 0;
  bool zero_flags = false;
  uint64_t cost = 0;
};

GolombChoice BestGolomb(const WidthHistogram& hist, int shift,
                        bool allow_zero_flags = true) {
  // Widths after the shift (a nonzero value loses exactly `shift` bits).
  std::array<uint64_t, 65> h{};
  // Only the widths present: those below the shift are empty (a value of
  // the column has at least `shift` trailing zeros), and indexing them would
  // leave the array (found by step_codec_fuzzer).
  for (int b = 0; b <= 64; ++b) {
    if (hist[b] == 0) continue;
    h[b == 0 ? 0 : std::max(0, b - shift)] += hist[b];
  }
  // Plain: cost(k) = count*k + #(width <= k) + 2 * sum over width > k of
  // (width - k). Zero-flagged: a bit per value, then the nonzero ones plainly.
  auto best_k = [&](uint64_t zeros) {
    uint64_t count = zeros, width_sum = 0;
    for (int b = 1; b <= 64; ++b) {
      count += h[b];
      width_sum += h[b] * b;
    }
    std::pair<int, uint64_t> best{0, ~uint64_t{0}};
    uint64_t le = zeros, le_width = 0;  // count and width sum of widths <= k
    for (int k = 0; k <= 63; ++k) {
      if (k > 0) {
        le += h[k];
        le_width += h[k] * k;
      }
      const uint64_t gt = count - le;
      const uint64_t cost = count * k + le + 2 * ((width_sum - le_width) - gt * k);
      if (cost < best.second) best = {k, cost};
      if (gt == 0) break;
    }
    return best;
  };
  auto [k, cost] = best_k(h[0]);
  GolombChoice choice{.k = k, .zero_flags = false, .cost = cost};
  if (h[0] > 0 && allow_zero_flags) {
    uint64_t count = 0;
    for (uint64_t c : h) count += c;
    auto [fk, fcost] = best_k(0);
    if (h[0] == count) fcost = 0;
    fcost += count;
    if (fcost < choice.cost) choice = {.k = fk, .zero_flags = true, .cost = fcost};
  }
  return choice;
}

uint64_t ZigZag(uint64_t v) {
  return (v << 1) ^ static_cast<uint64_t>(static_cast<int64_t>(v) >> 63);
}
uint64_t UnZigZag(uint64_t z) { return (z >> 1) ^ (~(z & 1) + 1); }

// A double's bits as an integer that orders like the double (for non-NaN):
// negative values get their magnitude bits flipped. Its own inverse.
uint64_t Ordered(uint64_t bits) {
  return bits ^ (static_cast<uint64_t>(static_cast<int64_t>(bits) >> 63) >> 1);
}

// ---------------------------------------------------------------------------
// A series of 64-bit values: the first as its bit width (7 bits) and bits,
// then, for two or more, the predictor (3 bits) and a bit set when every
// residual is zero; otherwise a bit for zero flags (see BestGolomb), the
// residuals' common trailing zeros (6 bits), the Golomb k (6 bits), for
// kCentered the center (64 bits), and one code per residual.

enum Predictor : int {
  kRaw = 0,           // zigzag(v)
  kDelta = 1,         // zigzag(v[i] - v[i-1])
  kDeltaOfDelta = 2,  // zigzag of the change of the delta (0 before v[1])
  kXor = 3,           // v[i] ^ v[i-1], on a double's raw bits
  kDelta3 = 4,        // the change of the change of the delta: smooth schedules
  kPredicted = 5,     // zigzag(v[i] - p[i]) for a prediction p the reader rebuilds
  kCentered = 6,      // zigzag(v[i] - c), c the series' mean (64 bits after k)
};
constexpr int kPredictors = 7;

// Values of a double column are mapped by Ordered() for the arithmetic
// predictors; integer columns use them as they are.
enum class SeriesKind { kInteger, kDouble };

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

void PutSeries(BitWriter& w, const uint64_t* v, size_t m, SeriesKind kind,
               std::initializer_list<Predictor> candidates,
               bool zero_shortcut = true, const uint64_t* pred = nullptr) {
  WriteSeries(w, v, m, kind, PlanSeries(v, m, kind, candidates, zero_shortcut, pred), pred);
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

// Reads m values into out (pred: as PutSeries was given). False when the
// reader failed.
bool GetSeries(BitReader& r, size_t m, SeriesKind kind,
               std::vector<uint64_t>& out, const uint64_t* pred = nullptr) {
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

// ---------------------------------------------------------------------------
// A column of doubles: a bit, then either the doubles' bits as a series or,
// when every value is a decimal of few digits (q / 10^e exactly, as values
// read from a text log are) and that is cheaper, e (5 bits) and the q as an
// integer series.

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

void PutDoubles(BitWriter& w, const uint64_t* v, size_t m,
                std::initializer_list<Predictor> candidates,
                const uint64_t* pred = nullptr) {
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
                const uint64_t* pred = nullptr) {
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

// ---------------------------------------------------------------------------
// A bitmap of m flags: a mode (2 bits), then for kRawBits one bit a flag, for
// kRuns the first flag and each run's length - 1 as Golomb codes (k: 6 bits).

enum BitmapMode : int { kAllFalse = 0, kAllTrue = 1, kRawBits = 2, kRuns = 3 };

void PutBitmap(BitWriter& w, const std::vector<uint8_t>& bits) {
  const size_t m = bits.size();
  if (m == 0) return;
  size_t ones = 0;
  for (uint8_t b : bits) ones += b;
  if (ones == 0 || ones == m) {
    w.Put(ones == 0 ? kAllFalse : kAllTrue, 2);
    return;
  }
  WidthHistogram hist{};
  auto for_each_run = [&](auto&& f) {
    size_t start = 0;
    for (size_t i = 1; i <= m; ++i) {
      if (i == m || bits[i] != bits[start]) {
        f(i - start - 1);
        start = i;
      }
    }
  };
  for_each_run([&](uint64_t len) { ++hist[std::bit_width(len)]; });
  const GolombChoice runs = BestGolomb(hist, 0, /*allow_zero_flags=*/false);
  const int k = runs.k;
  if (1 + 6 + runs.cost < m) {
    w.Put(kRuns, 2);
    w.Put(bits[0], 1);
    w.Put(k, 6);
    for_each_run([&](uint64_t len) { PutGolomb(w, len, k); });
  } else {
    w.Put(kRawBits, 2);
    for (uint8_t b : bits) w.Put(b, 1);
  }
}

bool GetBitmap(BitReader& r, size_t m, std::vector<uint8_t>& out) {
  out.assign(m, 0);
  if (m == 0) return true;
  switch (r.Get(2)) {
    case kAllFalse:
      break;
    case kAllTrue:
      std::fill(out.begin(), out.end(), 1);
      break;
    case kRawBits:
      for (size_t i = 0; i < m; ++i) out[i] = static_cast<uint8_t>(r.Get(1));
      break;
    case kRuns: {
      uint8_t value = static_cast<uint8_t>(r.Get(1));
      const int k = static_cast<int>(r.Get(6));
      for (size_t i = 0; i < m && !r.failed(); value ^= 1) {
        const uint64_t len = GetGolomb(r, k) + 1;
        if (len == 0 || len > m - i) return false;
        std::fill_n(out.begin() + i, len, value);
        i += len;
      }
      break;
    }
  }
  return !r.failed();
}

// ---------------------------------------------------------------------------
// The record's columns.

uint64_t Bits(double d) { return std::bit_cast<uint64_t>(d); }

// A field the client often derives from others, as its formula gives it:
// the prediction kPredicted codes against.
enum class Derived {
  kNone,
  // min(1, max_norm / (grad_norm + 1e-6)), clip_grad_norm_'s coefficient,
  // for the max_norm the chunk's first clipped record implies.
  kClipCoef,
  // The client's own measure when the trainer gives none: the time since
  // the previous record, (time_unix_nanos - previous) * 1e-9.
  kStepTime,
};

struct OptionalDouble {
  const char* name;
  bool (*has)(const StepRecord&);
  double (*get)(const StepRecord&);
  void (*set)(StepRecord&, double);
  Derived derived = Derived::kNone;
};

#define TW_OPTIONAL_DOUBLE(field, ...)                              \
  OptionalDouble {                                                  \
    #field, [](const StepRecord& r) { return r.has_##field(); },    \
        [](const StepRecord& r) { return r.field(); },              \
        [](StepRecord& r, double v) { r.set_##field(v); }, __VA_ARGS__ \
  }
// The order of the columns in a blob: never reorder, only append (with a new
// format byte).
constexpr std::array<OptionalDouble, 9> kOptionalDoubles = {
    TW_OPTIONAL_DOUBLE(clip_coef, Derived::kClipCoef),
    TW_OPTIONAL_DOUBLE(loss_scale),
    TW_OPTIONAL_DOUBLE(max_attn_logit),
    TW_OPTIONAL_DOUBLE(log_z),
    TW_OPTIONAL_DOUBLE(loss),
    TW_OPTIONAL_DOUBLE(lr),
    TW_OPTIONAL_DOUBLE(shard_sq_sum),
    TW_OPTIONAL_DOUBLE(step_time_s, Derived::kStepTime),
    TW_OPTIONAL_DOUBLE(data_wait_s),
};
#undef TW_OPTIONAL_DOUBLE

constexpr double kClipEpsilon = 1e-6;  // as the client and clip_grad_norm_

double ClipCoef(double max_norm, double grad_norm) {
  return std::min(1.0, max_norm / (grad_norm + kClipEpsilon));
}

// The max_norm that gives the first record with 0 < clip_coef < 1 its
// coefficient exactly: the shortest decimal near clip_coef * (norm + 1e-6)
// that does (a max_norm is a number someone typed). nullopt if none.
std::optional<double> ImpliedMaxNorm(absl::Span<const uint64_t> norms,
                                     absl::Span<const uint8_t> present,
                                     absl::Span<const uint64_t> coefs) {
  for (size_t i = 0, j = 0; i < norms.size(); ++i) {
    if (!present[i]) continue;
    const double coef = std::bit_cast<double>(coefs[j++]);
    const double norm = std::bit_cast<double>(norms[i]);
    if (!(coef > 0 && coef < 1) || !std::isfinite(norm)) continue;
    const double estimate = coef * (norm + kClipEpsilon);
    for (int digits = 1; digits <= 17; ++digits) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.*g", digits, estimate);
      const double m = std::strtod(buf, nullptr);
      if (Bits(ClipCoef(m, norm)) == coefs[j - 1]) return m;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

// kPredicted's predictions for the present values of field f (raw bits, one
// per present value).
std::vector<uint64_t> Predictions(Derived derived, double max_norm,
                                  absl::Span<const uint8_t> present,
                                  absl::Span<const uint64_t> norms,
                                  absl::Span<const uint64_t> times) {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < present.size(); ++i) {
    if (!present[i]) continue;
    double p = 0;
    if (derived == Derived::kClipCoef) {
      p = ClipCoef(max_norm, std::bit_cast<double>(norms[i]));
    } else if (derived == Derived::kStepTime && i > 0) {
      p = static_cast<double>(static_cast<int64_t>(times[i] - times[i - 1])) * 1e-9;
    }
    out.push_back(Bits(p));
  }
  return out;
}

// The field numbers of StepRecord the columns hold.
constexpr int kColumnFields[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16};

// StepRecord's fields that no column holds, besides layer_stats (checked
// directly, as it is the one such field today): fields added to the proto
// after this codec land here and are kept in the residue.
const std::vector<const google::protobuf::FieldDescriptor*>& OtherFields() {
  static const auto* fields = [] {
    auto* out = new std::vector<const google::protobuf::FieldDescriptor*>;
    const google::protobuf::Descriptor* d = StepRecord::descriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const google::protobuf::FieldDescriptor* f = d->field(i);
      if (f->number() == StepRecord::kLayerStatsFieldNumber) continue;
      if (std::find(std::begin(kColumnFields), std::end(kColumnFields),
                    f->number()) == std::end(kColumnFields)) {
        out->push_back(f);
      }
    }
    return out;
  }();
  return *fields;
}

bool HasResidue(const StepRecord& r) {
  if (r.layer_stats_size() > 0) return true;
  // Once: GetReflection() per record checks the descriptors are built.
  static const google::protobuf::Reflection* const refl = StepRecord::GetReflection();
  if (!refl->GetUnknownFields(r).empty()) return true;
  const std::vector<const google::protobuf::FieldDescriptor*>& others =
      OtherFields();
  for (const google::protobuf::FieldDescriptor* f : others) {
    if (f->is_repeated() ? refl->FieldSize(r, f) > 0 : refl->HasField(r, f)) {
      return true;
    }
  }
  return false;
}

// The record less what the columns hold, serialized.
std::string Residue(const StepRecord& r) {
  StepRecord rest = r;
  for (int number : kColumnFields) {
    rest.GetReflection()->ClearField(
        &rest, StepRecord::descriptor()->FindFieldByNumber(number));
  }
  return rest.SerializeAsString();
}


// A chunk's columns, gathered from its records in one pass. Reused by the
// thread's next chunk (Reset keeps the vectors' memory): a chunk of one
// record made ~25 allocations, most of its encoding time.
struct Columns {
  void Reset(size_t n) {
    for (auto* v : {&steps, &times, &norms, &counts, &first_ids, &inner}) {
      v->clear();
      v->reserve(n);
    }
    for (auto& p : present) p.assign(n, 0);
    for (auto& v : values) v.clear();
    for (auto* f : {&clipped_present, &skipped, &has_residue}) f->assign(n, 0);
    clipped.clear();
    residues.clear();
  }
  std::vector<uint64_t> steps, times, norms, counts, first_ids, inner;
  std::array<std::vector<uint8_t>, kOptionalDoubles.size()> present;
  std::array<std::vector<uint64_t>, kOptionalDoubles.size()> values;
  std::vector<uint8_t> clipped_present, clipped, skipped, has_residue;
  std::vector<std::string> residues;
};

// Written out rather than through kOptionalDoubles' function pointers: the
// indirect calls were a tenth of the encoder's time.
#define TW_GATHER(index, field)                                                 \
  static_assert(std::string_view(kOptionalDoubles[index].name) == #field);     \
  c.present[index][i] = r.has_##field();                                       \
  if (r.has_##field()) c.values[index].push_back(Bits(r.field()));

template <typename Get>
void Gather(size_t n, Get& at, Columns& c) {
  for (size_t i = 0; i < n; ++i) {
    const StepRecord& r = at(i);
    c.steps.push_back(r.step());
    c.times.push_back(static_cast<uint64_t>(r.time_unix_nanos()));
    c.norms.push_back(Bits(r.grad_norm()));
    TW_GATHER(0, clip_coef);
    TW_GATHER(1, loss_scale);
    TW_GATHER(2, max_attn_logit);
    TW_GATHER(3, log_z);
    TW_GATHER(4, loss);
    TW_GATHER(5, lr);
    TW_GATHER(6, shard_sq_sum);
    TW_GATHER(7, step_time_s);
    TW_GATHER(8, data_wait_s);
    c.clipped_present[i] = r.has_clipped();
    if (r.has_clipped()) c.clipped.push_back(r.clipped());
    c.skipped[i] = r.skipped();
    const auto& ids = r.batch_ids();
    c.counts.push_back(static_cast<uint64_t>(ids.size()));
    if (!ids.empty()) {
      c.first_ids.push_back(static_cast<uint64_t>(ids[0]));
      for (int j = 1; j < ids.size(); ++j) {
        c.inner.push_back(static_cast<uint64_t>(ids[j]) - static_cast<uint64_t>(ids[j - 1]));
      }
    }
    c.has_residue[i] = HasResidue(r);
    if (c.has_residue[i]) c.residues.push_back(Residue(r));
  }
}
#undef TW_GATHER

template <typename Get>
std::string Encode(size_t n, Get&& at) {
  std::string out;
  out.reserve(16 + n * 48);
  out.push_back(static_cast<char>(kStepChunkColumnarV1));
  PutVarint(out, n);
  if (n == 0) return out;
  thread_local Columns c;
  c.Reset(n);
  Gather(n, at, c);
  BitWriter w(&out);
  constexpr auto kInt = SeriesKind::kInteger;

  // Steps: one code per record, even when every one is zero, so a blob of B
  // bytes holds at most 8B + 1 records (the decoder's bound on a count).
  PutSeries(w, c.steps.data(), n, kInt, {kDelta, kDeltaOfDelta}, false);
  PutSeries(w, c.times.data(), n, kInt, {kDelta, kDeltaOfDelta});
  PutDoubles(w, c.norms.data(), n, {kXor, kDelta, kDeltaOfDelta, kCentered});
  // Each optional double: presence, then (clip_coef) a bit and the implied
  // max_norm, then the values present.
  for (size_t f = 0; f < kOptionalDoubles.size(); ++f) {
    const Derived derived = kOptionalDoubles[f].derived;
    const std::vector<uint64_t>& col = c.values[f];
    PutBitmap(w, c.present[f]);
    std::optional<double> max_norm;
    if (derived == Derived::kClipCoef) {
      max_norm = ImpliedMaxNorm(c.norms, c.present[f], col);
      w.Put(max_norm.has_value(), 1);
      if (max_norm.has_value()) w.Put(Bits(*max_norm), 64);
    }
    if (derived == Derived::kNone || (derived == Derived::kClipCoef && !max_norm.has_value())) {
      PutDoubles(w, col.data(), col.size(), {kXor, kDelta, kDeltaOfDelta, kDelta3, kCentered});
    } else {
      const std::vector<uint64_t> pred =
          Predictions(derived, max_norm.value_or(0), c.present[f], c.norms, c.times);
      PutDoubles(w, col.data(), col.size(),
                 {kXor, kDelta, kDeltaOfDelta, kDelta3, kCentered, kPredicted}, pred.data());
    }
  }
  // clipped: presence, then the values present.
  PutBitmap(w, c.clipped_present);
  PutBitmap(w, c.clipped);
  PutBitmap(w, c.skipped);

  // Batch ids: the count of each record, the first id of each record that
  // has one (by delta against the previous record's), and each further id
  // as its difference from the id before it in the record.
  PutSeries(w, c.counts.data(), n, kInt, {kRaw, kDelta});
  PutSeries(w, c.first_ids.data(), c.first_ids.size(), kInt, {kRaw, kDelta, kDeltaOfDelta});
  // One code per id, as for the steps: the decoder's bound on the ids.
  PutSeries(w, c.inner.data(), c.inner.size(), kInt, {kRaw, kDelta}, false);

  // Residues: which records have one, their lengths, then (after the bits,
  // byte-aligned) their bytes.
  PutBitmap(w, c.has_residue);
  std::vector<uint64_t> lengths;
  for (const std::string& r : c.residues) lengths.push_back(r.size());
  PutSeries(w, lengths.data(), lengths.size(), kInt, {kRaw, kDelta});
  w.Finish();
  for (const std::string& r : c.residues) out.append(r);
  return out;
}

absl::Status Corrupt(std::string_view what, const BitReader& r) {
  return absl::DataLossError(absl::StrFormat(
      "step chunk: %s does not decode (at bit %d of %d)", what, r.bit_pos(),
      r.size_bits()));
}

absl::Status DecodeColumnar(std::string_view blob, RepeatedPtrField<StepRecord>* out) {
  const auto* data = reinterpret_cast<const unsigned char*>(blob.data());
  size_t pos = 1;
  uint64_t n = 0;
  for (int shift = 0;; shift += 7) {
    if (pos >= blob.size() || shift > 63) {
      return absl::DataLossError("step chunk: the record count is cut short");
    }
    const unsigned char b = data[pos++];
    n |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (b < 0x80) break;
  }
  const size_t bytes = blob.size() - pos;
  if (n == 0) {
    if (bytes != 0) return absl::DataLossError("step chunk: bytes after an empty chunk");
    return absl::OkStatus();
  }
  if (n > 8 * bytes + 1) {
    return absl::DataLossError(absl::StrCat(
        "step chunk: ", n, " records cannot fit in ", blob.size(), " bytes"));
  }
  BitReader r(data + pos, bytes);
  constexpr auto kInt = SeriesKind::kInteger;

  std::vector<uint64_t> steps, times, norms, counts, first_ids, inner, lengths;
  std::array<std::vector<uint8_t>, kOptionalDoubles.size()> present;
  std::array<std::vector<uint64_t>, kOptionalDoubles.size()> values;
  std::vector<uint8_t> clipped_present, clipped, skipped, has_residue;
  if (!GetSeries(r, n, kInt, steps)) return Corrupt("the steps", r);
  if (!GetSeries(r, n, kInt, times)) return Corrupt("time_unix_nanos", r);
  if (!GetDoubles(r, n, norms)) return Corrupt("grad_norm", r);
  for (size_t f = 0; f < kOptionalDoubles.size(); ++f) {
    const OptionalDouble& field = kOptionalDoubles[f];
    if (!GetBitmap(r, n, present[f])) {
      return Corrupt(absl::StrCat("the presence of ", field.name), r);
    }
    const size_t m = std::count(present[f].begin(), present[f].end(), 1);
    bool predicted = field.derived == Derived::kStepTime;
    double max_norm = 0;
    if (field.derived == Derived::kClipCoef && r.Get(1) != 0) {
      predicted = true;
      max_norm = std::bit_cast<double>(r.Get(64));
    }
    std::vector<uint64_t> pred;
    if (predicted) pred = Predictions(field.derived, max_norm, present[f], norms, times);
    if (!GetDoubles(r, m, values[f], predicted ? pred.data() : nullptr)) {
      return Corrupt(field.name, r);
    }
  }
  if (!GetBitmap(r, n, clipped_present)) return Corrupt("the presence of clipped", r);
  const size_t clipped_n = std::count(clipped_present.begin(), clipped_present.end(), 1);
  if (!GetBitmap(r, clipped_n, clipped)) return Corrupt("clipped", r);
  if (!GetBitmap(r, n, skipped)) return Corrupt("skipped", r);
  if (!GetSeries(r, n, kInt, counts)) return Corrupt("the batch id counts", r);
  // Every id after a record's first costs at least a bit, so a count that
  // asks for more cannot be right (and cannot ask for more memory).
  const uint64_t max_ids = n + 8 * bytes;
  uint64_t with_ids = 0, total_ids = 0;
  for (uint64_t c : counts) {
    if (c > max_ids - total_ids) return Corrupt("the batch id counts", r);
    with_ids += c > 0;
    total_ids += c;
  }
  if (!GetSeries(r, with_ids, kInt, first_ids)) return Corrupt("the first batch ids", r);
  if (!GetSeries(r, total_ids - with_ids, kInt, inner)) return Corrupt("the batch ids", r);
  if (!GetBitmap(r, n, has_residue)) return Corrupt("the residue bitmap", r);
  const size_t residue_n = std::count(has_residue.begin(), has_residue.end(), 1);
  if (!GetSeries(r, residue_n, kInt, lengths)) return Corrupt("the residue lengths", r);
  size_t at = r.AlignToByte();
  uint64_t residue_bytes = 0;
  for (uint64_t len : lengths) {
    residue_bytes += len;
    if (len > bytes || residue_bytes > bytes) return Corrupt("the residue lengths", r);
  }
  if (at + residue_bytes != bytes) {
    return absl::DataLossError(absl::StrCat(
        "step chunk: ", bytes - at, " bytes after the columns, ", residue_bytes,
        " expected"));
  }

  out->Reserve(static_cast<int>(n));
  std::array<size_t, kOptionalDoubles.size()> next{};
  size_t next_clipped = 0, next_first = 0, next_inner = 0, next_residue = 0;
  for (size_t i = 0; i < n; ++i) {
    StepRecord& rec = *out->Add();
    if (has_residue[i]) {
      const uint64_t len = lengths[next_residue++];
      if (!rec.ParseFromArray(data + pos + at, static_cast<int>(len))) {
        return absl::DataLossError(absl::StrCat(
            "step chunk: the residue of record ", i, " does not parse"));
      }
      at += len;
    }
    rec.set_step(steps[i]);
    rec.set_time_unix_nanos(static_cast<int64_t>(times[i]));
    rec.set_grad_norm(std::bit_cast<double>(norms[i]));
    for (size_t f = 0; f < kOptionalDoubles.size(); ++f) {
      if (present[f][i]) {
        kOptionalDoubles[f].set(rec, std::bit_cast<double>(values[f][next[f]++]));
      }
    }
    if (clipped_present[i]) rec.set_clipped(clipped[next_clipped++] != 0);
    rec.set_skipped(skipped[i] != 0);
    if (counts[i] > 0) {
      auto* ids = rec.mutable_batch_ids();
      ids->Reserve(static_cast<int>(counts[i]));
      uint64_t id = first_ids[next_first++];
      ids->Add(static_cast<int64_t>(id));
      for (uint64_t j = 1; j < counts[i]; ++j) {
        id += inner[next_inner++];
        ids->Add(static_cast<int64_t>(id));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

std::string EncodeStepChunk(const RepeatedPtrField<StepRecord>& records) {
  return Encode(static_cast<size_t>(records.size()),
                [&](size_t i) -> const StepRecord& { return records[static_cast<int>(i)]; });
}

std::string EncodeStepChunk(const RepeatedPtrField<StepRecord>& records,
                            absl::Span<const size_t> indices) {
  return Encode(indices.size(), [&](size_t i) -> const StepRecord& {
    return records[static_cast<int>(indices[i])];
  });
}

absl::Status DecodeStepChunk(std::string_view blob,
                             RepeatedPtrField<StepRecord>* out) {
  out->Clear();
  if (!blob.empty() && static_cast<unsigned char>(blob[0]) == kStepChunkColumnarV1) {
    return DecodeColumnar(blob, out);
  }
  if (!blob.empty() && (blob[0] & 7) >= 6) {
    return absl::DataLossError(absl::StrFormat(
        "step chunk: unknown format byte 0x%02x (written by a newer server?)",
        static_cast<unsigned char>(blob[0])));
  }
  // Written before the columnar format: a serialized StepBatch.
  v1::StepBatch batch;
  if (!batch.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::DataLossError("step chunk: a StepBatch chunk does not parse");
  }
  out->Swap(batch.mutable_records());
  return absl::OkStatus();
}

}  // namespace trainwatch
