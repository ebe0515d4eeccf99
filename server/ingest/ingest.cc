#include "ingest/ingest.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "auth/call_token.h"
#include "common/grpc_status.h"

namespace trainwatch {
// One Report stream. Lifetime: gRPC owns it; it deletes itself in OnDone,
// which gRPC calls only after Finish. Finish is called only once no engine
// callback is outstanding (pending_ == 0) and no write is in flight, so a
// callback never outlives the reactor. Start*/Finish are called outside mu_,
// as the last thing a method does.
class ReportReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `refusal`: end the stream with it at once. `scope`: what the stream's
  // token may write (null: auth off).
  ReportReactor(Ingest* ingest, std::optional<grpc::Status> refusal,
                const TokenScope* scope)
      : ingest_(ingest), scope_(scope) {
    ingest_->metrics_->streams_active.Increment();
    if (refusal.has_value()) {
      finished_ = true;
      Finish(*refusal);
      return;
    }
    ingest_->Register(this);  // before any callback can end the stream
    read_in_flight_ = true;
    StartRead(&request_bytes_);
  }

  void OnReadDone(bool ok) override {
    mu_.Lock();
    read_in_flight_ = false;
    if (!ok) {
      // The client closed its side (or went away): ack what is pending, end.
      EndLocked(grpc::Status::OK);
    } else if (!end_status_.has_value()) {
      absl::Status s = ParseLocked();
      if (s.ok()) s = HandleLocked();
      // The message is handled: its arena stays only with the records it
      // sent on (an idle stream would otherwise hold its last batch).
      request_ = nullptr;
      arena_.reset();
      if (!s.ok()) {
        ingest_->CountRejected(s);
        EndLocked(ToGrpcStatus(s));
      }
    }
    ProgressAndUnlock();
  }

  void OnWriteDone(bool ok) override {
    mu_.Lock();
    write_in_flight_ = false;
    if (!ok) EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    ProgressAndUnlock();
  }

  void OnCancel() override {
    mu_.Lock();
    EndLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    ProgressAndUnlock();
  }

  void OnDone() override {
    ingest_->metrics_->streams_active.Decrement();
    ingest_->Unregister(this);
    {
      absl::MutexLock lock(&mu_);
      if (pins_ > 0) {  // Drain() still uses this reactor; it deletes it
        done_ = true;
        return;
      }
    }
    delete this;
  }

  // Keeps the reactor alive across a BeginDrain() made outside Ingest's lock
  // (Finish may run OnDone inline, and OnDone takes that lock). Pin() only
  // under Ingest's lock, while the reactor is registered.
  void Pin() {
    absl::MutexLock lock(&mu_);
    ++pins_;
  }
  void Unpin() {
    {
      absl::MutexLock lock(&mu_);
      if (--pins_ > 0 || !done_) return;
    }
    delete this;
  }

  // Re-evaluates what to do next (Ingest::Processed made room for a read).
  void Kick() {
    mu_.Lock();
    waiting_budget_ = false;
    ProgressAndUnlock();
  }

