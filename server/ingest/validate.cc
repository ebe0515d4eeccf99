#include "ingest/validate.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainwatch/v1/step_bound.h"

namespace trainwatch {
namespace {

// Label names become part of alert labels and the run's description: keep
// them to what Prometheus accepts as a label name.
bool IsLabelKey(std::string_view key) {
  if (key.empty()) return false;
  for (size_t i = 0; i < key.size(); ++i) {
    char c = key[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// The first `chars` characters of `s`, cut on a character boundary (an
// error message quoting a name stays valid UTF-8).
absl::string_view Utf8Prefix(absl::string_view s, size_t chars) {
  size_t i = 0;
  for (size_t seen = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && seen++ == chars) break;
  }
  return s.substr(0, i);
}

// Whether `s` has more than `limit` characters (bytes first: a string of at
// most `limit` bytes is never counted).
bool OverChars(std::string_view s, size_t limit) {
  return s.size() > limit && Utf8Chars(s) > limit;
}

}  // namespace

// A host stream's ranks: its sender among them, each once, each a rank of
// the run.
static absl::Status ValidateLocalRanks(const v1::RunStart& start, uint32_t world_size) {
  if (start.local_ranks_size() == 0) return absl::OkStatus();  // a rank's own stream
  if (static_cast<size_t>(start.local_ranks_size()) > kMaxLocalRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunStart has ", start.local_ranks_size(), " local_ranks; a stream carries at most ",
        kMaxLocalRanks, " (run ", start.run_id(), ")"));
  }
  bool has_sender = false;
  for (int i = 0; i < start.local_ranks_size(); ++i) {
    const uint32_t r = start.local_ranks(i);
    if (r >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "local_ranks[", i, "] = ", r, " is not below world_size ", world_size, " (run ",
          start.run_id(), ")"));
    }
    for (int j = 0; j < i; ++j) {
      if (start.local_ranks(j) == r) {
        return absl::InvalidArgumentError(absl::StrCat(
            "local_ranks lists rank ", r, " twice (run ", start.run_id(), ")"));
      }
    }
    has_sender |= r == start.rank();
  }
  if (!has_sender) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local_ranks does not list the stream's own rank ", start.rank(),
        ": a host stream is sent by one of its ranks (run ", start.run_id(), ")"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRunStart(const v1::RunStart& start,
                              const ValidationLimits& limits) {
  if (absl::Status s = ValidateRunId(start.run_id()); !s.ok()) return s;
  uint32_t world_size = start.world_size() == 0 ? 1 : start.world_size();
  if (start.rank() >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", start.rank(), " is not below world_size ", world_size,
        start.world_size() == 0 ? " (world_size 0 is read as 1)" : "",
        " (run ", start.run_id(), ")"));
  }
  if (!v1::Precision_IsValid(start.precision())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "precision ", static_cast<int>(start.precision()),
        " is not a known value; use FP32, BF16 or FP16 (run ", start.run_id(),
        ")"));
  }
  if (!std::isfinite(start.max_norm()) || start.max_norm() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_norm must be finite and >= 0, got ",
                     start.max_norm(), " (run ", start.run_id(), ")"));
  }
  if (start.has_adam_eps() &&
      (!std::isfinite(start.adam_eps()) || start.adam_eps() < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("adam_eps must be finite and >= 0, got ", start.adam_eps()));
  }
  if (start.has_adam_beta2() &&
      !(start.adam_beta2() >= 0 && start.adam_beta2() < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adam_beta2 must be in [0, 1), got ", start.adam_beta2()));
  }
  if (static_cast<size_t>(start.labels_size()) > limits.max_labels) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunStart has ", start.labels_size(), " labels; at most ",
                     limits.max_labels));
  }
  if (absl::Status s = ValidateLocalRanks(start, world_size); !s.ok()) return s;
  // Reference runs (docs/baselines.md): each is read when the run starts.
  if (static_cast<size_t>(start.baselines_size()) > kMaxBaselines) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunStart has ", start.baselines_size(), " baselines; at most ", kMaxBaselines));
  }
  for (const v1::BaselineRef& ref : start.baselines()) {
    if (absl::Status s = ValidateRunId(ref.run()); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("baseline: ", s.message()));
    }
  }
  for (const auto& [key, value] : start.labels()) {
    if (!IsLabelKey(key) || key.size() > limits.max_label_key_chars) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label name \"", key.substr(0, limits.max_label_key_chars),
          "\" must match [A-Za-z_][A-Za-z0-9_]* and have at most ",
          limits.max_label_key_chars, " characters"));
    }
    if (OverChars(value, limits.max_label_value_chars)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label \"", key, "\" has a value of ", Utf8Chars(value),
          " characters; at most ", limits.max_label_value_chars));
    }
  }
  if (OverChars(start.host(), limits.max_host_chars)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunStart.host has ", Utf8Chars(start.host()), " characters; at most ", limits.max_host_chars,
        " (run ", start.run_id(), ")"));
  }
  if (start.has_moe()) {
    const v1::MoeConfig& m = start.moe();
    const auto bad = [&](auto... what) {
      return absl::InvalidArgumentError(
          absl::StrCat("RunStart.moe (run ", start.run_id(), "): ", what...));
    };
    if (m.num_experts() > limits.max_experts) {
      return bad("num_experts is ", m.num_experts(), "; at most ", limits.max_experts);
    }
    // Bounded with num_experts unknown (0) too: they size what the server
    // allocates per report.
    for (const auto& [field, v] : {std::pair<const char*, uint32_t>{"top_k", m.top_k()},
                                   std::pair<const char*, uint32_t>{"ep_size", m.ep_size()}}) {
      if (v > limits.max_experts) {
        return bad(field, " is ", v, "; at most ", limits.max_experts);
      }
    }
    if (m.num_experts() > 0 && m.top_k() > m.num_experts()) {
      return bad("top_k ", m.top_k(), " is above num_experts ", m.num_experts());
    }
    if (m.num_experts() > 0 && m.ep_size() > 0 && m.num_experts() % m.ep_size() != 0) {
      return bad("num_experts ", m.num_experts(), " is not a multiple of ep_size ",
                 m.ep_size(), " (experts are laid out in contiguous blocks)");
    }
    if (!v1::MoeBalancing_IsValid(m.balancing())) {
      return bad("balancing ", static_cast<int>(m.balancing()), " is unknown");
    }
    for (const auto& [field, v] :
         {std::pair<const char*, double>{"aux_loss_coeff", m.aux_loss_coeff()},
          std::pair<const char*, double>{"z_loss_coeff", m.z_loss_coeff()},
          std::pair<const char*, double>{"bias_update_rate", m.bias_update_rate()},
          std::pair<const char*, double>{"capacity_factor", m.capacity_factor()}}) {
      if (!std::isfinite(v) || v < 0) return bad(field, " is ", v, "; finite and >= 0");
    }
  }
  return absl::OkStatus();
}

