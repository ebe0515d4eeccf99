#include "engine/order_stat_set.h"

namespace trainwatch {

uint32_t OrderStatSet::NextPriority() {
  // xorshift64*: cheap, deterministic, good enough to balance a treap.
  rng_ ^= rng_ >> 12;
  rng_ ^= rng_ << 25;
  rng_ ^= rng_ >> 27;
  return static_cast<uint32_t>((rng_ * 0x2545F4914F6CDD1Dull) >> 32);
}

void OrderStatSet::Split(int32_t t, double value, uint64_t id, bool inclusive,
                         int32_t* left, int32_t* right) {
  if (t < 0) {
    *left = *right = -1;
    return;
  }
  Node& n = nodes_[t];
  bool goes_left = inclusive ? !Less(value, id, n.value, n.id)
                             : Less(n.value, n.id, value, id);
  if (goes_left) {
    int32_t l, r;
    Split(n.right, value, id, inclusive, &l, &r);
    nodes_[t].right = l;
    Update(t);
    *left = t;
    *right = r;
  } else {
    int32_t l, r;
    Split(n.left, value, id, inclusive, &l, &r);
    nodes_[t].left = r;
    Update(t);
    *left = l;
    *right = t;
  }
}

int32_t OrderStatSet::Merge(int32_t a, int32_t b) {
  if (a < 0) return b;
  if (b < 0) return a;
  if (nodes_[a].priority > nodes_[b].priority) {
    nodes_[a].right = Merge(nodes_[a].right, b);
    Update(a);
    return a;
  }
  nodes_[b].left = Merge(a, nodes_[b].left);
  Update(b);
  return b;
}

void OrderStatSet::Insert(double value, uint64_t id) {
  int32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    index = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
  }
  nodes_[index] = Node{value, id, NextPriority(), 1, -1, -1};
  int32_t l, r;
  Split(root_, value, id, /*inclusive=*/false, &l, &r);
  root_ = Merge(Merge(l, index), r);
}

bool OrderStatSet::Erase(double value, uint64_t id) {
  int32_t l, mid, r;
  Split(root_, value, id, /*inclusive=*/false, &l, &r);
  Split(r, value, id, /*inclusive=*/true, &mid, &r);
  bool found = mid >= 0;
  if (found) {
    // Erase one node: a key inserted twice (the same step pushed again by
    // a new lead rank) keeps its other copy.
    free_.push_back(mid);
    l = Merge(l, Merge(nodes_[mid].left, nodes_[mid].right));
  }
  root_ = Merge(l, r);
  return found;
}

double OrderStatSet::Kth(size_t k) const {
  int32_t t = root_;
  while (t >= 0) {
    uint32_t left = Size(nodes_[t].left);
    if (k < left) {
      t = nodes_[t].left;
    } else if (k == left) {
      return nodes_[t].value;
    } else {
      k -= left + 1;
      t = nodes_[t].right;
    }
  }
  return 0.0;  // k out of range: callers check size()
}

void OrderStatSet::Clear() {
  nodes_.clear();
  free_.clear();
  root_ = -1;
}

}  // namespace trainwatch
