// Exact order statistics for the detectors' medians (Theil-Sen fits, robust
// levels and spreads): the value std::nth_element would put at index k,
// found by a quickselect whose partitions have no data-dependent branches.
// The detectors' inputs are noise, so nth_element's compare-and-branch
// partition mispredicts about every other element; this one writes every
// element unconditionally and counts with compare-and-adds. The k-th
// smallest value is unique, so results are bit-identical.
//
// Reorders (scrambles) the values it is given and keeps a per-thread buffer
// of the largest n seen. Values must be ordered (no NaN).
#ifndef TRAINWATCH_SERVER_HEALTH_SELECT_H_
#define TRAINWATCH_SERVER_HEALTH_SELECT_H_

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace trainwatch {

// The k-th smallest of v[0, n) (k < n).
template <typename T>
T SelectKth(T* v, size_t n, size_t k) {
  // Each pass splits [lo, hi) around a pivot into another buffer: the
  // smaller values from its front, the larger from its back, each value
  // written to both cursors and one of them advanced; the pivot's copies are
  // the gap between. No loads depend on the stores, so a pass costs about two
  // cycles a value. The passes alternate between v and a per-thread buffer.
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  T* from = v;
  T* to = buffer.data();
  size_t lo = 0, hi = n;  // k is in [lo, hi)
  while (hi - lo > 16) {
    const T a = from[lo], b = from[lo + (hi - lo) / 2], c = from[hi - 1];
    const T pivot = std::max(std::min(a, b), std::min(std::max(a, b), c));
    size_t less = 0, more = 0;
    for (size_t i = lo; i < hi; ++i) {
      const T x = from[i];
      to[lo + less] = x;
      to[hi - 1 - more] = x;
      less += x < pivot ? 1 : 0;
      more += pivot < x ? 1 : 0;
    }
    if (k < lo + less) {
      hi = lo + less;
    } else if (k >= hi - more) {
      lo = hi - more;
    } else {
      return pivot;  // a run of equal values ends the search
    }
    std::swap(from, to);
  }
  std::sort(from + lo, from + hi);
  return from[k];
}

// The upper median of v[0, n) (n > 0): the value at index n / 2 in order.
template <typename T>
T MedianInPlace(T* v, size_t n) {
  return SelectKth(v, n, n / 2);
}

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SELECT_H_
