// The directives a client received (docs/closed-loop.md) and what it answered.
#ifndef TRAINWATCH_CLIENT_SRC_DIRECTIVE_INBOX_H_
#define TRAINWATCH_CLIENT_SRC_DIRECTIVE_INBOX_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::internal {

// Applies a directive id at most once: the server resends a directive on
// every ack until this rank acks it APPLIED, and reissues one a rank was late
// for with a later apply_at_step; an id answered APPLIED is never due again.
//
// Thread-safe: the stream's reader thread adds, the training loop takes.
class DirectiveInbox {
 public:
  // Directives on a response; returns the ids new to this client (to ack
  // RECEIVED): never seen, or reissued for a later step after a REJECTED.
  std::vector<std::string> OnResponse(
      const google::protobuf::RepeatedPtrField<v1::Directive>& directives);

  // Not answered, apply_at_step <= step, by seq.
  std::vector<Directive> Due(uint64_t step) const;

  // Marks `id` answered; false when unknown or already APPLIED.
  bool Answer(const std::string& id, DirectiveState state);

  static Directive FromWire(const v1::Directive& d);

 private:
  struct Entry {
    Directive directive;
    bool answered = false;
    bool applied = false;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Entries not answered (changed under mu_): Due() with none open takes
  // no lock.
  std::atomic<size_t> unanswered_{0};
};

}  // namespace trainwatch::internal

#endif  // TRAINWATCH_CLIENT_SRC_DIRECTIVE_INBOX_H_
