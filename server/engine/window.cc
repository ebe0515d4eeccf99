#include "engine/window.h"

#include <cmath>

namespace trainwatch {

void OrderStatWindow::Push(uint64_t step, double value) {
  if (capacity_ == 0) return;
  if (entries_.size() == capacity_) PopFront();
  entries_.emplace_back(step, value);
  if (std::isfinite(value)) tree_.Insert(value, step);
}

void OrderStatWindow::PopFront() {
  auto [step, value] = entries_.front();
  if (std::isfinite(value)) tree_.Erase(value, step);
  entries_.pop_front();
}

void OrderStatWindow::RewindTo(uint64_t step) {
  while (!entries_.empty() && entries_.back().first >= step) {
    auto [s, value] = entries_.back();
    if (std::isfinite(value)) tree_.Erase(value, s);
    entries_.pop_back();
  }
}

void OrderStatWindow::Clear() {
  entries_.clear();
  tree_.Clear();
}

std::optional<double> OrderStatWindow::Quantile(double q) const {
  if (tree_.empty()) return std::nullopt;
  double clamped = q < 0 ? 0 : (q > 1 ? 1 : q);
  // Nearest rank: the smallest value with at least q of the values at or below it.
  size_t n = tree_.size();
  size_t rank = static_cast<size_t>(std::ceil(clamped * static_cast<double>(n)));
  size_t index = rank == 0 ? 0 : rank - 1;
  return tree_.Kth(index);
}

std::optional<double> OrderStatWindow::Max() const {
  if (tree_.empty()) return std::nullopt;
  return tree_.Kth(tree_.size() - 1);
}

void FlagWindow::Push(uint64_t step, bool flag) {
  if (capacity_ == 0) return;
  if (entries_.size() == capacity_) {
    count_ -= entries_.front().second ? 1 : 0;
    entries_.pop_front();
  }
  entries_.emplace_back(step, flag);
  count_ += flag ? 1 : 0;
}

void FlagWindow::RewindTo(uint64_t step) {
  while (!entries_.empty() && entries_.back().first >= step) {
    count_ -= entries_.back().second ? 1 : 0;
    entries_.pop_back();
  }
}

void FlagWindow::Clear() {
  entries_.clear();
  count_ = 0;
}

}  // namespace trainwatch
