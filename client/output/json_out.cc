#include "output/json_out.h"

#include <charconv>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainwatch/step_fields.h"
#include "trainwatch/v1/alert_names.h"

namespace trainwatch::cli {

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!empty_.empty()) {
    if (!empty_.back()) out_->push_back(',');
    empty_.back() = false;
  }
}

void JsonWriter::BeginObject() {
  BeforeValue();
  out_->push_back('{');
  empty_.push_back(true);
}

void JsonWriter::EndObject() {
  empty_.pop_back();
  out_->push_back('}');
}

void JsonWriter::BeginArray() {
  BeforeValue();
  out_->push_back('[');
  empty_.push_back(true);
}

void JsonWriter::EndArray() {
  empty_.pop_back();
  out_->push_back(']');
}

void JsonWriter::Key(absl::string_view key) {
  BeforeValue();
  out_->append(JsonQuote(key));
  out_->push_back(':');
  after_key_ = true;
}

void JsonWriter::String(absl::string_view value) {
  BeforeValue();
  out_->append(JsonQuote(value));
}

void JsonWriter::Int(int64_t value) {
  BeforeValue();
  absl::StrAppend(out_, value);
}

void JsonWriter::Uint(uint64_t value) {
  BeforeValue();
  absl::StrAppend(out_, value);
}

void JsonWriter::Double(double value) {
  BeforeValue();
  if (std::isfinite(value)) {
    out_->append(FormatDouble(value));
  } else {
    out_->append(JsonQuote(FormatDouble(value)));
  }
}

void JsonWriter::Bool(bool value) {
  BeforeValue();
  out_->append(value ? "true" : "false");
}

void JsonWriter::Null() {
  BeforeValue();
  out_->append("null");
}

