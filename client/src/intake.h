// The hand-off between the training loop (Record) and the sender thread.
#ifndef TRAINWATCH_CLIENT_SRC_INTAKE_H_
#define TRAINWATCH_CLIENT_SRC_INTAKE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "mpmc_queue.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::internal {

struct EventItem {
  EventKind kind = EventKind::kCheckpointSaved;
  uint64_t step = 0;
  std::string detail;
  int64_t time_unix_nanos = 0;
};

// One queue entry. Steps and events share the queue so that an event keeps
// its place among the steps recorded around it. A step is a Step (Record())
// or a wire record (RecordProto()), the latter behind a pointer: a
// StepRecord is larger than a Step, and every cell is allocated up front.
// A DirectiveAck travels alone, like an event.
using QueueItem =
    std::variant<Step, std::unique_ptr<v1::StepRecord>, EventItem, v1::DirectiveAck>;

// Bounds what the client holds in memory and admits items without a lock.
// "Held" counts an item from admission until it leaves memory: acknowledged
// by the server, or dropped because the server refused its batch. Holding the
// count here rather than asking the queue lets capacity cover both queued and
// sent-but-unacknowledged items with one atomic. The queue has a cell for
// every item capacity allows (next power of two, about 240 bytes a cell,
// allocated and touched up front), so an admitted item always finds one even
// while the sender is stuck in a write.
//
// Thread-safety: the Offer methods and the counters may be called
// from any thread. Take() is for the single sender thread. Release(),
// CountRefused() and the unreported-drop methods may be called from the
// sender and reader threads.
class Intake {
 public:
  explicit Intake(size_t capacity);
  Intake(const Intake&) = delete;
  Intake& operator=(const Intake&) = delete;

  // Never block. Return false when `capacity` items are held (a step is then
  // counted as dropped) or after Close().
  bool OfferStep(Step&& step);
  bool OfferRecord(std::unique_ptr<v1::StepRecord> record);
  bool OfferEvent(EventItem&& event);
  bool OfferDirectiveAck(v1::DirectiveAck&& ack);

  // After Close(), nothing more is admitted: no thread would send it.
  void Close() { closed_.store(true, std::memory_order_relaxed); }

  std::optional<QueueItem> Take() { return queue_.TryPop(); }

  // `items` admitted items have left memory.
  void Release(uint64_t items) {
    held_.fetch_sub(items, std::memory_order_relaxed);
  }

  // Admitted steps that were then dropped (the server refused their batch).
  void CountRefused(uint64_t steps);

  // Drops not yet reported to the server in a StepBatch. A batch takes them
  // all; if that batch is refused they are given back for the next one.
  uint64_t TakeUnreportedDrops() {
    return unreported_drops_.exchange(0, std::memory_order_relaxed);
  }
  void RestoreUnreportedDrops(uint64_t drops) {
    unreported_drops_.fetch_add(drops, std::memory_order_relaxed);
  }

  size_t capacity() const { return capacity_; }
  // Steps and events admitted so far; Flush() waits for these.
  uint64_t admitted() const { return admitted_.load(std::memory_order_acquire); }
  uint64_t recorded() const { return recorded_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  template <typename Item>
  bool Admit(Item&& item);
  void OnFull(bool is_step);

  const size_t capacity_;
  MpmcQueue<QueueItem> queue_;
  std::atomic<bool> closed_{false};
  std::atomic<uint64_t> held_{0};
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> recorded_{0};
  std::atomic<uint64_t> dropped_{0};
  std::atomic<uint64_t> unreported_drops_{0};
  // steady_clock nanoseconds of the latest drop, 0 before the first; used to
  // log the start of each burst of drops, not every drop.
  std::atomic<int64_t> last_drop_nanos_{0};
};

}  // namespace trainwatch::internal

#endif  // TRAINWATCH_CLIENT_SRC_INTAKE_H_