  void BeginDrain() {
    mu_.Lock();
    EndLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                           "the server is shutting down; everything acked is "
                           "stored, resend the rest after it restarts"));
    ProgressAndUnlock();
  }

 private:
  // The message's cost is judged on its bytes (WireBudget) before the parse
  // materialises it.
  absl::Status ParseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    grpc::Slice slice;
    if (!request_bytes_.TrySingleSlice(&slice).ok() &&
        !request_bytes_.DumpToSingleSlice(&slice).ok()) {
      return InStream(absl::InternalError("cannot read the ReportRequest's bytes"));
    }
    request_bytes_.Clear();
    const std::string_view wire(reinterpret_cast<const char*>(slice.begin()), slice.size());
    if (absl::Status s = ingest_->budget_.Check(wire); !s.ok()) return InStream(s);
    // A fresh arena a message (its first block about the parsed message's
    // size): a batch's records stay on it until they are stored.
    google::protobuf::ArenaOptions arena_options;
    arena_options.start_block_size =
        std::clamp<size_t>(2 * wire.size(), kMinArenaBlock, kMaxArenaBlock);
    arena_options.max_block_size = kMaxArenaBlock;
    arena_ = std::make_shared<google::protobuf::Arena>(arena_options);
    request_ = google::protobuf::Arena::CreateMessage<v1::ReportRequest>(arena_.get());
    if (request_->ParseFromArray(wire.data(), static_cast<int>(wire.size()))) {
      return absl::OkStatus();
    }
    return InStream(absl::InvalidArgumentError(
        "cannot parse the ReportRequest: not a trainwatch.v1.ReportRequest, "
        "or a string field that is not valid UTF-8"));
  }

  // Prefixes an error with the stream it ended, once there is one.
  absl::Status InStream(const absl::Status& s) const {
    if (stream_ == nullptr) return s;
    return absl::Status(s.code(),
                        absl::StrCat("run ", stream_->key.run_id, " rank ",
                                     stream_->key.rank, ": ", s.message()));
  }

  absl::Status HandleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const IngestOptions& opts = ingest_->options_;
    switch (request_->msg_case()) {
      case v1::ReportRequest::kStart: {
        return StartLocked();
      }
      case v1::ReportRequest::kBatch: {
        if (stream_ == nullptr) {
          return absl::InvalidArgumentError(
              "the first message of a Report stream must be a RunStart");
        }
        if (absl::Status s = ValidateBatchShape(request_->batch(), opts.limits);
            !s.ok()) {
          return InStream(s);
        }
        RefuseBadRecordsLocked(request_->mutable_batch());
        RefuseForeignRanksLocked(request_->mutable_batch());
        uint64_t seq = request_->batch().seq();
        const size_t n = static_cast<size_t>(request_->batch().records_size());
        if (ClosedLoop* loop = opts.closed_loop; loop != nullptr && n > 0) {
          uint64_t top = 0;
          for (const v1::StepRecord& r : request_->batch().records()) top = std::max(top, r.step());
          loop->OnProgress(stream_->key.run_id, top);
        }
        last_batch_records_ = n;
        ++unprocessed_;
        ingest_->Submitted(n);
        if (host_stream_) {
          SubmitHostBatchLocked(seq);
          return absl::OkStatus();
        }
        ++pending_;
        ingest_->engine_->SubmitBatch(
            stream_, arena_, request_->mutable_batch(),
            [this, seq](absl::Status s) { OnDurable(seq, s); },
            [this, seq, n] { OnProcessed(seq, n); });
        return absl::OkStatus();
      }
      case v1::ReportRequest::kEvent: {
        if (stream_ == nullptr) {
          return absl::InvalidArgumentError(
              "the first message of a Report stream must be a RunStart");
        }
        if (absl::Status s = ValidateRunEvent(request_->event(), opts.limits);
            !s.ok()) {
          return InStream(s);
        }
        uint64_t seq = request_->event().seq();
        if (ClosedLoop* loop = opts.closed_loop; loop != nullptr) {
          loop->OnEvent(stream_->key.run_id, request_->event());
        }
        // A host stream's event is each of its ranks' (a RUN_FINISHED ends
        // them all), acked once every rank's is stored.
        if (ranks_.size() > 1) parts_[seq] = Parts{.durable = ranks_.size(), .processed = 0};
        for (const StreamHandle& rank : ranks_) {
          ++pending_;
          ingest_->engine_->SubmitEvent(
              rank, request_->event(),
              [this, seq](absl::Status s) { OnDurable(seq, s); });
        }
        return absl::OkStatus();
      }
      case v1::ReportRequest::kDirectiveAck: {
        if (stream_ == nullptr) {
          return absl::InvalidArgumentError(
              "the first message of a Report stream must be a RunStart");
        }
        const v1::DirectiveAck& ack = request_->directive_ack();
        if (ack.id().size() > kMaxDirectiveIdBytes || ack.detail().size() > kMaxAckDetailBytes) {
          return InStream(absl::InvalidArgumentError(absl::StrCat(
              "directive_ack: id over ", kMaxDirectiveIdBytes, " bytes or detail over ",
              kMaxAckDetailBytes)));
        }
        uint64_t seq = ack.seq();
        // On a host stream each rank answers for itself, through its sender.
        StreamHandle rank = stream_;
        if (host_stream_) {
          rank = RankStreamLocked(ack.rank());
          if (rank == nullptr) {
            return InStream(absl::InvalidArgumentError(absl::StrCat(
                "directive_ack of rank ", ack.rank(), ", not one of this host stream's "
                "local_ranks")));
          }
        }
        ++pending_;
        ingest_->engine_->SubmitDirectiveAck(
            rank, std::move(*request_->mutable_directive_ack()),
            [this, seq](absl::Status s) { OnDurable(seq, s); });
        return absl::OkStatus();
      }
      case v1::ReportRequest::MSG_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError(
        "empty ReportRequest: set one of start, batch, event or directive_ack");
  }

  // The stream's RunStart: validated, authorised, and opened in the engine
  // (a host stream's ranks each as a stream of its own).
  absl::Status StartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stream_ != nullptr) {
      return InStream(absl::InvalidArgumentError(
          "RunStart repeated on one stream; open a new stream for another "
          "rank or attempt"));
    }
    if (absl::Status s = ValidateRunStart(request_->start(), ingest_->options_.limits);
        !s.ok()) {
      return s;
    }
    moe_ = request_->start().moe();
    if (scope_ != nullptr) {
      absl::Status s =
          Authorizer::CheckWriteRun(*scope_, request_->start().run_id());
      if (!s.ok()) return s;
    }
    std::optional<RunQuota> quota;
    if (scope_ != nullptr && scope_->max_active_runs.has_value()) {
      quota = RunQuota{.token = scope_->line,
                       .max_active_runs = *scope_->max_active_runs};
    }
    last_applied_directive_ = request_->start().last_applied_directive();
    if (request_->start().local_ranks_size() == 0) {
      absl::StatusOr<StreamHandle> stream = OpenLocked(request_->start(), quota);
      if (!stream.ok()) return stream.status();
      stream_ = *std::move(stream);
      ranks_.push_back(stream_);
      return absl::OkStatus();
    }
    host_stream_ = true;
    // A host stream: each of its ranks is a stream of its own to the
    // engine, with the RunStart that rank would have sent.
    const v1::RunStart& start = request_->start();
    for (uint32_t r : start.local_ranks()) {
      v1::RunStart one = start;
      one.clear_local_ranks();
      one.set_rank(r);
      absl::StatusOr<StreamHandle> stream = OpenLocked(one, quota);
      if (!stream.ok()) return stream.status();
      if (r == start.rank()) stream_ = *stream;
      ranks_.push_back(*std::move(stream));
    }
    return absl::OkStatus();
  }

  // Takes the records that fail validation out of `batch`, in place and in
  // order, and counts them for the next response: a bad record is refused
  // alone, and the batch's good records are stored and acked.
  void RefuseBadRecordsLocked(v1::StepBatch* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status first;
    const size_t refused =
        RefuseBadRecords(batch, ingest_->options_.limits, moe_, &first);
    if (refused == 0) return;
    if (rejected_reason_.empty()) rejected_reason_ = std::string(InStream(first).message());
    rejected_records_ += refused;
    ingest_->CountRejectedRecords(refused);
  }

  // Opens the engine's stream for `start` (one rank's); its commit is op 0.
  absl::StatusOr<StreamHandle> OpenLocked(const v1::RunStart& start,
                                          std::optional<RunQuota> quota)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++pending_;
    absl::StatusOr<StreamHandle> stream = ingest_->engine_->OpenStream(
        start, [this](absl::Status s) { OnDurable(0, s); }, quota);
    if (!stream.ok()) {
      --pending_;
      return stream.status();
    }
    if (ClosedLoop* loop = ingest_->options_.closed_loop; loop != nullptr) {
      loop->OnStreamStart(start);
    }
    return stream;
  }

  // The engine stream of local rank `rank` on a host stream; null if it is
  // not one of them.
  StreamHandle RankStreamLocked(uint32_t rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const StreamHandle& s : ranks_) {
      if (s->key.rank == rank) return s;
    }
    return nullptr;
  }

  // Takes out the records of a rank this stream does not carry: on a host
  // stream, one without a rank or of a rank not in its local_ranks; on a
  // rank's own stream, one that names another rank. Refused alone, counted
  // like an invalid record.
  void RefuseForeignRanksLocked(v1::StepBatch* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto* records = batch->mutable_records();
    const int n = records->size();
    int kept = 0;
    std::string first;
    for (int i = 0; i < n; ++i) {
      const v1::StepRecord& r = records->Get(i);
      bool ok;
      if (!host_stream_) {
        ok = !r.has_rank() || r.rank() == stream_->key.rank;
      } else {
        ok = r.has_rank() && RankStreamLocked(r.rank()) != nullptr;
      }
      if (!ok) {
        if (first.empty()) {
          first = host_stream_ && !r.has_rank()
                      ? absl::StrCat("step ", r.step(), ": a host stream's record names its "
                                     "rank (StepRecord.rank)")
                      : absl::StrCat("step ", r.step(), ": rank ", r.rank(),
                                     " is not a rank this stream carries");
        }
        continue;
      }
      if (kept != i) records->SwapElements(kept, i);
      ++kept;
    }
    if (kept == n) return;
    records->DeleteSubrange(kept, n - kept);
    if (rejected_reason_.empty()) {
      rejected_reason_ = std::string(InStream(absl::InvalidArgumentError(first)).message());
    }
    rejected_records_ += n - kept;
    ingest_->CountRejectedRecords(n - kept);
  }

  // A host stream's batch: each rank's records, in their order, go to its
  // engine stream as a batch of the same seq (without StepRecord.rank, as
  // its own stream would have sent them; the dropped count is the
  // sender's); the seq is acked once every part is durable.
  void SubmitHostBatchLocked(uint64_t seq) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::StepBatch& batch = *request_->mutable_batch();
    // On the request's arena, so that records move into them by pointer.
    std::vector<v1::StepBatch*> parts(ranks_.size());
    for (v1::StepBatch*& part : parts) {
      part = google::protobuf::Arena::CreateMessage<v1::StepBatch>(arena_.get());
    }
    for (v1::StepRecord& r : *batch.mutable_records()) {
      size_t i = 0;
      while (ranks_[i]->key.rank != r.rank()) ++i;  // RefuseForeignRanks kept it
      r.clear_rank();
      parts[i]->mutable_records()->Add(std::move(r));
    }
    size_t sender = 0;
    while (ranks_[sender] != stream_) ++sender;
    parts[sender]->set_dropped(batch.dropped());
    std::vector<size_t> sent;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i]->records_size() > 0 || i == sender) sent.push_back(i);
    }
    parts_[seq] = Parts{.durable = sent.size(), .processed = sent.size()};
    for (size_t i : sent) {
      parts[i]->set_seq(seq);
      const size_t records = static_cast<size_t>(parts[i]->records_size());
      ++pending_;
      ingest_->engine_->SubmitBatch(
          ranks_[i], arena_, parts[i],
          [this, seq](absl::Status s) { OnDurable(seq, s); },
          [this, seq, records] { OnProcessed(seq, records); });
    }
  }

  // From the engine's shard: a batch (or a host batch's part) of `records`
  // went through the detectors (always before its OnDurable).
  void OnProcessed(uint64_t seq, size_t records) {
    ingest_->Processed(records);
    mu_.Lock();
    if (auto it = parts_.find(seq); it != parts_.end() && it->second.processed > 0) {
      if (--it->second.processed > 0) {
        ProgressAndUnlock();
        return;
      }
      if (it->second.durable == 0) parts_.erase(it);
    }
    --unprocessed_;
    ProgressAndUnlock();
  }

  // From the engine (any thread): the op with `seq` (or one of its parts)
  // is durable, or failed.
  void OnDurable(uint64_t seq, absl::Status status) {
    mu_.Lock();
    --pending_;
    if (auto it = parts_.find(seq); status.ok() && it != parts_.end()) {
      if (--it->second.durable > 0) {
        ProgressAndUnlock();
        return;
      }
      if (it->second.processed == 0) parts_.erase(it);
    }
    if (status.ok()) {
      if (seq > acked_seq_) acked_seq_ = seq;
    } else {
      // Not stored: end the stream; the client resends what is unacked.
      EndLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             absl::StrCat("store: ", status.message())));
    }
    ProgressAndUnlock();
  }

  // Whether the shared bound on unprocessed records lets this stream read
  // (small-batch streams are not held back); if not, Ingest kicks it later.
  bool AdmittedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (last_batch_records_ <= ingest_->options_.small_batch_records) return true;
    if (waiting_budget_) return false;  // queued once; Kick() clears it
    if (ingest_->Admit(this)) return true;
    waiting_budget_ = true;
    return false;
  }

  void EndLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!end_status_.has_value()) end_status_ = std::move(status);
  }

  // Decides the next operation under the lock and starts it after unlocking:
  // a read (while taking messages and under the in-flight bound), a write of
  // the newest ack, or Finish once nothing is pending.
  void ProgressAndUnlock() ABSL_UNLOCK_FUNCTION(mu_) {
    enum { kNone, kRead, kWrite, kFinish } next_io = kNone, next_read = kNone;
    if (finished_) {
      mu_.Unlock();
      return;
    }
    if (!end_status_.has_value() && !read_in_flight_ &&
        pending_ < ingest_->options_.max_inflight_batches * std::max<size_t>(1, ranks_.size()) &&
        unprocessed_ < ingest_->options_.max_unprocessed_batches &&
        AdmittedLocked()) {
      read_in_flight_ = true;
      next_read = kRead;
    }
    if (!write_in_flight_ && acked_seq_ > written_seq_) {
      written_seq_ = acked_seq_;
      response_.set_acked_seq(acked_seq_);
      // The records refused since the last response, and the first reason.
      response_.set_rejected_records(rejected_records_);
      response_.set_rejected_reason(rejected_reason_);
      rejected_records_ = 0;
      rejected_reason_.clear();
      // Approved directives ride on every ack until this rank applied them.
      response_.clear_directives();
      if (ClosedLoop* loop = ingest_->options_.closed_loop; loop != nullptr && stream_ != nullptr) {
        // A host stream's: what any of its ranks has not applied, once.
        absl::flat_hash_set<std::string> ids;
        for (const StreamHandle& rank : ranks_) {
          for (v1::Directive& d : loop->ToDeliver(rank->key.run_id, rank->key.rank,
                                                  last_applied_directive_)) {
            if (ids.insert(d.id()).second) response_.add_directives()->Swap(&d);
          }
        }
      }
      bool own_buffer = false;
      // The last write's buffer: a response over a slice's inline size (one
      // with a rejected_reason) is serialized by a writer that wants it empty.
      response_bytes_.Clear();
      grpc::SerializationTraits<v1::ReportResponse>::Serialize(
          response_, &response_bytes_, &own_buffer);
      write_in_flight_ = true;
      next_io = kWrite;
    } else if (!write_in_flight_ && end_status_.has_value() && pending_ == 0) {
      finished_ = true;
      next_io = kFinish;
    }
    grpc::Status finish_status = next_io == kFinish ? *end_status_ : grpc::Status();
    // Nothing of the stream is pending: it is over for its run (DeleteRun
    // may go ahead as soon as the client sees the status).
    if (next_io == kFinish) {
      for (const StreamHandle& rank : ranks_) rank->Close();
    }
    mu_.Unlock();
    if (next_read == kRead) StartRead(&request_bytes_);
    if (next_io == kWrite) StartWrite(&response_bytes_);
    if (next_io == kFinish) Finish(finish_status);
  }

  Ingest* const ingest_;
  const TokenScope* const scope_;
  absl::Mutex mu_;
  grpc::ByteBuffer request_bytes_;   // owned by the read in flight
  // The message being handled, parsed onto its own arena, which a batch's
  // records take with them to the store.
  static constexpr size_t kMinArenaBlock = 1024, kMaxArenaBlock = size_t{4} << 20;
  std::shared_ptr<google::protobuf::Arena> arena_;
  v1::ReportRequest* request_ = nullptr;
  v1::ReportResponse response_;
  grpc::ByteBuffer response_bytes_;  // owned by the write in flight
  StreamHandle stream_;          // set by the first message: the sender's rank
  // The engine streams this one feeds, set by the first message: a host
  // stream's ranks (RunStart.local_ranks, the sender's among them), or
  // stream_ alone.
  std::vector<StreamHandle> ranks_;
  bool host_stream_ = false;  // RunStart.local_ranks was given
  // The parts of a host stream's batch or event not yet processed and
  // durable, by seq: its ack waits for the last.
  struct Parts {
    size_t durable = 0;
    size_t processed = 0;
  };
  absl::flat_hash_map<uint64_t, Parts> parts_ ABSL_GUARDED_BY(mu_);
  v1::MoeConfig moe_;            // the RunStart's, for the records' moe stats
  uint64_t last_applied_directive_ = 0;  // the RunStart's
  // A DirectiveAck's strings (a directive id is a run id, '#' and a seq).
  static constexpr size_t kMaxDirectiveIdBytes = 160;
  static constexpr size_t kMaxAckDetailBytes = 1024;
  uint64_t rejected_records_ ABSL_GUARDED_BY(mu_) = 0;  // since the last response
  std::string rejected_reason_ ABSL_GUARDED_BY(mu_);    // the first of them
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  size_t unprocessed_ ABSL_GUARDED_BY(mu_) = 0;  // batches before the detectors
  size_t last_batch_records_ ABSL_GUARDED_BY(mu_) = 0;
  bool waiting_budget_ ABSL_GUARDED_BY(mu_) = false;  // queued in Ingest::Admit
  uint64_t acked_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t written_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool read_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int pins_ ABSL_GUARDED_BY(mu_) = 0;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_status_ ABSL_GUARDED_BY(mu_);
};

