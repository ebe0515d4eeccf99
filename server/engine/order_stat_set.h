// A set of (value, id) pairs with O(log n) insert, erase and k-th smallest:
// a treap whose nodes live in one vector (about 32 bytes a value), so a run's
// windows cost a few tens of KiB and no allocation per step once warm.
//
// Not thread-safe.
#ifndef TRAINWATCH_SERVER_ENGINE_ORDER_STAT_SET_H_
#define TRAINWATCH_SERVER_ENGINE_ORDER_STAT_SET_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trainwatch {

class OrderStatSet {
 public:
  // A key inserted twice is held twice.
  void Insert(double value, uint64_t id);
  // Removes one copy of the key; false when the key is not in the set.
  bool Erase(double value, uint64_t id);
  // The k-th smallest value, 0-based; k < size().
  double Kth(size_t k) const;
  size_t size() const { return root_ < 0 ? 0 : nodes_[root_].size; }
  bool empty() const { return root_ < 0; }
  void Clear();

 private:
  struct Node {
    double value;
    uint64_t id;
    uint32_t priority;
    uint32_t size;
    int32_t left;
    int32_t right;
  };
  static bool Less(double v1, uint64_t i1, double v2, uint64_t i2) {
    return v1 < v2 || (v1 == v2 && i1 < i2);
  }
  uint32_t Size(int32_t t) const { return t < 0 ? 0 : nodes_[t].size; }
  void Update(int32_t t) {
    nodes_[t].size = 1 + Size(nodes_[t].left) + Size(nodes_[t].right);
  }
  // Splits t into keys < (value, id) [or <= when inclusive] and the rest.
  void Split(int32_t t, double value, uint64_t id, bool inclusive,
             int32_t* left, int32_t* right);
  int32_t Merge(int32_t a, int32_t b);
  uint32_t NextPriority();

  std::vector<Node> nodes_;
  std::vector<int32_t> free_;
  int32_t root_ = -1;
  uint64_t rng_ = 0x9E3779B97F4A7C15ull;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ENGINE_ORDER_STAT_SET_H_
