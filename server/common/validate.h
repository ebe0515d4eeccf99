// What every part checks of what users name (docs/contracts.md): run ids,
// the limits on what trainers send (ingest/validate.h checks the records
// against them, ingest/wire_budget.h the message before its parse), the
// characters a limit counts. INVALID_ARGUMENT with a message that names the
// field and the value.
#ifndef TRAINWATCH_SERVER_COMMON_VALIDATE_H_
#define TRAINWATCH_SERVER_COMMON_VALIDATE_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

struct ValidationLimits {
  // Records in one StepBatch.
  size_t max_batch_records = 16384;
  // Labels on a RunStart, and the length of each key and value.
  size_t max_labels = 32;
  size_t max_label_key_chars = 64;
  size_t max_label_value_chars = 256;
  // layer_stats entries in one record, and the length of a layer name (names
  // are quoted in alert descriptions).
  size_t max_layers = 4096;
  size_t max_layer_name_chars = 256;
  // fp8 entries in one record (tensor names share max_layer_name_chars).
  size_t max_fp8_tensors = 4096;
  // MoE layers in one record and experts of a run (RunStart.moe; layer
  // names share max_layer_name_chars).
  size_t max_moe_layers = 1024;
  size_t max_experts = 4096;
  // batch_ids in one record.
  size_t max_batch_ids = 65536;
  // detail of a RunEvent.
  size_t max_event_detail_chars = 4096;
  // RunStart.host: a label of alerts and of trainwatch_host_incidents_total.
  size_t max_host_chars = 253;  // a DNS name's longest
  // What one ReportRequest may materialise when parsed: its sub-messages
  // (records, layer_stats, fp8 and moe entries), strings and unknown fields
  // together (WireBudget, ingest/wire_budget.h: counted on the wire, before
  // the parse). A realistic entry is >= 32 bytes, so a 16 MiB message of
  // real data stays under it; empty entries (2 bytes each on the wire, ~100
  // in memory) do not.
  size_t max_message_entries = 524288;
};

// Characters of a UTF-8 string (code points; the parser has checked it is
// UTF-8): every limit named in characters counts these, not bytes.
size_t Utf8Chars(std::string_view s);

// run_id: 1..128 chars of [A-Za-z0-9._:/-].
absl::Status ValidateRunId(std::string_view run_id);

// Ranks one host stream may carry (RunStart.local_ranks): a host's GPUs,
// with room for the largest nodes.
inline constexpr size_t kMaxLocalRanks = 256;

// Reference runs one run may name (RunStart.baselines, `baseline set`):
// each is read when the run starts.
inline constexpr size_t kMaxBaselines = 16;

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_COMMON_VALIDATE_H_
