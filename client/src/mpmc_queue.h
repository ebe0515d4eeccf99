// A bounded lock-free multi-producer multi-consumer queue (Dmitry Vyukov's
// design): the path from Record() to the sender thread, which must never block
// and never take a lock, however many training threads report.
#ifndef TRAINWATCH_CLIENT_SRC_MPMC_QUEUE_H_
#define TRAINWATCH_CLIENT_SRC_MPMC_QUEUE_H_

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <utility>

namespace trainwatch::internal {

// Fixed-capacity FIFO of T. Each cell carries a sequence number that says
// whose turn it is (a producer of lap n, or a consumer of lap n), so producers
// and consumers only contend on one CAS of their own position counter.
//
// Thread-safety: TryEmplace() and TryPop() may be called from any number of
// threads concurrently. A push can fail while the queue is not quite full
// (a consumer of the previous lap has claimed but not yet vacated the cell);
// callers treat that as full.
template <typename T>
class MpmcQueue {
 public:
  // Capacity is min_capacity rounded up to a power of two (at least 2), so a
  // position maps to a cell with a mask instead of a division.
  explicit MpmcQueue(size_t min_capacity)
      : mask_(std::bit_ceil(min_capacity < 2 ? size_t{2} : min_capacity) - 1),
        cells_(new Cell[mask_ + 1]) {
    for (size_t i = 0; i <= mask_; ++i) {
      cells_[i].sequence.store(i, std::memory_order_relaxed);
    }
  }

  ~MpmcQueue() {
    while (TryPop().has_value()) {
    }
  }

  MpmcQueue(const MpmcQueue&) = delete;
  MpmcQueue& operator=(const MpmcQueue&) = delete;

  size_t capacity() const { return mask_ + 1; }

  // Constructs a T from args at the tail. Returns false, leaving args
  // untouched, when the queue is full.
  template <typename... Args>
  bool TryEmplace(Args&&... args) {
    size_t pos = enqueue_pos_.load(std::memory_order_relaxed);
    Cell* cell;
    for (;;) {
      cell = &cells_[pos & mask_];
      const size_t sequence = cell->sequence.load(std::memory_order_acquire);
      const intptr_t diff =
          static_cast<intptr_t>(sequence) - static_cast<intptr_t>(pos);
      if (diff == 0) {
        if (enqueue_pos_.compare_exchange_weak(pos, pos + 1,
                                               std::memory_order_relaxed)) {
          break;
        }
      } else if (diff < 0) {
        return false;  // the cell still holds an item from the previous lap
      } else {
        pos = enqueue_pos_.load(std::memory_order_relaxed);
      }
    }
    ::new (static_cast<void*>(cell->storage)) T(std::forward<Args>(args)...);
    cell->sequence.store(pos + 1, std::memory_order_release);
    return true;
  }

  // Removes the head; nullopt when the queue is empty.
  std::optional<T> TryPop() {
    size_t pos = dequeue_pos_.load(std::memory_order_relaxed);
    Cell* cell;
    for (;;) {
      cell = &cells_[pos & mask_];
      const size_t sequence = cell->sequence.load(std::memory_order_acquire);
      const intptr_t diff =
          static_cast<intptr_t>(sequence) - static_cast<intptr_t>(pos + 1);
      if (diff == 0) {
        if (dequeue_pos_.compare_exchange_weak(pos, pos + 1,
                                               std::memory_order_relaxed)) {
          break;
        }
      } else if (diff < 0) {
        return std::nullopt;  // the producer of this lap has not written yet
      } else {
        pos = dequeue_pos_.load(std::memory_order_relaxed);
      }
    }
    std::optional<T> result(std::move(*cell->value()));
    std::destroy_at(cell->value());
    // Hand the cell to the producer of the next lap.
    cell->sequence.store(pos + mask_ + 1, std::memory_order_release);
    return result;
  }

 private:
  struct Cell {
    std::atomic<size_t> sequence;
    alignas(T) unsigned char storage[sizeof(T)];
    T* value() { return std::launder(reinterpret_cast<T*>(storage)); }
  };

  static constexpr size_t kCacheLine = 64;

  const size_t mask_;
  const std::unique_ptr<Cell[]> cells_;
  // Apart, so producers and consumers do not invalidate each other's line.
  alignas(kCacheLine) std::atomic<size_t> enqueue_pos_{0};
  alignas(kCacheLine) std::atomic<size_t> dequeue_pos_{0};
};

}  // namespace trainwatch::internal

#endif  // TRAINWATCH_CLIENT_SRC_MPMC_QUEUE_H_
