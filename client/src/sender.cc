#include "sender.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "proto_convert.h"
#include "trainwatch/channel.h"
#include "trainwatch/run_start.h"

namespace trainwatch::internal {
namespace {

// Keepalive pings notice a server that vanished without closing the
// connection (host down, network partition), which would otherwise leave the
// stream hanging with everything unacknowledged.
constexpr int kKeepaliveTimeMs = 10000;
constexpr int kKeepaliveTimeoutMs = 5000;
// At most one line this often about the number of dropped steps.
constexpr absl::Duration kDropLogInterval = absl::Seconds(10);
// Records refused alone, and a quota's refusals, are logged at most this often.
constexpr absl::Duration kRejectionLogInterval = absl::Minutes(1);
constexpr absl::Duration kQuotaLogInterval = absl::Minutes(1);

// Channel arguments are ints.
int Millis(absl::Duration duration) {
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(duration), std::numeric_limits<int>::max()));
}

std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials,
    absl::Duration initial_backoff, absl::Duration max_backoff) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Keep pinging while the trainer is idle (no data written): a stalled
  // training loop is exactly when a dead server would go unnoticed.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // gRPC's own reconnect backoff defaults to 1 s growing to 120 s; after a
  // long outage that would delay the reconnect far past our max_backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Millis(initial_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, Millis(max_backoff));
  // After a connection is lost (server killed, not drained), gRPC 1.51's
  // pick_first waits for the resolver to re-resolve, and the DNS resolver's
  // cooldown between resolutions (30 s by default) kept the client away for
  // about 10 s after a killed server was back up.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS,
              Millis(initial_backoff));
  return grpc::CreateCustomChannel(address, credentials, args);
}

absl::Status ToAbsl(const grpc::Status& status) {
  // The codes share their numbering.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

absl::Duration AtLeast(std::chrono::milliseconds value, absl::Duration floor) {
  return std::max(absl::FromChrono(value), floor);
}

}  // namespace

Sender::Sender(const ClientOptions& options, Intake* intake,
               std::shared_ptr<grpc::ChannelCredentials> credentials,
               DirectiveInbox* inbox)
    : options_(options),
      intake_(intake),
      inbox_(inbox),
      // Floors keep a zero option from turning a wait into a busy loop.
      flush_interval_(AtLeast(options.flush_interval, absl::Milliseconds(1))),
      initial_backoff_(AtLeast(options.initial_backoff, absl::Milliseconds(1))),
      max_backoff_(AtLeast(options.max_backoff, initial_backoff_)),
      channel_(MakeChannel(options.address, std::move(credentials),
                           initial_backoff_, max_backoff_)),
      stub_(v1::TrainingHealth::NewStub(channel_)),
      backoff_(initial_backoff_) {
  *run_start_.mutable_start() = MakeRunStart(options);
}

Sender::~Sender() { Stop(absl::ZeroDuration()); }

void Sender::Start() { thread_ = std::thread([this] { Run(); }); }

void Sender::Stop(absl::Duration grace) {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (!mu_.AwaitWithTimeout(absl::Condition(&done_), grace) &&
        context_ != nullptr) {
      context_->TryCancel();
    }
  }
  thread_.join();
}

bool Sender::WaitResolved(uint64_t items, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  wake_ = true;  // send what is queued now, not at the next flush interval
  auto settled = [this, items]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return resolved_items_ >= items || done_ || !refusal_.ok();
  };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  return resolved_items_ >= items;
}

uint64_t Sender::resolved() const {
  absl::MutexLock lock(&mu_);
  return resolved_items_;
}

std::optional<double> Sender::recommended_max_norm() const {
  absl::MutexLock lock(&mu_);
  return recommended_max_norm_;
}

absl::Status Sender::last_rejection() const {
  absl::MutexLock lock(&mu_);
  return last_rejection_;
}

void Sender::OnRejectedLocked(const v1::ReportResponse& response) {
  rejected_.fetch_add(response.rejected_records(), std::memory_order_relaxed);
  last_rejection_ = absl::InvalidArgumentError(response.rejected_reason());
  rejected_unlogged_ += response.rejected_records();
  const absl::Time now = absl::Now();
  if (now - last_rejection_log_ < kRejectionLogInterval) return;
  last_rejection_log_ = now;
  std::fprintf(stderr,
               "trainwatch: the server refused %llu record(s) alone and stored "
               "the rest of their batches (Stats().rejected); the first: %s\n",
               static_cast<unsigned long long>(rejected_unlogged_),
               response.rejected_reason().c_str());
  rejected_unlogged_ = 0;
}

