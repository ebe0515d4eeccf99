// The JSONL step log (docs/contracts.md): one JSON object per line, read as a
// stream so that a log of any length is never held in memory at once.
//
//   {"run_start": {"run_id": "r1", "precision": "FP16", "max_norm": 1.0}}
//   {"step": 12, "grad_norm": 0.41, "loss_scale": 65536}
//   {"event": {"step": 100, "kind": "CHECKPOINT_SAVED"}}
//
// Field names and values follow the proto3 JSON mapping of trainwatch.v1, so
// non-finite floats are the strings "NaN", "Infinity" and "-Infinity".
#ifndef TRAINWATCH_CLIENT_STEPLOG_STEPLOG_H_
#define TRAINWATCH_CLIENT_STEPLOG_STEPLOG_H_

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainwatch/client.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::cli {

// One meaningful line of a step log.
using StepLogEntry = std::variant<v1::RunStart, v1::StepRecord, v1::RunEvent>;

// Reads a step log line by line from a borrowed stream. Blank lines are
// skipped. Order is not checked (steps going backwards are for the server to
// judge), but every line must be a well-formed object with known fields.
//
// Thread-compatible: one thread at a time.
class StepLogReader {
 public:
  // `name` is how errors refer to the input, normally the file name.
  StepLogReader(std::istream* in, std::string name);
  StepLogReader(const StepLogReader&) = delete;
  StepLogReader& operator=(const StepLogReader&) = delete;

  // The next entry, std::nullopt at the end of the input, or an error of the
  // form "NAME:LINE: what is wrong". After an error or the end, every later
  // call returns the same result: a caller cannot read past a bad line.
  absl::StatusOr<std::optional<StepLogEntry>> Next();

  // 1-based number of the line Next() returned last (0 before the first).
  int64_t line_number() const { return line_number_; }

 private:
  absl::StatusOr<StepLogEntry> ParseLine(const std::string& line) const;

  std::istream* in_;
  std::string name_;
  int64_t line_number_ = 0;
  // Sticky end or error, so a bad line is never skipped over.
  std::optional<absl::Status> final_status_;
  std::string line_;  // reused across lines to avoid a reallocation per line
};

// The client API's kind of a wire event (an error for an unknown one). A
// run_start line becomes ClientOptions by ApplyRunStart (trainwatch/run_start.h).
absl::StatusOr<EventKind> ToClientEventKind(v1::EventKind kind);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_STEPLOG_STEPLOG_H_