namespace {

prometheus::Counter& RejectedSeries(Metrics* metrics, const char* reason) {
  return metrics->ingest_rejected.Add({{"reason", reason}});
}

}  // namespace

Ingest::Ingest(IngestOptions options, Engine* engine, Metrics* metrics)
    : options_(options),
      engine_(engine),
      metrics_(metrics),
      rejected_{
          .invalid_argument = RejectedSeries(metrics, "invalid_argument"),
          .resource_exhausted = RejectedSeries(metrics, "resource_exhausted"),
          .unauthenticated = RejectedSeries(metrics, "unauthenticated"),
          .permission_denied = RejectedSeries(metrics, "permission_denied"),
          .invalid_record = RejectedSeries(metrics, "invalid_record"),
      } {}

Ingest::~Ingest() { Drain(std::chrono::seconds(5)); }

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
Ingest::NewReport(grpc::CallbackServerContext* context) {
  bool draining;
  {
    absl::MutexLock lock(&mu_);
    draining = draining_;
  }
  if (draining) {
    return new ReportReactor(
        this,
        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                     "the server is shutting down; retry later"),
        nullptr);
  }
  const TokenScope* scope = nullptr;
  if (options_.authorizer != nullptr) {
    absl::StatusOr<const TokenScope*> s =
        options_.authorizer->AuthorizeReport(AuthorizationOf(*context));
    if (!s.ok()) {
      CountRejected(s.status());
      return new ReportReactor(this, ToGrpcStatus(s.status()), nullptr);
    }
    scope = *s;
  }
  return new ReportReactor(this, std::nullopt, scope);
}