namespace {

// Steps are stored as signed 64-bit integers (SQLite's): a step at or above
// 2^63 (usually a client's -1 read as unsigned) cannot be stored as sent,
// so it is refused rather than acknowledged and clamped.
absl::Status ValidateStep(uint64_t step, absl::string_view what) {
  if (step <= v1::kMaxStep) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, step, " is not below 2^63 (", static_cast<int64_t>(step),
      " as a signed integer: a step of -1?); steps are stored as signed "
      "64-bit integers"));
}

// A share of elements: NaN and Inf are data, a finite value outside [0, 1]
// is a bug in whatever computed it.
bool BadFraction(bool has, double v) {
  return has && std::isfinite(v) && (v < 0 || v > 1);
}

absl::Status ValidateFp8(const v1::StepRecord& r, const ValidationLimits& limits) {
  if (static_cast<size_t>(r.fp8_size()) > limits.max_fp8_tensors) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", r.step(), ": fp8 has ", r.fp8_size(), " tensors; at most ",
        limits.max_fp8_tensors));
  }
  for (const auto& [name, f] : r.fp8()) {
    if (name.empty() || OverChars(name, limits.max_layer_name_chars)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", r.step(), ": fp8 tensor name \"", Utf8Prefix(name, 32), "\" has ",
          Utf8Chars(name), " characters; 1 to ", limits.max_layer_name_chars));
    }
    if (f.format() == v1::FP8_FORMAT_UNSPECIFIED || !v1::Fp8Format_IsValid(f.format())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", r.step(), ": fp8[\"", name, "\"].format is ",
          f.format() == v1::FP8_FORMAT_UNSPECIFIED ? "missing" : "unknown",
          " (", static_cast<int>(f.format()),
          "); one of E4M3, E5M2, E4M3_FNUZ, E5M2_FNUZ"));
    }
    if (BadFraction(f.has_overflow_fraction(), f.overflow_fraction()) ||
        BadFraction(f.has_underflow_fraction(), f.underflow_fraction())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", r.step(), ": fp8[\"", name,
          "\"] overflow_fraction and underflow_fraction must be in [0, 1], got ",
          f.overflow_fraction(), " and ", f.underflow_fraction()));
    }
    if (OverChars(f.amax_group(), limits.max_label_value_chars)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", r.step(), ": fp8[\"", name, "\"].amax_group has ",
          Utf8Chars(f.amax_group()), " characters; at most ",
          limits.max_label_value_chars));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMoe(const v1::StepRecord& r, const ValidationLimits& limits,
                         const v1::MoeConfig& config) {
  const v1::MoeStats& moe = r.moe();
  if (static_cast<size_t>(moe.layers_size()) > limits.max_moe_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", r.step(), ": moe has ", moe.layers_size(), " layers; at most ",
        limits.max_moe_layers));
  }
  for (int i = 0; i < moe.layers_size(); ++i) {
    const v1::MoeLayerStats& l = moe.layers(i);
    // Built only for a refusal: a valid report (48 layers a record) pays nothing.
    const auto where = [&] { return absl::StrCat("step ", r.step(), ": moe.layers[", i, "]"); };
    if (OverChars(l.layer(), limits.max_layer_name_chars)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), ".layer has ", Utf8Chars(l.layer()), " characters; at most ",
          limits.max_layer_name_chars));
    }
    for (const auto& [field, size] :
         {std::pair<const char*, int>{"tokens_per_expert", l.tokens_per_expert_size()},
          std::pair<const char*, int>{"expert_bias", l.expert_bias_size()}}) {
      const size_t n = static_cast<size_t>(size);
      if (n > limits.max_experts) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), ".", field, " has ", n, " entries; at most ", limits.max_experts));
      }
      if (n > 0 && config.num_experts() > 0 && n != config.num_experts()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), ".", field, " has ", n, " entries; the run's RunStart.moe.num_experts is ",
            config.num_experts()));
      }
    }
    // One test for the layer (no branch a count), then the first offender.
    // Four ORs in flight: one chain waited on each load (GCC's -O2 does not
    // vectorize a reduction of unknown length).
    const uint64_t* counts = l.tokens_per_expert().data();
    const size_t n = static_cast<size_t>(l.tokens_per_expert_size());
    uint64_t any[4] = {0, 0, 0, 0};
    size_t c = 0;
    for (; c + 4 <= n; c += 4) {
      any[0] |= counts[c];
      any[1] |= counts[c + 1];
      any[2] |= counts[c + 2];
      any[3] |= counts[c + 3];
    }
    for (; c < n; ++c) any[0] |= counts[c];
    if ((any[0] | any[1] | any[2] | any[3]) >> 63 != 0) {
      for (uint64_t count : l.tokens_per_expert()) {
        if (count >> 63 == 0) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            where(), ".tokens_per_expert has ", count,
            ", not below 2^63 (a count of -1?)"));
      }
    }
    if (l.has_dropped() &&
        l.dropped() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), ".dropped is ", l.dropped(), ", not below 2^63 (a count of -1?)"));
    }
    // Losses are >= 0 by definition; NaN and Inf are data.
    for (const auto& [field, has, v] :
         {std::tuple<const char*, bool, double>{"aux_loss", l.has_aux_loss(), l.aux_loss()},
          std::tuple<const char*, bool, double>{"z_loss", l.has_z_loss(), l.z_loss()}}) {
      if (has && v < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), ".", field, " is ", v, "; a loss is >= 0"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateBatchShape(const v1::StepBatch& batch,
                                const ValidationLimits& limits) {
  if (static_cast<size_t>(batch.records_size()) > limits.max_batch_records) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch seq ", batch.seq(), " has ", batch.records_size(),
                     " records; at most ", limits.max_batch_records));
  }
  return absl::OkStatus();
}

