// JSON output of trainwatchctl's `--json` mode (docs/contracts.md).
//
// Written by hand rather than with protobuf's MessageToJsonString because the
// proto3 mapping prints 64-bit integers as strings ("step": "12") and drops
// zero values, while scripts expect `"step": 12` and a fixed set of keys.
#ifndef TRAINWATCH_CLIENT_OUTPUT_JSON_OUT_H_
#define TRAINWATCH_CLIENT_OUTPUT_JSON_OUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "trainwatch/restart_plan.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::cli {

// Appends compact JSON to a borrowed string. The caller keeps nesting
// balanced; the writer only places commas and colons. Doubles are printed in
// the shortest form that reads back to the same value; non-finite ones as the
// strings "NaN", "Infinity", "-Infinity" (the proto3 JSON convention, which
// every JSON parser accepts, unlike bare NaN).
//
// Thread-compatible: one thread at a time.
class JsonWriter {
 public:
  explicit JsonWriter(std::string* out) : out_(out) {}
  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;

  void BeginObject();
  void EndObject();
  void BeginArray();
  void EndArray();
  // Inside an object: the key of the next value.
  void Key(absl::string_view key);

  void String(absl::string_view value);
  void Int(int64_t value);
  void Uint(uint64_t value);
  void Double(double value);
  void Bool(bool value);
  void Null();

 private:
  // Writes the comma that separates this value from the previous sibling.
  void BeforeValue();

  std::string* out_;
  // One entry per open container: whether it holds no value yet.
  std::vector<bool> empty_;
  bool after_key_ = false;
};

// A JSON string literal with quotes, backslashes and control characters
// escaped. Bytes >= 0x80 pass through (protobuf strings are UTF-8).
std::string JsonQuote(absl::string_view text);

// Shortest round-trip text of a double; "NaN", "Infinity", "-Infinity" for
// non-finite values (unquoted: callers decide how to embed them).
std::string FormatDouble(double value);

// A stored step: the StepRecord fields by snake_case name, plus rank and
// attempt. Optional, repeated and map fields appear only when present.
void WriteStep(JsonWriter& w, const v1::StepRecord& record, uint32_t rank,
               uint32_t attempt);

// "FP16", "BF16", "FP32" or "PRECISION_UNSPECIFIED".
absl::string_view PrecisionName(v1::Precision precision);

// `server`: the fleet server that answered, as a "server" key; "" for none.
void WriteRun(JsonWriter& w, const v1::RunSummary& run,
              absl::string_view server = "");

// Every key is always present; resolved_step and resolved_unix_nanos are null
// while the alert is firing. `server` as for WriteRun.
void WriteAlert(JsonWriter& w, const v1::Alert& alert,
                absl::string_view server = "");

// One spike with its restart plan. Every key is always present:
// restart_from_step is null when no checkpoint is early enough, and
// skip_batch_ids (the batches the plan skips) repeats batch_ids.
void WriteSpike(JsonWriter& w, const v1::Spike& spike);
// {step, high_steps, peak, level, peak_is_ratio, batch_ids}
void WriteHardBatch(JsonWriter& w, const v1::HardBatch& hard_batch);

// A restart plan (`plan --json`). Every key is always present:
// restart_from_step is null without an early enough checkpoint, outcome is
// "" until a new attempt replayed the spike's steps.
void WritePlan(JsonWriter& w, const RestartPlan& plan);

// A closed-loop directive as the server keeps it (`directives --json`):
// id, seq, run, action, alert, state, apply_at_step, approved_by,
// for_attempt, reason, the action's fields under its name ("rollback":
// {to_step, checkpoint, skip_batch_ids, lr_scale}, ...), applied_ranks and
// transitions [{state, who, unix_nanos, why}]. Every key is always present.
void WriteDirective(JsonWriter& w, const v1::DirectiveRecord& record);

// `compare --json` (compare_out.cc): {run, attempt, refs: ["run@1"], metric,
// axis, bins: [{x, first_step, last_step, value, ref_median, lo, hi, z,
// outside}], left_band, first_step_outside (null when within),
// band_half_width}.
void WriteCompare(JsonWriter& w, const v1::CompareRunsResponse& r);

// The run, window, recommendation, active alerts and every spike (oldest
// first).
void WriteHealth(JsonWriter& w, const v1::GetRunHealthResponse& health);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_OUTPUT_JSON_OUT_H_