absl::Status Sender::refusal() const {
  absl::MutexLock lock(&mu_);
  return refusal_;
}

void Sender::Run() {
  for (bool first = true;; first = false) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
    }
    if (!first) reconnects_.fetch_add(1, std::memory_order_relaxed);
    uint64_t written_through = 0;
    const grpc::Status status = RunStream(&written_through);
    const absl::Duration delay = OnStreamEnd(status, written_through);
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), delay);
  }
  absl::MutexLock lock(&mu_);
  done_ = true;
}

grpc::Status Sender::RunStream(uint64_t* written_through) {
  grpc::ClientContext context;
  AddAuthToken(options_.security, &context);
  AddRunHeader(options_.run_id, &context);
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return grpc::Status(grpc::StatusCode::CANCELLED, "stopping");
    context_ = &context;
    stream_ended_ = false;
    acked_on_stream_ = false;
  }
  std::unique_ptr<Stream> stream = stub_->Report(&context);
  std::thread reader([this, &stream] { ReadResponses(stream.get()); });

  bool ok = stream->Write(run_start_);
  bool stopping = false;
  while (ok) {
    std::optional<Pending> next;
    bool room = false;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) {
        stopping = true;
        break;
      }
      if (stream_ended_) break;
      // On a new stream this starts at the oldest unacked entry: the resend.
      auto it = std::upper_bound(
          unacked_.begin(), unacked_.end(), *written_through,
          [](uint64_t seq, const Pending& p) { return seq < p.seq; });
      if (it != unacked_.end()) next = *it;
      // Stop taking from the intake while capacity is in flight; Record()
      // then drops instead of the client growing without bound.
      room = unacked_items_ < intake_->capacity();
    }
    if (next) {
      ok = stream->Write(*next->request);
      if (ok) {
        *written_through = next->seq;
        sent_.fetch_add(next->records, std::memory_order_relaxed);
      }
      continue;
    }
    if (room && FormNext()) continue;
    // Nothing to write. Record() does not signal (that would cost it a
    // syscall), so poll the intake every flush interval.
    absl::MutexLock lock(&mu_);
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || wake_ || stream_ended_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&wake), flush_interval_);
    wake_ = false;
  }
  // The server answers WritesDone by finishing the stream; if it does not,
  // Stop() cancels the context after its grace period.
  if (ok && stopping) stream->WritesDone();
  reader.join();
  grpc::Status status = stream->Finish();
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
  return status;
}