absl::Status ValidateStepRecord(const v1::StepRecord& r,
                                const ValidationLimits& limits,
                                const v1::MoeConfig& moe) {
  if (absl::Status s = ValidateStep(r.step(), "step "); !s.ok()) return s;
  if (static_cast<size_t>(r.batch_ids_size()) > limits.max_batch_ids) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", r.step(), ": batch_ids has ", r.batch_ids_size(),
                     " entries; at most ", limits.max_batch_ids));
  }
  if (static_cast<size_t>(r.layer_stats_size()) > limits.max_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", r.step(), ": layer_stats has ", r.layer_stats_size(),
        " layers; at most ", limits.max_layers));
  }
  for (const auto& [name, stats] : r.layer_stats()) {
    if (OverChars(name, limits.max_layer_name_chars)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", r.step(), ": layer name \"", Utf8Prefix(name, 32),
          "...\" has ", Utf8Chars(name), " characters; at most ",
          limits.max_layer_name_chars));
    }
    if (!v1::LayerKind_IsValid(stats.kind())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", r.step(), ": layer_stats[\"", name, "\"].kind is unknown (",
          static_cast<int>(stats.kind()),
          "); one of DENSE, EMBEDDING, OUTPUT, NORM, ROUTER"));
    }
  }
  if (absl::Status s = ValidateFp8(r, limits); !s.ok()) return s;
  if (r.has_moe()) {
    if (absl::Status s = ValidateMoe(r, limits, moe); !s.ok()) return s;
  }
  // NaN and Inf are data (docs/contracts.md); a finite value outside [0, 1] is a
  // bug in whatever computed it.
  if (r.has_clip_coef() && std::isfinite(r.clip_coef()) &&
      (r.clip_coef() < 0 || r.clip_coef() > 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", r.step(), ": clip_coef must be in [0, 1], got ",
                     r.clip_coef()));
  }
  if (r.time_unix_nanos() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", r.step(), ": time_unix_nanos is negative (",
                     r.time_unix_nanos(), ")"));
  }
  return absl::OkStatus();
}

