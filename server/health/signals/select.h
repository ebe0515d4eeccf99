// Exact order statistics for the detectors' medians (Theil-Sen fits, robust
// levels and spreads): the value std::nth_element would put at index k,
// found by a quickselect whose partitions have no data-dependent branches.
// The detectors' inputs are noise, so nth_element's compare-and-branch
// partition mispredicts about every other element; this one writes every
// element unconditionally and counts with compare-and-adds. The k-th
// smallest value is unique, so results are bit-identical.
//
// Leaves the values as they are and keeps two per-thread buffers the size
// of the largest n seen. Values must be ordered (no NaN).
#ifndef TRAINWATCH_SERVER_HEALTH_SIGNALS_SELECT_H_
#define TRAINWATCH_SERVER_HEALTH_SIGNALS_SELECT_H_

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace trainwatch {

// The k-th smallest of v[0, n) (k < n). v is left as it is.
template <typename T>
T SelectKth(const T* v, size_t n, size_t k) {
  // Each pass splits [lo, hi) around a pivot into the other buffer: the
  // smaller values from its front, the larger from its back, each value
  // written to both cursors and one of them advanced; the pivot's copies are
  // the gap between. No loads depend on the stores, so a pass costs about two
  // cycles a value. The first pass reads v; the rest alternate between two
  // per-thread buffers.
  thread_local std::vector<T> buffers[2];
  for (std::vector<T>& b : buffers) {
    if (b.size() < n) b.resize(n);
  }
  const T* from = v;
  T* to = buffers[0].data();
  T* spare = buffers[1].data();
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
    from = to;
    std::swap(to, spare);
  }
  std::copy(from + lo, from + hi, to + lo);
  std::sort(to + lo, to + hi);
  return to[k];
}

// The upper median of v[0, n) (n > 0): the value at index n / 2 in order.
template <typename T>
T MedianOf(const T* v, size_t n) {
  return SelectKth(v, n, n / 2);
}

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_SIGNALS_SELECT_H_
