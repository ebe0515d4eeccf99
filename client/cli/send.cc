// Streaming step-log entries to the server through the C++ client (send.h):
// what `replay` and `import` share.
#include "cli/send.h"

#include <chrono>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/fleet.h"

namespace trainwatch::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kDefaultAckTimeout{120'000};
// Records the client may hold. Large enough to keep the pipe to the server
// full, small enough that the client's preallocated buffer stays near 20 MiB.
constexpr size_t kCapacity = 1 << 16;
// When this many steps are unacknowledged, replay waits for the server (a
// Flush) rather than let Record() drop: unlike a training loop, replay can
// afford to wait, and a drop would be reported to the server as lost data.
constexpr uint64_t kHighWater = kCapacity / 2;
// Stats() is checked every this many steps, so the backlog can exceed
// kHighWater by at most this much: well under kCapacity.
constexpr uint64_t kCheckEvery = 1024;

// Feeds log entries to a Client without ever letting it drop one.
//
// Thread-compatible: one thread at a time.
class Replayer {
 public:
  Replayer(Client* client, std::chrono::milliseconds timeout,
           absl::string_view command)
      : client_(client), timeout_(timeout), command_(command) {}

  absl::Status Send(const StepLogEntry& entry, absl::string_view where) {
    if (std::holds_alternative<v1::RunStart>(entry)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": a run_start line must come before every step and event"));
    }
    if (const auto* event = std::get_if<v1::RunEvent>(&entry)) {
      absl::StatusOr<EventKind> kind = ToClientEventKind(event->kind());
      if (!kind.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", kind.status().message()));
      }
      ++events_;
      return Retry([&] {
        return client_->RecordEvent(*kind, event->step(), event->detail());
      });
    }
    if (++steps_ % kCheckEvery == 0) {
      if (absl::Status s = WaitIfBacklogged(); !s.ok()) return s;
    }
    const auto& record = std::get<v1::StepRecord>(entry);
    if (record.step() > kMaxStep) {
      // The client would refuse it (and the server too): say where it is,
      // send the rest.
      if (refused_.size() < kRefusedNamed) {
        refused_.push_back(absl::StrCat(
            where, ": step ", record.step(), " refused: not below 2^63 (",
            static_cast<int64_t>(record.step()),
            " as a signed integer: a step of -1?)"));
      }
      ++refused_count_;
      return absl::OkStatus();
    }
    return Retry([&] {
      if (client_->RecordProto(record)) return true;
      ++step_rejections_;
      return false;
    });
  }

  uint64_t steps() const { return steps_; }
  uint64_t events() const { return events_; }
  // Record() calls that returned false and were retried: the client counts
  // them as dropped although replay sent the step again.
  uint64_t step_rejections() const { return step_rejections_; }
  // Records refused before sending, each named by FILE:LINE (the first
  // kRefusedNamed of them).
  uint64_t refused_count() const { return refused_count_; }
  const std::vector<std::string>& refused() const { return refused_; }

  static constexpr size_t kRefusedNamed = 20;

 private:
  absl::Status WaitIfBacklogged() {
    ClientStats stats = client_->Stats();
    if (stats.recorded < stats.acked + kHighWater) return absl::OkStatus();
    absl::Status s = client_->Flush(timeout_);
    if (s.ok()) return s;
    return absl::Status(
        s.code(), absl::StrCat(command_, ": the server stopped acknowledging: ",
                               s.message()));
  }

  // Calls `try_once` until it succeeds or the timeout passes.
  template <typename Fn>
  absl::Status Retry(Fn try_once) {
    const Clock::time_point deadline = Clock::now() + timeout_;
    while (!try_once()) {
      if (Clock::now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(command_,
                         ": the client buffer stayed full: the server is not "
                         "acknowledging"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return absl::OkStatus();
  }

  Client* client_;
  std::chrono::milliseconds timeout_;
  std::string command_;
  uint64_t steps_ = 0;
  uint64_t events_ = 0;
  uint64_t step_rejections_ = 0;
  uint64_t refused_count_ = 0;
  std::vector<std::string> refused_;
};

// What was refused, one record a line, the server's reason last; OK when
// nothing was.
absl::Status RefusedRecords(const Replayer& replayer, const ClientStats& stats,
                            const absl::Status& server_reason,
                            absl::string_view command) {
  const uint64_t by_server = stats.rejected;
  const uint64_t total = replayer.refused_count() + by_server;
  if (total == 0) return absl::OkStatus();
  std::string lines;
  for (const std::string& line : replayer.refused()) absl::StrAppend(&lines, "\n", line);
  if (replayer.refused_count() > replayer.refused().size()) {
    absl::StrAppend(&lines, "\n... and ",
                    replayer.refused_count() - replayer.refused().size(), " more");
  }
  if (by_server > 0) {
    absl::StrAppend(&lines, "\nthe server refused ", by_server, " record(s); the first: ",
                    server_reason.message());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      command, ": ", total, " record(s) refused; the other ", stats.acked,
      " steps were stored and acknowledged:", lines));
}

}  // namespace