size_t RefuseBadRecords(v1::StepBatch* batch, const ValidationLimits& limits,
                        const v1::MoeConfig& moe, absl::Status* first_refusal) {
  auto* records = batch->mutable_records();
  const int n = records->size();
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    absl::Status s = ValidateStepRecord(records->Get(i), limits, moe);
    if (!s.ok()) {
      if (first_refusal != nullptr && first_refusal->ok()) *first_refusal = std::move(s);
      continue;
    }
    if (kept != i) records->SwapElements(kept, i);
    ++kept;
  }
  if (kept < n) records->DeleteSubrange(kept, n - kept);
  return static_cast<size_t>(n - kept);
}

absl::Status ValidateStepBatch(const v1::StepBatch& batch,
                               const ValidationLimits& limits) {
  if (absl::Status s = ValidateBatchShape(batch, limits); !s.ok()) return s;
  for (const v1::StepRecord& r : batch.records()) {
    if (absl::Status s = ValidateStepRecord(r, limits); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ValidateRunEvent(const v1::RunEvent& event,
                              const ValidationLimits& limits) {
  if (absl::Status s = ValidateStep(event.step(), "event at step "); !s.ok()) {
    return s;
  }
  if (event.kind() == v1::EVENT_KIND_UNSPECIFIED ||
      !v1::EventKind_IsValid(event.kind())) {
    return absl::InvalidArgumentError(
        absl::StrCat("event at step ", event.step(), " has no valid kind (",
                     static_cast<int>(event.kind()),
                     "); use CHECKPOINT_SAVED, RUN_FINISHED or RUN_FAILED"));
  }
  if (OverChars(event.detail(), limits.max_event_detail_chars)) {
    return absl::InvalidArgumentError(
        absl::StrCat("event at step ", event.step(), ": detail has ",
                     Utf8Chars(event.detail()), " characters; at most ",
                     limits.max_event_detail_chars));
  }
  return absl::OkStatus();
}

}  // namespace trainwatch
