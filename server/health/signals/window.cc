#include "health/signals/window.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "health/signals/select.h"
#include "trainwatch/v1/quantile.h"

namespace trainwatch {

namespace {
constexpr uint64_t kMaxNarrow = std::numeric_limits<uint16_t>::max();
constexpr uint64_t kMaxOffset = std::numeric_limits<uint32_t>::max();

// The first of the `n` sorted values at `first` for which `before` is false
// (std::partition_point), without data-dependent branches: a window's values
// are noise, so std::lower_bound's ~10 branches at W = 1,000 mispredict
// about half the time. The loop's only branch is on `n`, and the pointer
// step compiles to a conditional move. Same result as the std:: bounds.
template <typename Before>
double* BranchFreeBound(double* first, size_t n, Before before) {
  if (n == 0) return first;
  while (n > 1) {
    const size_t half = n / 2;
    first = before(first[half - 1]) ? first + half : first;
    n -= half;
  }
  return before(*first) ? first + 1 : first;
}
// std::lower_bound: the first value >= v.
double* LowerBound(double* first, double* last, double v) {
  return BranchFreeBound(first, static_cast<size_t>(last - first),
                         [v](double x) { return x < v; });
}
// std::upper_bound: the first value > v.
double* UpperBound(double* first, double* last, double v) {
  return BranchFreeBound(first, static_cast<size_t>(last - first),
                         [v](double x) { return !(v < x); });
}
using v1::NearestRank;  // the one definition, shared with the report

}  // namespace

uint64_t StepRing::MaxOffset() const {
  if (!narrow_.empty()) return kMaxNarrow;
  return wide_.empty() ? kMaxOffset : 0;
}

void StepRing::SetStep(size_t slot, uint64_t step) {
  if (!narrow_.empty()) {
    narrow_[slot] = static_cast<uint16_t>(step - base_);
  } else if (wide_.empty()) {
    offsets_[slot] = static_cast<uint32_t>(step - base_);
  } else {
    wide_[slot] = step;
  }
}

void StepRing::MakeRoom(uint64_t step) {
  // The entries that stay: all but the oldest when the ring is full.
  const size_t first = full() ? 1 : 0;
  uint64_t lo = step, hi = step;
  std::vector<uint64_t> kept(capacity_);
  for (size_t i = first; i < size_; ++i) {
    const uint64_t s = StepAt(Slot(i));
    kept[Slot(i)] = s;
    lo = std::min(lo, s);
    hi = std::max(hi, s);
  }
  // The narrowest width that holds them, never narrower than now.
  if (hi - lo > MaxOffset() && !narrow_.empty()) {
    narrow_ = {};
    offsets_.resize(capacity_);
  }
  if (hi - lo > MaxOffset() && wide_.empty()) {
    offsets_ = {};
    wide_.resize(capacity_);
  }
  base_ = lo;
  for (size_t i = first; i < size_; ++i) SetStep(Slot(i), kept[Slot(i)]);
}

size_t StepRing::Append(uint64_t step) {
  if (narrow_.empty() && offsets_.empty() && wide_.empty()) narrow_.resize(capacity_);
  if (empty() || (full() && capacity_ == 1)) {
    base_ = step;
  } else if (MaxOffset() != 0 && (step < base_ || step - base_ > MaxOffset())) {
    MakeRoom(step);
  }
  size_t slot;
  if (full()) {
    slot = head_;
    head_ = Slot(1);
  } else {
    slot = Slot(size_);
    ++size_;
  }
  SetStep(slot, step);
  return slot;
}

void StepRing::Clear() {
  head_ = size_ = 0;
  if (!offsets_.empty() || !wide_.empty()) {  // back to the narrowest
    wide_ = {};
    offsets_ = {};
    narrow_.resize(capacity_);
  }
}

std::optional<double> ValueWindow::Push(uint64_t step, double value) {
  if (ring_.capacity() == 0) return std::nullopt;
  if (values_.empty()) values_.resize(ring_.capacity());
  std::optional<double> evicted;
  if (ring_.full()) {
    evicted = values_[ring_.oldest_slot()];
    ranked_ -= std::isfinite(*evicted) ? 1 : 0;
  }
  values_[ring_.Append(step)] = value;
  ranked_ += std::isfinite(value) ? 1 : 0;
  ++pushes_;
  return evicted;
}

bool ValueWindow::PopNewestFrom(uint64_t step, double* value) {
  if (ring_.empty() || ring_.StepAt(ring_.newest_slot()) < step) return false;
  *value = values_[ring_.newest_slot()];
  ranked_ -= std::isfinite(*value) ? 1 : 0;
  ring_.PopNewest();
  return true;
}

void ValueWindow::RewindTo(uint64_t step) {
  double value;
  while (PopNewestFrom(step, &value)) {
  }
}

void ValueWindow::Clear() {
  ring_.Clear();
  ranked_ = 0;
}

std::optional<double> ValueWindow::Quantile(double q) const {
  if (ranked_ == 0) return std::nullopt;
  thread_local std::vector<double> finite;
  finite.clear();
  for (size_t i = 0; i < ring_.size(); ++i) {
    const double v = values_[ring_.Slot(i)];
    if (std::isfinite(v)) finite.push_back(v);
  }
  return SelectKth(finite.data(), finite.size(),
                   NearestRank(q, finite.size()));
}

std::optional<double> ValueWindow::Max() const {
  if (ranked_ == 0) return std::nullopt;
  double max = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < ring_.size(); ++i) {
    const double v = values_[ring_.Slot(i)];
    if (std::isfinite(v)) max = std::max(max, v);
  }
  return max;
}

