// Streaming step-log entries to the server through the C++ client, shared by
// `replay` (a JSONL step log) and `import` (a past run's own logs).
#ifndef TRAINWATCH_CLIENT_CLI_SEND_H_
#define TRAINWATCH_CLIENT_CLI_SEND_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cli/commands.h"
#include "steplog/steplog.h"
#include "trainwatch/client.h"

namespace trainwatch::cli {

struct SendResult {
  uint64_t steps = 0;
  uint64_t events = 0;
  uint64_t acked = 0;  // steps the server acknowledged
  double seconds = 0;
};

// The next entry to send (std::nullopt at the end) or an error; sets `*where`
// to how an error about that entry refers to it ("FILE:LINE").
using EntrySource = std::function<absl::StatusOr<std::optional<StepLogEntry>>(
    std::string* where)>;

// Streams every entry of `next` as the run `options` describes (its address
// and security come from `global`) and returns once the server acknowledged
// all of them. Never lets the client drop a step: it waits for the server
// instead. After a bad entry, what came before it is still delivered and the
// entry's error returned. Messages start with `command`.
absl::StatusOr<SendResult> SendEntries(const GlobalOptions& global,
                                       ClientOptions options,
                                       absl::string_view command,
                                       const EntrySource& next);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_CLI_SEND_H_