void Ingest::Register(ReportReactor* r) {
  absl::MutexLock lock(&mu_);
  reactors_.insert(r);
}

void Ingest::Unregister(ReportReactor* r) {
  absl::MutexLock lock(&mu_);
  reactors_.erase(r);
  cv_.SignalAll();
}

bool Ingest::Admit(ReportReactor* r) {
  absl::MutexLock lock(&budget_mu_);
  if (unprocessed_records_ < options_.max_unprocessed_records) return true;
  budget_waiters_.push_back(r);
  return false;
}

void Ingest::Submitted(size_t records) {
  absl::MutexLock lock(&budget_mu_);
  unprocessed_records_ += records;
}

void Ingest::Processed(size_t records) {
  std::vector<ReportReactor*> woken;
  {
    absl::MutexLock lock(&budget_mu_);
    unprocessed_records_ -= records;
    if (unprocessed_records_ >= options_.max_unprocessed_records) return;
    woken.swap(budget_waiters_);
  }
  if (woken.empty()) return;
  // A waiter may have ended since it queued: wake only those still
  // registered, pinned (as Drain does) so that none is deleted meanwhile. A
  // new reactor at a freed one's address just re-evaluates, harmlessly.
  {
    absl::MutexLock lock(&mu_);
    size_t kept = 0;
    for (ReportReactor* r : woken) {
      if (!reactors_.contains(r)) continue;
      r->Pin();
      woken[kept++] = r;
    }
    woken.resize(kept);
  }
  for (ReportReactor* r : woken) {
    r->Kick();
    r->Unpin();
  }
}

