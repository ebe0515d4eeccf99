#include "trainwatch/client.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <utility>

#include <unistd.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "intake.h"
#include "trainwatch/channel.h"
#include "trainwatch/v1/trainwatch.pb.h"
#include "sender.h"

namespace trainwatch {
namespace {

constexpr size_t kMaxRunIdLength = 128;
// The queue is preallocated at about 240 bytes a record of capacity: past
// this it alone would take gigabytes.
constexpr size_t kMaxCapacity = size_t{1} << 24;
// How long Close() lets the server finish the stream after WritesDone.
constexpr absl::Duration kStopGrace = absl::Milliseconds(500);
constexpr std::chrono::milliseconds kDestructorFlush = std::chrono::seconds(2);

// ASCII only, whatever the process locale (the server's rule, docs/contracts.md).
bool IsRunIdChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
         c == '_' || c == ':' || c == '/' || c == '-';
}

// Mirrors the server's RunStart validation so a misconfigured trainer fails
// at start-up rather than in the background with every batch refused.
absl::Status ValidateOptions(const ClientOptions& options) {
  const std::string& id = options.run_id;
  if (id.empty()) return absl::InvalidArgumentError("run_id is empty");
  if (id.size() > kMaxRunIdLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "run_id is ", id.size(), " characters long; the limit is ",
        kMaxRunIdLength));
  }
  const auto bad = std::find_if_not(id.begin(), id.end(), IsRunIdChar);
  if (bad != id.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "run_id \"", id, "\" has an invalid character at position ",
        bad - id.begin(), "; allowed are A-Z a-z 0-9 . _ : / -"));
  }
  if (options.world_size < 1) {
    return absl::InvalidArgumentError("world_size must be at least 1");
  }
  if (options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not below world_size ",
                     options.world_size));
  }
  for (size_t i = 0; i < options.local_ranks.size(); ++i) {
    const uint32_t r = options.local_ranks[i];
    if (r >= options.world_size ||
        std::find(options.local_ranks.begin(), options.local_ranks.begin() + i, r) !=
            options.local_ranks.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat(
          "local_ranks[", i, "] = ", r, ": each a rank below world_size ", options.world_size,
          ", once"));
    }
  }
  if (!options.local_ranks.empty() &&
      std::find(options.local_ranks.begin(), options.local_ranks.end(), options.rank) ==
          options.local_ranks.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local_ranks does not list rank ", options.rank,
        ": a host stream is sent by one of its ranks"));
  }
  if (!std::isfinite(options.max_norm) || options.max_norm < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_norm must be finite and >= 0 (0: no clipping), got ",
        options.max_norm));
  }
  if (options.capacity < 1 || options.capacity > kMaxCapacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity must be between 1 and ", kMaxCapacity, ", got ",
        options.capacity));
  }
  if (options.max_batch_records < 1) {
    return absl::InvalidArgumentError("max_batch_records must be at least 1");
  }
  if (options.address.empty()) {
    return absl::InvalidArgumentError("address is empty");
  }
  return absl::OkStatus();
}

int64_t NowUnixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// This machine's name as gethostname() gives it; "" if it cannot.
std::string LocalHostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace

std::optional<Precision> ParsePrecision(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (lower == "fp32" || lower == "float32") return Precision::kFp32;
  if (lower == "bf16" || lower == "bfloat16") return Precision::kBf16;
  if (lower == "fp16" || lower == "float16") return Precision::kFp16;
  return std::nullopt;
}

// Owns the intake (the lock-free side Record() touches) and the sender.
// Thread-safety: as Client's; Close() serializes on close_mu_.
class Client::Impl {
 public:
  Impl(const ClientOptions& options,
       std::shared_ptr<grpc::ChannelCredentials> credentials)
      : measure_step_time_(options.measure_locally && options.local_ranks.empty()),
        rank_(options.rank),
        local_ranks_(options.local_ranks),
        intake_(options.capacity),
        sender_(options, &intake_, std::move(credentials), &inbox_) {}

  void Start() { sender_.Start(); }

  bool Record(Step&& step) {
    if (step.step > kMaxStep) {
      return Reject("refused a step above 2^63 - 1 (a step of -1?)");
    }
    if (!CarriesRank(step.rank)) {
      return Reject("refused a step whose rank is not one of local_ranks (a host stream's "
                    "steps name their rank)");
    }
    const StepTime time = TimeStep(step.time_unix_nanos);
    step.time_unix_nanos = time.unix_nanos;
    if (!step.step_time_s.has_value()) step.step_time_s = time.since_previous_s;
    return intake_.OfferStep(std::move(step));
  }