void Sender::ReadResponses(Stream* stream) {
  v1::ReportResponse response;
  while (stream->Read(&response)) {
    absl::MutexLock lock(&mu_);
    uint64_t records = 0;
    uint64_t items = 0;
    while (!unacked_.empty() &&
           unacked_.front().seq <= response.acked_seq()) {
      records += unacked_.front().records;
      items += unacked_.front().items;
      unacked_.pop_front();
    }
    // Counters move inside the lock so a Flush() that returns sees them.
    const uint64_t rejected = std::min(response.rejected_records(), records);
    acked_.fetch_add(records - rejected, std::memory_order_relaxed);
    if (response.rejected_records() > 0) OnRejectedLocked(response);
    intake_->Release(items);
    unacked_items_ -= items;
    resolved_items_ += items;
    if (items > 0) {
      acked_on_stream_ = true;
      refusal_ = absl::OkStatus();
      last_log_key_.clear();  // progress: log the next problem again
    }
    if (response.has_recommended_max_norm()) {
      recommended_max_norm_ = response.recommended_max_norm();
    }
    if (inbox_ != nullptr && !response.directives().empty()) {
      for (std::string& id : inbox_->OnResponse(response.directives())) {
        v1::DirectiveAck ack;
        ack.set_id(std::move(id));
        ack.set_rank(options_.rank);
        ack.set_state(v1::RECEIVED);
        intake_->OfferDirectiveAck(std::move(ack));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  stream_ended_ = true;
}

bool Sender::FormNext() {
  std::optional<QueueItem> item =
      carried_ ? std::exchange(carried_, std::nullopt) : intake_->Take();
  if (!item) return false;

  auto request = std::make_shared<v1::ReportRequest>();
  Pending pending;
  pending.seq = next_seq_++;
  if (const auto* event = std::get_if<EventItem>(&*item)) {
    v1::RunEvent* proto = request->mutable_event();
    FillRunEvent(*event, proto);
    proto->set_seq(pending.seq);
    pending.items = 1;
  } else if (auto* ack = std::get_if<v1::DirectiveAck>(&*item)) {
    v1::DirectiveAck* proto = request->mutable_directive_ack();
    proto->Swap(ack);
    proto->set_seq(pending.seq);
    pending.items = 1;
  } else {
    v1::StepBatch* batch = request->mutable_batch();
    batch->set_seq(pending.seq);
    AddStepRecord(std::move(*item), options_.max_norm, batch);
    // Take what is queued now but do not wait for a full batch: latency
    // matters more than batch size, and a busy trainer fills batches anyway.
    while (static_cast<size_t>(batch->records_size()) <
           options_.max_batch_records) {
      item = intake_->Take();
      if (!item) break;
      if (std::holds_alternative<EventItem>(*item) ||
          std::holds_alternative<v1::DirectiveAck>(*item)) {
        carried_ = std::move(item);  // it gets the next seq
        break;
      }
      AddStepRecord(std::move(*item), options_.max_norm, batch);
    }
    pending.records = pending.items = batch->records_size();
    pending.drops_reported = intake_->TakeUnreportedDrops();
    batch->set_dropped(pending.drops_reported);
    if (pending.drops_reported > 0) LogDrops();
  }
  pending.request = std::move(request);
  absl::MutexLock lock(&mu_);
  unacked_items_ += pending.items;
  unacked_.push_back(std::move(pending));
  return true;
}

absl::Duration Sender::OnStreamEnd(const grpc::Status& status,
                                   uint64_t written_through) {
  absl::MutexLock lock(&mu_);
  if (stop_) return absl::ZeroDuration();
  if (acked_on_stream_) backoff_ = initial_backoff_;
  absl::Duration delay = backoff_;
  backoff_ = std::min(backoff_ * 2, max_backoff_);

  const std::string what = absl::StrCat(
      absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
      ": ", status.error_message());
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
      // The server stops at the first record it cannot accept and acks what
      // came before, so the culprit is the oldest unacked entry, provided
      // this stream got as far as writing it. Resending it would only be
      // refused again.
      if (!unacked_.empty() && unacked_.front().seq <= written_through) {
        Pending refused = std::move(unacked_.front());
        unacked_.pop_front();
        unacked_items_ -= refused.items;
        resolved_items_ += refused.items;
        intake_->Release(refused.items);
        intake_->CountRefused(refused.records);
        intake_->RestoreUnreportedDrops(refused.drops_reported);
        LogOnce(what, absl::StrCat("server refused the data (", what,
                                   "); dropped seq ", refused.seq, " (",
                                   refused.records, " steps)"));
      } else {
        // Refused before any data: the RunStart itself, which will not
        // change, so retry slowly.
        LogOnce(what, absl::StrCat("server refused the stream (", what,
                                   "); retrying"));
        refusal_ = ToAbsl(status);
        delay = max_backoff_;
      }
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // A quota (the token's runs:N, the server's --max-active-runs): runs
      // finish and free it, so a trainer keeps its data and retries; a
      // one-shot command gives up at once with the server's reason.
      if (options_.fail_fast) {
        refusal_ = ToAbsl(status);
        break;
      }
      if (absl::Now() - last_quota_log_ >= kQuotaLogInterval) {
        last_quota_log_ = absl::Now();
        std::fprintf(stderr,
                     "trainwatch: server refused the stream (%s); keeping data "
                     "buffered, retrying with backoff\n",
                     what.c_str());
      }
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      LogOnce(what, absl::StrCat("server refused the stream (", what,
                                 "); keeping data buffered, retrying every ",
                                 absl::FormatDuration(max_backoff_)));
      refusal_ = ToAbsl(status);
      delay = max_backoff_;
      break;
    default:
      // One line per outage, not per attempt.
      LogOnce("outage", absl::StrCat("stream to ", options_.address,
                                     " ended (", what,
                                     "); reconnecting, data stays buffered"));
      break;
  }
  return delay;
}

void Sender::LogDrops() {
  // The intake logs the start of a burst of drops; this says how many were
  // lost, when they are reported (for an outage: once the server is back),
  // at most once per kDropLogInterval.
  const absl::Time now = absl::Now();
  if (now - last_drop_log_ < kDropLogInterval) return;
  last_drop_log_ = now;
  std::fprintf(stderr,
               "trainwatch: %llu steps dropped so far (buffer capacity %zu "
               "records); the count goes to the server, which exports it as "
               "trainwatch_client_dropped_steps_total\n",
               static_cast<unsigned long long>(intake_->dropped()),
               intake_->capacity());
}

void Sender::LogOnce(const std::string& key, const std::string& line) {
  if (key == last_log_key_) return;
  last_log_key_ = key;
  std::fprintf(stderr, "trainwatch: %s\n", line.c_str());
}

}  // namespace trainwatch::internal