void Ingest::CountRejected(const absl::Status& status) {
  prometheus::Counter& series =
      absl::IsResourceExhausted(status)  ? rejected_.resource_exhausted
      : absl::IsUnauthenticated(status)  ? rejected_.unauthenticated
      : absl::IsPermissionDenied(status) ? rejected_.permission_denied
                                         : rejected_.invalid_argument;
  series.Increment();
}

void Ingest::CountRejectedRecords(uint64_t records) {
  rejected_.invalid_record.Increment(static_cast<double>(records));
}

bool Ingest::Drain(std::chrono::milliseconds timeout) {
  std::vector<ReportReactor*> open;
  {
    absl::MutexLock lock(&mu_);
    if (!draining_) {
      draining_ = true;
      for (ReportReactor* r : reactors_) {
        r->Pin();
        open.push_back(r);
      }
    }
  }
  for (ReportReactor* r : open) {
    r->BeginDrain();
    r->Unpin();
  }
  const Clock& clock = *options_.clock;
  absl::MutexLock lock(&mu_);
  const int64_t deadline =
      clock.MonotonicNanos() +
      std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  while (!reactors_.empty()) {
    if (clock.WaitUntil(cv_, mu_, deadline)) break;  // timed out
  }
  return reactors_.empty();
}

}  // namespace trainwatch