size_t SortedBlocks::FindBlock(double value, bool after) const {
  // The same branch-free bounds, over the blocks' maxima.
  double* first = const_cast<double*>(maxima_.data());
  double* last = first + maxima_.size();
  return static_cast<size_t>(
      (after ? UpperBound(first, last, value) : LowerBound(first, last, value)) -
      first);
}

void SortedBlocks::Insert(double value) {
  if (blocks_.empty()) {
    blocks_.push_back(std::make_unique<Block>());
    maxima_.push_back(value);
    sizes_.push_back(0);
  }
  // Into the first block whose maximum is above it, else the last.
  size_t b = std::min(FindBlock(value, true), blocks_.size() - 1);
  if (sizes_[b] == kBlock) {
    // Split: the upper half moves to a new block after it.
    constexpr size_t kHalf = kBlock / 2;
    auto upper = std::make_unique<Block>();
    std::copy_n(blocks_[b]->begin() + kHalf, kHalf, upper->begin());
    blocks_.insert(blocks_.begin() + static_cast<std::ptrdiff_t>(b) + 1,
                   std::move(upper));
    maxima_.insert(maxima_.begin() + static_cast<std::ptrdiff_t>(b) + 1,
                   maxima_[b]);
    sizes_.insert(sizes_.begin() + static_cast<std::ptrdiff_t>(b) + 1, kHalf);
    sizes_[b] = kHalf;
    maxima_[b] = (*blocks_[b])[kHalf - 1];
    if (value > maxima_[b]) ++b;
  }
  double* data = blocks_[b]->data();
  double* end = data + sizes_[b];
  double* at = UpperBound(data, end, value);
  std::memmove(at + 1, at, static_cast<size_t>(end - at) * sizeof(double));
  *at = value;
  ++sizes_[b];
  maxima_[b] = data[sizes_[b] - 1];
  ++size_;
}