  bool RecordProto(v1::StepRecord&& record) {
    if (record.step() > kMaxStep) {
      return Reject("refused a step above 2^63 - 1 (a step of -1?)");
    }
    if (!CarriesRank(record.has_rank() ? std::optional<uint32_t>(record.rank())
                                       : std::nullopt)) {
      return Reject("refused a step whose rank is not one of local_ranks (a host stream's "
                    "steps name their rank)");
    }
    const StepTime time = TimeStep(record.time_unix_nanos());
    record.set_time_unix_nanos(time.unix_nanos);
    if (!record.has_step_time_s() && time.since_previous_s.has_value()) {
      record.set_step_time_s(*time.since_previous_s);
    }
    return intake_.OfferRecord(
        std::make_unique<v1::StepRecord>(std::move(record)));
  }

  std::vector<Directive> DueDirectives(uint64_t step) {
    last_due_step_.store(step, std::memory_order_relaxed);
    return inbox_.Due(step);
  }

  bool AckDirective(const std::string& id, DirectiveState state, std::string detail) {
    if (!inbox_.Answer(id, state)) return false;
    v1::DirectiveAck ack;
    ack.set_id(id);
    ack.set_rank(rank_);
    ack.set_state(static_cast<v1::DirectiveState>(state));
    ack.set_step(last_due_step_.load(std::memory_order_relaxed));
    ack.set_detail(std::move(detail));
    return intake_.OfferDirectiveAck(std::move(ack));
  }

  bool RecordEvent(EventKind kind, uint64_t step, std::string detail) {
    return intake_.OfferEvent(internal::EventItem{
        kind, step, std::move(detail), NowUnixNanos()});
  }

