// The Report stream handler: validates what trainers send, hands it to the
// engine, and acks each batch once the engine reports it durable.
//
// Each stream is a small reactor (gRPC callback API) that never blocks: it
// reads one message at a time, stops reading while too many batches wait for
// their commit (so a slow disk pushes back on the trainer through gRPC flow
// control instead of filling memory), and writes cumulative acks.
//
// Errors: a refused message ends the stream with INVALID_ARGUMENT (or
// RESOURCE_EXHAUSTED) and a message naming the field and step; batches
// accepted before it are still committed and acked first. The stream takes
// raw bytes and parses them here, so that a message protobuf cannot parse
// (a string that is not UTF-8) is refused with INVALID_ARGUMENT too: the
// typed API would report it as the client closing its side.
// With auth on, a stream without a valid token ends with UNAUTHENTICATED
// before anything is read, and one whose token may not write the run with
// PERMISSION_DENIED.
//
// Threads: Ingest's methods may be called from any thread.
#ifndef TRAINWATCH_SERVER_INGEST_INGEST_H_
#define TRAINWATCH_SERVER_INGEST_INGEST_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/container/flat_hash_set.h"
#include "auth/auth.h"
#include "common/clock.h"
#include "ingest/validate.h"
#include "engine/engine.h"
#include "ingest/wire_budget.h"
#include "metrics/metrics.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch {

struct IngestOptions {
  ValidationLimits limits;
  // Batches of one stream submitted and not yet durable before the stream
  // stops reading.
  size_t max_inflight_batches = 64;
  // Batches of one stream submitted and not yet through the detectors before
  // the stream stops reading. Small, so that under saturation the backlog
  // waits in gRPC flow control (and the trainer's buffer) rather than in
  // front of the detectors: a bad step from any stream is then detected
  // within a few batches' processing time.
  size_t max_unprocessed_batches = 2;
  // Step records of all streams read and not yet through the detectors
  // before bulk streams (see below) stop reading: it bounds the work queued
  // in front of the detectors whatever the number of streams, so a bad step
  // waits behind at most this many records (alert latency at
  // saturation). Large enough to keep every engine shard busy.
  size_t max_unprocessed_records = 8192;
  // A stream whose last batch held at most this many records (a trainer
  // reporting at its own pace) is not held back by max_unprocessed_records:
  // only bulk senders (backfill, replay, a client catching up) wait for it.
  size_t small_batch_records = 256;
  // Checks each stream's bearer token before reading it, and its RunStart's
  // run_id against the token's write scopes; null: auth off. Borrowed.
  const Authorizer* authorizer = nullptr;
  // The closed loop whose directives ride on the responses; null: none.
  // Borrowed.
  ClosedLoop* closed_loop = nullptr;
  // What Drain()'s timeout is measured and waited on. Borrowed.
  const Clock* clock = Clock::Real();
};

class ReportReactor;

class Ingest {
 public:
  Ingest(IngestOptions options, Engine* engine, Metrics* metrics);
  ~Ingest();
  Ingest(const Ingest&) = delete;
  Ingest& operator=(const Ingest&) = delete;

  // A reactor for a new Report call (owned by gRPC until its OnDone); it
  // reads serialized ReportRequests and writes serialized ReportResponses.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewReport(
      grpc::CallbackServerContext* context);

  // Stops taking messages: every open stream acks what it already submitted
  // and ends with UNAVAILABLE; new streams are refused. Returns true once all
  // streams have ended, false if `timeout` passed first.
  bool Drain(std::chrono::milliseconds timeout);

 private:
  friend class ReportReactor;
  void Register(ReportReactor* r);
  void Unregister(ReportReactor* r);
  // Counts a refused stream under its reason (trainwatch_ingest_rejected_total).
  void CountRejected(const absl::Status& status);
  // Counts records refused alone from good batches (reason="invalid_record").
  void CountRejectedRecords(uint64_t records);
  // The shared bound on unprocessed records. Admit() is true while the
  // bound has room, else queues `r` to be woken (ReportReactor::Kick) when
  // Processed() makes room. Lock order: a reactor's mu_, then budget_mu_.
  bool Admit(ReportReactor* r);
  void Submitted(size_t records);
  void Processed(size_t records);

  const IngestOptions options_;
  const WireBudget budget_{options_.limits};  // after options_
  Engine* const engine_;
  Metrics* const metrics_;
  // trainwatch_ingest_rejected_total's series, one per reason, added once.
  const struct {
    prometheus::Counter& invalid_argument;
    prometheus::Counter& resource_exhausted;
    prometheus::Counter& unauthenticated;
    prometheus::Counter& permission_denied;
    prometheus::Counter& invalid_record;
  } rejected_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  absl::flat_hash_set<ReportReactor*> reactors_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex budget_mu_;  // a leaf: nothing else is locked under it
  size_t unprocessed_records_ ABSL_GUARDED_BY(budget_mu_) = 0;
  std::vector<ReportReactor*> budget_waiters_ ABSL_GUARDED_BY(budget_mu_);
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_INGEST_INGEST_H_