std::string JsonQuote(absl::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out.push_back('"');
  for (char c : text) {
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\r':
        out.append("\\r");
        break;
      case '\t':
        out.append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

std::string FormatDouble(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, end);
}

namespace {

void OptionalDouble(JsonWriter& w, absl::string_view key, bool present,
                    double value) {
  if (!present) return;
  w.Key(key);
  w.Double(value);
}

void Labels(JsonWriter& w,
            const google::protobuf::Map<std::string, std::string>& labels) {
  // protobuf's Map iterates in no fixed order; sorted keys keep output stable.
  std::map<std::string, std::string> sorted(labels.begin(), labels.end());
  w.BeginObject();
  for (const auto& [key, value] : sorted) {
    w.Key(key);
    w.String(value);
  }
  w.EndObject();
}

void Int64Array(JsonWriter& w,
                const google::protobuf::RepeatedField<int64_t>& values) {
  w.BeginArray();
  for (int64_t v : values) w.Int(v);
  w.EndArray();
}

// An enum by its name; a value this build has no name for (a newer
// client's) as its number, which the proto3 JSON reader takes back.
void EnumValue(JsonWriter& w, int value, bool named, const std::string& name) {
  if (named) {
    w.String(name);
  } else {
    w.Int(value);
  }
}

void WriteMoe(JsonWriter& w, const v1::MoeStats& moe) {
  w.Key("moe");
  w.BeginObject();
  w.Key("layers");
  w.BeginArray();
  for (const v1::MoeLayerStats& l : moe.layers()) {
    w.BeginObject();
    w.Key("layer");
    w.String(l.layer());
    if (!l.tokens_per_expert().empty()) {
      w.Key("tokens_per_expert");
      w.BeginArray();
      for (uint64_t n : l.tokens_per_expert()) w.Uint(n);
      w.EndArray();
    }
    if (l.has_dropped()) {
      w.Key("dropped");
      w.Uint(l.dropped());
    }
    OptionalDouble(w, "aux_loss", l.has_aux_loss(), l.aux_loss());
    OptionalDouble(w, "z_loss", l.has_z_loss(), l.z_loss());
    if (!l.expert_bias().empty()) {
      w.Key("expert_bias");
      w.BeginArray();
      for (float b : l.expert_bias()) w.Double(b);
      w.EndArray();
    }
    OptionalDouble(w, "router_logit_max", l.has_router_logit_max(),
                   l.router_logit_max());
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
}

}  // namespace

void WriteStep(JsonWriter& w, const v1::StepRecord& r, uint32_t rank,
               uint32_t attempt) {
  w.BeginObject();
  w.Key("rank");
  w.Uint(rank);
  w.Key("attempt");
  w.Uint(attempt);
  w.Key("step");
  w.Uint(r.step());
  w.Key("grad_norm");
  w.Double(r.grad_norm());
  if (r.has_clipped()) {
    w.Key("clipped");
    w.Bool(r.clipped());
  }
  w.Key("skipped");
  w.Bool(r.skipped());
#define TW_WRITE(name) OptionalDouble(w, #name, r.has_##name(), r.name());
  TRAINWATCH_STEP_OPTIONAL_DOUBLES(TW_WRITE)
#undef TW_WRITE
  if (r.has_tokens()) {
    w.Key("tokens");
    w.Uint(r.tokens());
  }
  w.Key("time_unix_nanos");
  w.Int(r.time_unix_nanos());
  if (!r.batch_ids().empty()) {
    w.Key("batch_ids");
    Int64Array(w, r.batch_ids());
  }
  if (!r.layer_stats().empty()) {
    std::map<std::string, v1::LayerStats> sorted(r.layer_stats().begin(),
                                                 r.layer_stats().end());
    w.Key("layer_stats");
    w.BeginObject();
    for (const auto& [name, stats] : sorted) {
      w.Key(name);
      w.BeginObject();
      w.Key("grad_norm");
      w.Double(stats.grad_norm());
      w.Key("grad_rms");
      w.Double(stats.grad_rms());
      w.Key("g_over_sqrt_v_rms");
      w.Double(stats.g_over_sqrt_v_rms());
      OptionalDouble(w, "update_rms_ratio", stats.has_update_rms_ratio(),
                     stats.update_rms_ratio());
      if (stats.kind() != v1::LAYER_KIND_UNSPECIFIED) {
        w.Key("kind");
        EnumValue(w, stats.kind(), v1::LayerKind_IsValid(stats.kind()),
                  v1::LayerKind_Name(stats.kind()));
      }
      w.EndObject();
    }
    w.EndObject();
  }
  if (!r.fp8().empty()) {
    std::map<std::string, v1::Fp8TensorStats> sorted(r.fp8().begin(), r.fp8().end());
    w.Key("fp8");
    w.BeginObject();
    for (const auto& [name, f] : sorted) {
      w.Key(name);
      w.BeginObject();
      w.Key("format");
      EnumValue(w, f.format(), v1::Fp8Format_IsValid(f.format()),
                v1::Fp8Format_Name(f.format()));
      w.Key("amax");
      w.Double(f.amax());
      w.Key("scale");
      w.Double(f.scale());
      w.Key("amax_history_len");
      w.Uint(f.amax_history_len());
      w.Key("margin");
      w.Double(f.margin());
      OptionalDouble(w, "overflow_fraction", f.has_overflow_fraction(),
                     f.overflow_fraction());
      OptionalDouble(w, "underflow_fraction", f.has_underflow_fraction(),
                     f.underflow_fraction());
      w.Key("amax_group");
      w.String(f.amax_group());
      w.EndObject();
    }
    w.EndObject();
  }
  if (r.has_moe()) WriteMoe(w, r.moe());
  w.EndObject();
}

absl::string_view PrecisionName(v1::Precision precision) {
  switch (precision) {
    case v1::FP32:
      return "FP32";
    case v1::BF16:
      return "BF16";
    case v1::FP16:
      return "FP16";
    default:
      return "PRECISION_UNSPECIFIED";
  }
}

void WriteRun(JsonWriter& w, const v1::RunSummary& run,
              absl::string_view server) {
  w.BeginObject();
  w.Key("run_id");
  w.String(run.run_id());
  w.Key("world_size");
  w.Uint(run.world_size());
  w.Key("attempt");
  w.Uint(run.attempt());
  w.Key("precision");
  w.String(PrecisionName(run.precision()));
  w.Key("max_norm");
  w.Double(run.max_norm());
  w.Key("warmup_steps");
  w.Uint(run.warmup_steps());
  w.Key("labels");
  Labels(w, run.labels());
  w.Key("last_step");
  w.Uint(run.last_step());
  w.Key("steps");
  w.Uint(run.steps());
  w.Key("started_unix_nanos");
  w.Int(run.started_unix_nanos());
  w.Key("last_seen_unix_nanos");
  w.Int(run.last_seen_unix_nanos());
  w.Key("state");
  w.String(run.state());
  w.Key("active_alerts");
  w.Uint(run.active_alerts());
  if (!server.empty()) {
    w.Key("server");
    w.String(server);
  }
  w.EndObject();
}

void WriteAlert(JsonWriter& w, const v1::Alert& a,
                absl::string_view server) {
  // The wire says "0 while firing"; JSON can say it plainly.
  const bool resolved = a.state() == v1::ALERT_STATE_RESOLVED;
  w.BeginObject();
  w.Key("alertname");
  w.String(a.alertname());
  w.Key("run");
  w.String(a.run());
  w.Key("severity");
  w.String(v1::SeverityName(a.severity()));
  w.Key("state");
  w.String(v1::StateName(a.state()));
  w.Key("started_step");
  w.Uint(a.started_step());
  w.Key("resolved_step");
  if (resolved) {
    w.Uint(a.resolved_step());
  } else {
    w.Null();
  }
  w.Key("peak_value");
  w.Double(a.peak_value());
  w.Key("summary");
  w.String(a.summary());
  w.Key("description");
  w.String(a.description());
  w.Key("likely_cause");
  w.String(a.likely_cause());
  w.Key("fix");
  w.String(a.fix());
  w.Key("batch_ids");
  Int64Array(w, a.batch_ids());
  w.Key("rank");
  w.Uint(a.rank());
  w.Key("host");
  w.String(a.host());
  // 0: the alert has no change-point estimate; "": a cause of its own.
  w.Key("onset_step");
  w.Uint(a.onset_step());
  w.Key("caused_by");
  w.String(a.caused_by());
  w.Key("started_unix_nanos");
  w.Int(a.started_unix_nanos());
  w.Key("resolved_unix_nanos");
  if (resolved) {
    w.Int(a.resolved_unix_nanos());
  } else {
    w.Null();
  }
  if (!server.empty()) {
    w.Key("server");
    w.String(server);
  }
  w.EndObject();
}

void WriteHardBatch(JsonWriter& w, const v1::HardBatch& b) {
  w.BeginObject();
  w.Key("step");
  w.Uint(b.step());
  w.Key("high_steps");
  w.Uint(b.high_steps());
  w.Key("peak");
  w.Double(b.peak());
  w.Key("level");
  w.Double(b.level());
  w.Key("peak_is_ratio");
  w.Bool(b.peak_is_ratio());
  w.Key("batch_ids");
  Int64Array(w, b.batch_ids());
  w.EndObject();
}

void WriteSpike(JsonWriter& w, const v1::Spike& spike) {
  w.BeginObject();
  w.Key("step");
  w.Uint(spike.step());
  w.Key("grad_norm");
  w.Double(spike.grad_norm());
  w.Key("ratio_to_ema");
  w.Double(spike.ratio_to_ema());
  w.Key("sigmas");
  w.Double(spike.sigmas());
  w.Key("batch_ids");
  Int64Array(w, spike.batch_ids());
  w.Key("restart_from_step");
  if (spike.has_restart_from_step()) {
    w.Uint(spike.restart_from_step());
  } else {
    w.Null();
  }
  w.Key("restart_checkpoint");
  w.String(spike.restart_checkpoint());
  w.Key("skip_batch_ids");
  Int64Array(w, spike.batch_ids());
  w.Key("outcome");
  w.String(spike.outcome());
  w.Key("batches_skipped");
  w.Bool(spike.batches_skipped());
  w.EndObject();
}

void WriteDirective(JsonWriter& w, const v1::DirectiveRecord& record) {
  const v1::Directive& d = record.directive();
  const auto ids = [&w](const google::protobuf::RepeatedField<int64_t>& list) {
    w.BeginArray();
    for (int64_t id : list) w.Int(id);
    w.EndArray();
  };
  w.BeginObject();
  w.Key("id");
  w.String(d.id());
  w.Key("seq");
  w.Uint(d.seq());
  w.Key("run");
  w.String(record.run_id());
  w.Key("action");
  absl::string_view action = "";
  switch (d.action_case()) {
    case v1::Directive::kCheckpointNow: action = "checkpoint_now"; break;
    case v1::Directive::kSkip: action = "skip"; break;
    case v1::Directive::kRollback: action = "rollback"; break;
    case v1::Directive::kScaleLr: action = "scale_lr"; break;
    case v1::Directive::kStop: action = "stop"; break;
    case v1::Directive::ACTION_NOT_SET: break;
  }
  w.String(action);
  w.Key("alert");
  w.String(d.alert());
  w.Key("state");
  w.String(record.state());
  w.Key("apply_at_step");
  w.Uint(d.apply_at_step());
  w.Key("approved_by");
  w.String(d.approved_by());
  w.Key("for_attempt");
  w.Uint(d.for_attempt());
  w.Key("reason");
  w.String(d.reason());
  if (!action.empty()) w.Key(action);
  switch (d.action_case()) {
    case v1::Directive::kCheckpointNow:
      w.BeginObject();
      w.Key("tag");
      w.String(d.checkpoint_now().tag());
      w.EndObject();
      break;
    case v1::Directive::kSkip:
      w.BeginObject();
      w.Key("batch_ids");
      ids(d.skip().batch_ids());
      w.EndObject();
      break;
    case v1::Directive::kRollback:
      w.BeginObject();
      w.Key("to_step");
      w.Uint(d.rollback().to_step());
      w.Key("checkpoint");
      w.String(d.rollback().checkpoint());
      w.Key("skip_batch_ids");
      ids(d.rollback().skip_batch_ids());
      w.Key("lr_scale");
      w.Double(d.rollback().lr_scale());
      w.EndObject();
      break;
    case v1::Directive::kScaleLr:
      w.BeginObject();
      w.Key("factor");
      w.Double(d.scale_lr().factor());
      w.EndObject();
      break;
    case v1::Directive::kStop:
      w.BeginObject();
      w.Key("checkpoint_first");
      w.Bool(d.stop().checkpoint_first());
      w.EndObject();
      break;
    case v1::Directive::ACTION_NOT_SET:
      break;
  }
  w.Key("applied_ranks");
  w.BeginArray();
  for (uint32_t r : record.applied_ranks()) w.Uint(r);
  w.EndArray();
  w.Key("transitions");
  w.BeginArray();
  for (const v1::DirectiveTransition& t : record.transitions()) {
    w.BeginObject();
    w.Key("state");
    w.String(t.state());
    w.Key("who");
    w.String(t.who());
    w.Key("unix_nanos");
    w.Int(t.unix_nanos());
    w.Key("why");
    w.String(t.why());
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
}

void WritePlan(JsonWriter& w, const RestartPlan& plan) {
  w.BeginObject();
  w.Key("run");
  w.String(plan.run);
  w.Key("spike_step");
  w.Uint(plan.spike_step);
  w.Key("restart_from_step");
  if (plan.restart_from_step.has_value()) {
    w.Uint(*plan.restart_from_step);
  } else {
    w.Null();
  }
  w.Key("checkpoint");
  w.String(plan.checkpoint);
  w.Key("skip_batch_ids");
  w.BeginArray();
  for (int64_t id : plan.skip_batch_ids) w.Int(id);
  w.EndArray();
  w.Key("outcome");
  w.String(plan.outcome);
  w.Key("batches_skipped");
  w.Bool(plan.batches_skipped);
  w.Key("why");
  w.String(plan.why);
  w.EndObject();
}

void WriteHealth(JsonWriter& w, const v1::GetRunHealthResponse& health) {
  const v1::WindowStats& win = health.window();
  w.BeginObject();
  w.Key("run");
  WriteRun(w, health.run());
  w.Key("window");
  w.BeginObject();
  w.Key("steps");
  w.Uint(win.steps());
  w.Key("grad_norm_p50");
  w.Double(win.grad_norm_p50());
  w.Key("grad_norm_p90");
  w.Double(win.grad_norm_p90());
  w.Key("grad_norm_p99");
  w.Double(win.grad_norm_p99());
  w.Key("clip_fraction");
  w.Double(win.clip_fraction());
  w.Key("skip_fraction");
  w.Double(win.skip_fraction());
  w.Key("baseline_grad_norm_median");
  w.Double(win.baseline_grad_norm_median());
  // 0: no crossing forecast.
  w.Key("max_attn_logit_forecast_step");
  w.Uint(win.max_attn_logit_forecast_step());
  w.Key("log_z_forecast_step");
  w.Uint(win.log_z_forecast_step());
  w.Key("step_seconds_median");
  w.Double(win.step_seconds_median());
  w.Key("step_seconds_max");
  w.Double(win.step_seconds_max());
  w.Key("straggler_lost_fraction");
  w.Double(win.straggler_lost_fraction());
  w.Key("data_wait_fraction");
  w.Double(win.data_wait_fraction());
  w.EndObject();
  w.Key("slowest_ranks");
  w.BeginArray();
  for (const v1::RankStepTime& r : health.slowest_ranks()) {
    w.BeginObject();
    w.Key("rank");
    w.Uint(r.rank());
    w.Key("host");
    w.String(r.host());
    w.Key("step_seconds");
    w.Double(r.step_seconds());
    w.Key("ratio_to_median");
    w.Double(r.ratio_to_median());
    w.EndObject();
  }
  w.EndArray();
  const v1::Goodput& g = health.goodput();
  w.Key("goodput");
  w.BeginObject();
  w.Key("ratio");
  w.Double(g.ratio());
  w.Key("wall_seconds");
  w.Double(g.wall_seconds());
  w.Key("productive_steps");
  w.Uint(g.productive_steps());
  w.Key("skipped_steps");
  w.Uint(g.skipped_steps());
  w.Key("rewound_steps");
  w.Uint(g.rewound_steps());
  w.Key("skipped_seconds");
  w.Double(g.skipped_seconds());
  w.Key("rewound_seconds");
  w.Double(g.rewound_seconds());
  w.Key("silent_seconds");
  w.Double(g.silent_seconds());
  w.EndObject();
  w.Key("recommended_max_norm");
  if (health.has_recommended_max_norm()) {
    w.Double(health.recommended_max_norm());
  } else {
    w.Null();
  }
  w.Key("active_alerts");
  w.BeginArray();
  for (const v1::Alert& a : health.active_alerts()) WriteAlert(w, a);
  w.EndArray();
  w.Key("spikes");
  w.BeginArray();
  for (const v1::Spike& spike : health.spikes()) WriteSpike(w, spike);
  w.EndArray();
  w.EndObject();
}

}  // namespace trainwatch::cli