  absl::Status Flush(std::chrono::milliseconds timeout) {
    // Items are counted, not steps: an event recorded before the call must be
    // acked too, and a step Record() dropped was never admitted.
    const uint64_t target = intake_.admitted();
    if (sender_.WaitResolved(target, absl::Now() + absl::FromChrono(timeout))) {
      return absl::OkStatus();
    }
    const ClientStats stats = Stats();
    if (absl::Status refusal = sender_.refusal(); !refusal.ok()) {
      return absl::Status(
          refusal.code(),
          absl::StrCat("the server refuses the stream: ",
                       absl::StatusCodeToString(refusal.code()), ": ",
                       refusal.message(), " (", target - sender_.resolved(),
                       " recorded items not acknowledged; dropped steps ",
                       stats.dropped, ")"));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "flush timed out after ", timeout.count(), " ms: ",
        sender_.resolved(), " of ", target,
        " recorded items acknowledged or dropped (steps recorded ",
        stats.recorded, ", sent ", stats.sent, ", acked ", stats.acked,
        ", dropped ", stats.dropped, ", reconnects ", stats.reconnects, ")"));
  }

  absl::Status Close(std::chrono::milliseconds timeout) {
    absl::MutexLock lock(&close_mu_);
    if (closed_) return close_status_;
    close_status_ = Flush(timeout);
    intake_.Close();
    sender_.Stop(kStopGrace);
    closed_ = true;
    return close_status_;
  }

  bool closed() {
    absl::MutexLock lock(&close_mu_);
    return closed_;
  }

  ClientStats Stats() const {
    ClientStats stats;
    stats.recorded = intake_.recorded();
    stats.sent = sender_.sent();
    stats.acked = sender_.acked();
    stats.dropped = intake_.dropped();
    stats.rejected = rejected_.load(std::memory_order_relaxed) + sender_.rejected();
    stats.reconnects = sender_.reconnects();
    return stats;
  }

  std::optional<double> RecommendedMaxNorm() const {
    return sender_.recommended_max_norm();
  }

  absl::Status Refusal() const { return sender_.refusal(); }
  absl::Status LastRejection() const { return sender_.last_rejection(); }

 private:
  // A step the server would refuse: refused here, counted; the first said.
  bool Reject(const char* why) {
    if (rejected_.fetch_add(1, std::memory_order_relaxed) == 0) {
      std::fprintf(stderr, "trainwatch: %s; counted in Stats().rejected, not sent\n", why);
    }
    return false;
  }

  // Whether a step of `rank` belongs on this stream: on a host stream, one
  // of its local ranks; on a rank's own, none named or its own.
  bool CarriesRank(std::optional<uint32_t> rank) const {
    if (local_ranks_.empty()) return !rank.has_value() || *rank == rank_;
    return rank.has_value() &&
           std::find(local_ranks_.begin(), local_ranks_.end(), *rank) != local_ranks_.end();
  }

  // A step's time, and the seconds since the step recorded before it when
  // this client measures step times (ClientOptions::measure_locally).
  struct StepTime {
    int64_t unix_nanos = 0;
    std::optional<double> since_previous_s;
  };

  // `unix_nanos` is the step's own time, 0 for now.
  StepTime TimeStep(int64_t unix_nanos) {
    StepTime time{.unix_nanos = unix_nanos == 0 ? NowUnixNanos() : unix_nanos};
    if (!measure_step_time_) return time;
    // One exchange: Record() may be called from several threads, and each
    // step's time is then measured from the step recorded just before it.
    const int64_t previous = previous_step_nanos_.exchange(
        time.unix_nanos, std::memory_order_relaxed);
    if (previous != 0 && time.unix_nanos > previous) {
      time.since_previous_s =
          static_cast<double>(time.unix_nanos - previous) * 1e-9;
    }
    return time;
  }

  const bool measure_step_time_;
  const uint32_t rank_;
  const std::vector<uint32_t> local_ranks_;  // a host stream's; empty: rank_'s own
  // The step of the latest DueDirectives(), which an ack reports.
  std::atomic<uint64_t> last_due_step_{0};
  // Declared before the sender, which borrows it.
  internal::DirectiveInbox inbox_;
  // time_unix_nanos of the step recorded last; 0 before the first.
  std::atomic<int64_t> previous_step_nanos_{0};
  std::atomic<uint64_t> rejected_{0};  // by Record(), above kMaxStep
  internal::Intake intake_;
  internal::Sender sender_;
  absl::Mutex close_mu_;
  bool closed_ ABSL_GUARDED_BY(close_mu_) = false;
  absl::Status close_status_ ABSL_GUARDED_BY(close_mu_);
};

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  if (absl::Status status = ValidateOptions(options); !status.ok()) {
    return status;
  }
  if (options.host.empty() && options.measure_locally) {
    options.host = LocalHostName();
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      NewChannelCredentials(options.security);
  if (!credentials.ok()) return credentials.status();
  auto impl = std::make_unique<Impl>(options, *std::move(credentials));
  impl->Start();
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  if (impl_->closed()) return;  // the caller has seen Close()'s status
  // Nobody else will see this status: say what was lost.
  if (absl::Status status = impl_->Close(kDestructorFlush); !status.ok()) {
    std::fprintf(stderr, "trainwatch: closing: %s\n",
                 std::string(status.message()).c_str());
  }
}

bool Client::Record(Step step) { return impl_->Record(std::move(step)); }

bool Client::RecordRanks(std::vector<Step> steps) {
  bool all = true;
  for (Step& s : steps) all &= impl_->Record(std::move(s));
  return all;
}

bool Client::RecordProto(v1::StepRecord record) {
  return impl_->RecordProto(std::move(record));
}

bool Client::RecordEvent(EventKind kind, uint64_t step, std::string detail) {
  return impl_->RecordEvent(kind, step, std::move(detail));
}

absl::Status Client::Flush(std::chrono::milliseconds timeout) {
  return impl_->Flush(timeout);
}

absl::Status Client::Close(std::chrono::milliseconds timeout) {
  return impl_->Close(timeout);
}

ClientStats Client::Stats() const { return impl_->Stats(); }

absl::Status Client::LastRejection() const { return impl_->LastRejection(); }

std::optional<double> Client::RecommendedMaxNorm() const {
  return impl_->RecommendedMaxNorm();
}

absl::Status Client::Refusal() const { return impl_->Refusal(); }

std::vector<Directive> Client::DueDirectives(uint64_t step) {
  return impl_->DueDirectives(step);
}

bool Client::AckDirective(const std::string& id, DirectiveState state, std::string detail) {
  return impl_->AckDirective(id, state, std::move(detail));
}

}  // namespace trainwatch