void SortedBlocks::Erase(double value) {
  const size_t b = FindBlock(value, false);
  double* data = blocks_[b]->data();
  double* end = data + sizes_[b];
  double* at = LowerBound(data, end, value);
  std::memmove(at, at + 1, static_cast<size_t>(end - at - 1) * sizeof(double));
  --sizes_[b];
  --size_;
  if (sizes_[b] == 0) {
    EraseBlock(b);
    return;
  }
  maxima_[b] = data[sizes_[b] - 1];
  // Nearly empty: merge into the block before it when both fit in one.
  constexpr size_t kFew = kBlock / 8;
  if (sizes_[b] < kFew && b > 0 && sizes_[b - 1] + sizes_[b] <= kBlock) {
    std::copy_n(data, sizes_[b], blocks_[b - 1]->data() + sizes_[b - 1]);
    sizes_[b - 1] += sizes_[b];
    maxima_[b - 1] = maxima_[b];
    EraseBlock(b);
  }
}

void SortedBlocks::EraseBlock(size_t b) {
  const auto at = static_cast<std::ptrdiff_t>(b);
  blocks_.erase(blocks_.begin() + at);
  maxima_.erase(maxima_.begin() + at);
  sizes_.erase(sizes_.begin() + at);
}

void SortedBlocks::Clear() {
  blocks_.clear();
  maxima_.clear();
  sizes_.clear();
  size_ = 0;
}

double SortedBlocks::At(size_t i) const {
  size_t b = 0;
  while (i >= sizes_[b]) i -= sizes_[b++];
  return (*blocks_[b])[i];
}

void OrderStatWindow::Push(uint64_t step, double value) {
  if (values_.capacity() == 0) return;
  const std::optional<double> evicted = values_.Push(step, value);
  if (evicted.has_value() && std::isfinite(*evicted)) sorted_.Erase(*evicted);
  if (std::isfinite(value)) sorted_.Insert(value);
}

void OrderStatWindow::RewindTo(uint64_t step) {
  double value;
  while (values_.PopNewestFrom(step, &value)) {
    if (std::isfinite(value)) sorted_.Erase(value);
  }
}

void OrderStatWindow::Clear() {
  values_.Clear();
  sorted_.Clear();
}

std::optional<double> OrderStatWindow::Quantile(double q) const {
  if (sorted_.size() == 0) return std::nullopt;
  return sorted_.At(NearestRank(q, sorted_.size()));
}

std::optional<double> OrderStatWindow::Max() const {
  if (sorted_.size() == 0) return std::nullopt;
  return sorted_.Back();
}

void FlagSeries::Set(size_t slot, bool flag) {
  const uint64_t mask = uint64_t{1} << (slot % 64);
  if (flag) {
    bits_[slot / 64] |= mask;
  } else {
    bits_[slot / 64] &= ~mask;
  }
}

void FlagSeries::Push(bool flag) {
  if (capacity_ == 0) return;
  if (bits_.empty()) bits_.resize((capacity_ + 63) / 64);
  size_t slot;
  if (size_ == capacity_) {
    slot = head_;
    count_ -= Get(slot) ? 1 : 0;
    head_ = Slot(1);
  } else {
    slot = Slot(size_);
    ++size_;
  }
  Set(slot, flag);
  count_ += flag ? 1 : 0;
}

void FlagSeries::PopNewest(size_t n) {
  for (; n > 0 && size_ > 0; --n) {
    count_ -= Get(Slot(size_ - 1)) ? 1 : 0;
    --size_;
  }
}

void FlagSeries::Clear() {
  head_ = size_ = count_ = 0;
}

void FlagWindow::Push(uint64_t step, bool flag) {
  if (ring_.capacity() == 0) return;
  ring_.Append(step);
  flags_.Push(flag);
}

void FlagWindow::RewindTo(uint64_t step) {
  size_t n = 0;
  while (!ring_.empty() && ring_.StepAt(ring_.newest_slot()) >= step) {
    ring_.PopNewest();
    ++n;
  }
  flags_.PopNewest(n);
}

void FlagWindow::Clear() {
  ring_.Clear();
  flags_.Clear();
}

}  // namespace trainwatch