absl::StatusOr<SendResult> SendEntries(const GlobalOptions& global,
                                       ClientOptions options,
                                       absl::string_view command,
                                       const EntrySource& next) {
  const std::chrono::milliseconds timeout =
      global.timeout.value_or(kDefaultAckTimeout);
  const Clock::time_point start = Clock::now();
  options.address = global.server;
  options.security = global.security;
  options.capacity = kCapacity;
  // The log's timing and machine are not this process's: step times and the
  // host come from the log or stay absent.
  options.measure_locally = false;
  // A one-shot command: a quota it is over ends it, with the server's reason.
  options.fail_fast = true;
  const std::string run_id = options.run_id;
  // A fleet's servers listed one by one: resume the run on the server that
  // holds it. The client sends x-trainwatch-run itself, for a proxy.
  absl::StatusOr<GlobalOptions> aimed = ForRun(global, command, run_id);
  if (!aimed.ok()) return aimed.status();
  options.address = aimed->server;
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Create(std::move(options));
  if (!client.ok()) {
    return absl::Status(client.status().code(),
                        absl::StrCat(command, ": ", client.status().message()));
  }
  // Only reached after the final Flush, or on an error that is reported
  // anyway: a failing Close has nothing to add.
  absl::Cleanup close = [&] {
    (*client)->Close(std::chrono::seconds(1)).IgnoreError();
  };

  Replayer replayer(client->get(), timeout, command);
  absl::Status line_error;
  std::string where;
  while (true) {
    absl::StatusOr<std::optional<StepLogEntry>> entry = next(&where);
    if (!entry.ok()) {
      line_error = entry.status();
      break;
    }
    if (!entry->has_value()) break;
    line_error = replayer.Send(**entry, where);
    if (!line_error.ok()) break;
  }
  // The server stalled for a whole timeout already; a final Flush would only
  // wait as long again.
  if (line_error.code() == absl::StatusCode::kDeadlineExceeded) {
    return line_error;
  }

  // Even after a bad line, what came before it is delivered: a partial log
  // on the server is more useful than a guess about what arrived.
  absl::Status flushed = (*client)->Flush(timeout);
  const ClientStats stats = (*client)->Stats();
  if (!line_error.ok()) {
    if (flushed.ok()) return line_error;
    return absl::Status(line_error.code(),
                        absl::StrCat(line_error.message(),
                                     "; the records before it were not "
                                     "all acknowledged: ",
                                     flushed.message()));
  }
  if (!flushed.ok() && !(*client)->Refusal().ok()) {
    return absl::Status(
        flushed.code(),
        absl::StrFormat("%s: %d of %d steps acknowledged: %s", command,
                        stats.acked, replayer.steps(), flushed.message()));
  }
  if (!flushed.ok()) {
    return absl::Status(
        flushed.code(),
        absl::StrFormat("%s: %d of %d steps acknowledged after %.0f s "
                        "(is the server at %s running?): %s",
                        command, stats.acked, replayer.steps(),
                        std::chrono::duration<double>(timeout).count(),
                        aimed->server, flushed.message()));
  }
  if (stats.dropped > replayer.step_rejections()) {
    return absl::DataLossError(
        absl::StrCat(command, ": the client dropped ",
                     stats.dropped - replayer.step_rejections(), " steps"));
  }
  if (absl::Status s = RefusedRecords(replayer, stats, (*client)->LastRejection(), command);
      !s.ok()) {
    return s;
  }
  return SendResult{
      .steps = replayer.steps(),
      .events = replayer.events(),
      .acked = stats.acked,
      .seconds = std::chrono::duration<double>(Clock::now() - start).count()};
}

}  // namespace trainwatch::cli
