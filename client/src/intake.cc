#include "intake.h"

#include <chrono>
#include <cstdio>
#include <type_traits>
#include <utility>

namespace trainwatch::internal {
namespace {

// A drop this long after the previous one starts a new burst worth a log line.
constexpr std::chrono::nanoseconds kQuietBeforeRelog = std::chrono::seconds(10);

}  // namespace

Intake::Intake(size_t capacity) : capacity_(capacity), queue_(capacity) {}

bool Intake::OfferStep(Step&& step) { return Admit(std::move(step)); }

bool Intake::OfferRecord(std::unique_ptr<v1::StepRecord> record) {
  return Admit(std::move(record));
}

bool Intake::OfferEvent(EventItem&& event) { return Admit(std::move(event)); }

bool Intake::OfferDirectiveAck(v1::DirectiveAck&& ack) { return Admit(std::move(ack)); }

template <typename Item>
bool Intake::Admit(Item&& item) {
  constexpr bool kIsStep = !std::is_same_v<std::decay_t<Item>, EventItem> &&
                          !std::is_same_v<std::decay_t<Item>, v1::DirectiveAck>;
  if (closed_.load(std::memory_order_relaxed)) return false;
  // A CAS rather than fetch_add-then-undo: an overshoot would make a
  // concurrent Record() fail although there was room.
  uint64_t held = held_.load(std::memory_order_relaxed);
  do {
    if (held >= capacity_) {
      OnFull(kIsStep);
      return false;
    }
  } while (!held_.compare_exchange_weak(held, held + 1,
                                        std::memory_order_relaxed));
  // The queue has at least `capacity_` cells and every queued item is held,
  // so this only fails if a consumer is mid-pop on a full queue.
  if (!queue_.TryEmplace(std::in_place_type<Item>, std::forward<Item>(item))) {
    held_.fetch_sub(1, std::memory_order_relaxed);
    OnFull(kIsStep);
    return false;
  }
  if constexpr (kIsStep) recorded_.fetch_add(1, std::memory_order_relaxed);
  // Release: a Flush() that sees this count also sees the item in the queue.
  admitted_.fetch_add(1, std::memory_order_release);
  return true;
}

void Intake::OnFull(bool is_step) {
  if (is_step) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    unreported_drops_.fetch_add(1, std::memory_order_relaxed);
  }
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  const int64_t previous = last_drop_nanos_.exchange(now);
  if (previous == 0 || now - previous >= kQuietBeforeRelog.count()) {
    std::fprintf(stderr, "trainwatch: buffer full (%zu records), dropping %s\n",
                 capacity_, is_step ? "steps" : "events");
  }
}

void Intake::CountRefused(uint64_t steps) {
  dropped_.fetch_add(steps, std::memory_order_relaxed);
  unreported_drops_.fetch_add(steps, std::memory_order_relaxed);
}

}  // namespace trainwatch::internal
