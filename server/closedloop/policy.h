// The closed loop's policy (docs/closed-loop.md), a pure function of an alert,
// the run's directives so far, its events and its recent batch ids: which
// directive, if any, answers the alert. No thread, no store, no clock.
//
// The ladder (PaLM restarted before each spike and skipped 200-500 batches;
// OPT cut its LR 10%, then to 2/3):
//   1st rollback: the restart plan's checkpoint, skip the batches of the
//                 steps from the onset to the alert;
//   2nd:          an earlier checkpoint, skip 200 steps' batches from the
//                 onset, LR x 0.9;
//   3rd:          skip 500 steps' batches, LR x 0.67;
//   then:         Stop (the loop is exhausted).
// A rollback needs a CHECKPOINT_SAVED at least kRestartLeadSteps before the
// onset; without one nothing is proposed (a person reads the alert).
#ifndef TRAINWATCH_SERVER_CLOSEDLOOP_POLICY_H_
#define TRAINWATCH_SERVER_CLOSEDLOOP_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "health/health_config.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

// DirectiveRecord.state values, and the per-rank transitions that leave the
// state as it is.
inline constexpr char kProposed[] = "PROPOSED";
inline constexpr char kApproved[] = "APPROVED";
inline constexpr char kDelivered[] = "DELIVERED";
inline constexpr char kApplied[] = "APPLIED";
inline constexpr char kRejected[] = "REJECTED";
inline constexpr char kExpired[] = "EXPIRED";
inline constexpr char kSuperseded[] = "SUPERSEDED";
inline constexpr const char* kDirectiveStates[] = {kProposed, kApproved,  kDelivered, kApplied,
                                                   kRejected, kExpired, kSuperseded};
inline constexpr char kRankReceived[] = "RANK_RECEIVED";
inline constexpr char kRankApplied[] = "RANK_APPLIED";

// Still to happen (PROPOSED, APPROVED or DELIVERED).
bool Pending(const v1::DirectiveRecord& d);

// The restart plan's checkpoint starts at least this many steps before the
// step it restarts past (docs/detectors.md).
inline constexpr uint64_t kRestartLeadSteps = 100;

// The last CHECKPOINT_SAVED at least kRestartLeadSteps before `step`; null
// when there is none.
const v1::RunEvent* PlanCheckpoint(const std::vector<v1::RunEvent>& events, uint64_t step);

// The alerts that have a restart plan and propose a directive.
bool HasRestartPlan(std::string_view alertname);
// Whether the policy answers `alert` at all: the loop is on, and the alert
// is critical and has a restart plan (what Propose() asks first; a caller
// asks it before reading what Propose() needs).
bool Answers(const v1::Alert& alert, const ClosedLoopConfig& config);

// The action's name as closed_loop.auto lists it: checkpoint_now, skip,
// rollback, scale_lr, stop ("" when unset).
const char* ActionName(const v1::Directive& d);

// The lead's batch ids of its latest kMaxSteps records, oldest first; a
// step at or below one already held (a restart replaying) replaces those
// after it. Only records with ids are held, their ids in one flat queue: a
// pair and a vector for every record, most with no ids, were ~32 KiB of
// every run's memory (a quarter of it at 10,000 runs).
class RecentBatches {
 public:
  static constexpr size_t kMaxSteps = 1024;
  void Add(uint64_t step, const google::protobuf::RepeatedField<int64_t>& ids);
  // The ids of the steps in [from, to), in step order.
  std::vector<int64_t> Between(uint64_t from, uint64_t to) const;
  bool empty() const { return held_.empty(); }

 private:
  struct Held {
    uint64_t step;
    uint64_t record;  // records_ when it was added
    size_t ids;       // how many of ids_ are its
  };
  std::deque<Held> held_;
  std::deque<int64_t> ids_;
  uint64_t records_ = 0;
};

// What answers an alert: a directive without id, seq and approval, and the
// seq of a pending directive it replaces (0: none).
struct Proposal {
  v1::Directive directive;
  uint64_t supersedes = 0;
  bool exhausted = false;  // the Stop after max_rollbacks
};

// `history`: the run's directives, by seq. `attempt`: the alert's.
std::optional<Proposal> Propose(const v1::Alert& alert, uint32_t attempt,
                                const std::vector<v1::DirectiveRecord>& history,
                                const std::vector<v1::RunEvent>& events,
                                const RecentBatches& recent, const ClosedLoopConfig& config);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_CLOSEDLOOP_POLICY_H_
