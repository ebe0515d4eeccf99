// The client's background side: batching, the Report stream, acks, resends.
#ifndef TRAINWATCH_CLIENT_SRC_SENDER_H_
#define TRAINWATCH_CLIENT_SRC_SENDER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "directive_inbox.h"
#include "intake.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch::internal {

// Moves items from the Intake to the server over one TrainingHealth.Report
// stream at a time, and keeps each batch until the server acknowledges it.
//
// The sender thread forms batches (assigning each batch or event the next
// seq), writes them, and when a stream ends reconnects with backoff, sends the
// RunStart again and resends everything unacknowledged in seq order. A reader
// thread per stream applies the cumulative acks. Items leave memory only when
// acked, or when the server refuses their batch as invalid.
//
// Thread-safety: Start() and Stop() are called once each by the owner.
// WaitResolved() and the counters may be called from any thread.
class Sender {
 public:
  // `credentials`: from NewChannelCredentials(options.security).
  // `inbox` (borrowed) gets the directives the responses carry; the
  // sender acks each new one RECEIVED.
  Sender(const ClientOptions& options, Intake* intake,
         std::shared_ptr<grpc::ChannelCredentials> credentials,
         DirectiveInbox* inbox = nullptr);
  ~Sender();  // Stop(absl::ZeroDuration()) if still running.
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  void Start();

  // Ends the stream (WritesDone, then waits for the server to close it) and
  // the threads. Cancels the stream if that takes longer than `grace`, so a
  // hung server or an outage cannot hold up the caller.
  void Stop(absl::Duration grace);

  // Waits until `items` admitted items are resolved (acknowledged, or dropped
  // because the server refused them), or until the deadline, Stop() or a
  // refusal of the stream. Returns whether they were.
  bool WaitResolved(uint64_t items, absl::Time deadline);

  uint64_t resolved() const;
  uint64_t sent() const { return sent_.load(std::memory_order_relaxed); }
  uint64_t acked() const { return acked_.load(std::memory_order_relaxed); }
  uint64_t rejected() const { return rejected_.load(std::memory_order_relaxed); }
  absl::Status last_rejection() const;
  uint64_t reconnects() const {
    return reconnects_.load(std::memory_order_relaxed);
  }
  std::optional<double> recommended_max_norm() const;
  // See Client::Refusal().
  absl::Status refusal() const;

 private:
  using Stream =
      grpc::ClientReaderWriter<v1::ReportRequest, v1::ReportResponse>;

  // A batch or event from the moment it gets a seq until it is acked.
  // Shared so a resend can write it while an ack removes it from unacked_.
  struct Pending {
    uint64_t seq = 0;
    std::shared_ptr<const v1::ReportRequest> request;
    uint64_t records = 0;         // steps in it; 0 for an event
    uint64_t items = 0;           // admitted items it holds (records, or 1)
    uint64_t drops_reported = 0;  // StepBatch.dropped it carries
  };

  void Run();
  // Runs one stream until it ends or Stop(); returns its status and the
  // highest seq written on it.
  grpc::Status RunStream(uint64_t* written_through);
  void ReadResponses(Stream* stream);
  // Forms the next batch or event from the intake into unacked_; false when
  // the intake is empty.
  bool FormNext();
  // Decides what to do about a stream that ended: drops a refused batch, logs,
  // and returns how long to wait before reconnecting.
  absl::Duration OnStreamEnd(const grpc::Status& status,
                             uint64_t written_through);
  // Logs the total of dropped steps (sender thread; rate-limited).
  void LogDrops();
  // A response said some records of its batches were refused alone.
  void OnRejectedLocked(const v1::ReportResponse& response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Logs "trainwatch: <line>" unless the last line logged had the same key.
  void LogOnce(const std::string& key, const std::string& line)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClientOptions options_;
  Intake* const intake_;
  DirectiveInbox* const inbox_;  // null: directives are ignored
  const absl::Duration flush_interval_;
  const absl::Duration initial_backoff_;
  const absl::Duration max_backoff_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TrainingHealth::Stub> stub_;
  v1::ReportRequest run_start_;
  std::thread thread_;

  // Sender thread only.
  uint64_t next_seq_ = 1;
  std::optional<QueueItem> carried_;  // an event that ended the last batch
  absl::Duration backoff_;
  absl::Time last_drop_log_ = absl::InfinitePast();

  mutable absl::Mutex mu_;
  std::deque<Pending> unacked_ ABSL_GUARDED_BY(mu_);  // ascending seq
  uint64_t unacked_items_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t resolved_items_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;  // a Flush() wants data sent now
  bool stream_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool acked_on_stream_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // the sender thread has finished
  // The live stream's context, so Stop() can cancel it.
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<double> recommended_max_norm_ ABSL_GUARDED_BY(mu_);
  // Why the server refused the last stream as a whole; OK after an ack.
  absl::Status refusal_ ABSL_GUARDED_BY(mu_);
  std::string last_log_key_ ABSL_GUARDED_BY(mu_);
  // The server's latest reason for a record refused alone.
  absl::Status last_rejection_ ABSL_GUARDED_BY(mu_);
  absl::Time last_rejection_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t rejected_unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  // When a quota refusal (RESOURCE_EXHAUSTED) was last logged.
  absl::Time last_quota_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> acked_{0};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> reconnects_{0};
};

}  // namespace trainwatch::internal

#endif  // TRAINWATCH_CLIENT_SRC_SENDER_H_
