#include "proto_convert.h"

#include <algorithm>
#include <cmath>
#include <variant>

#include "trainwatch/step_fields.h"

namespace trainwatch::internal {
namespace {

v1::Precision ToProto(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return v1::FP32;
    case Precision::kBf16:
      return v1::BF16;
    case Precision::kFp16:
      return v1::FP16;
    case Precision::kUnspecified:
      break;
  }
  return v1::PRECISION_UNSPECIFIED;
}

v1::EventKind ToProto(EventKind kind) {
  switch (kind) {
    case EventKind::kCheckpointSaved:
      return v1::CHECKPOINT_SAVED;
    case EventKind::kRunFinished:
      return v1::RUN_FINISHED;
    case EventKind::kRunFailed:
      return v1::RUN_FAILED;
  }
  return v1::EVENT_KIND_UNSPECIFIED;
}

// clip_grad_norm_ divides by (norm + 1e-6) so a zero norm does not divide by 0.
constexpr double kClipEpsilon = 1e-6;

}  // namespace

static_assert(static_cast<int>(MoeBalancing::kAuxFreeBias) == v1::AUX_FREE_BIAS &&
                  static_cast<int>(MoeBalancing::kNone) == v1::NO_BALANCING,
              "MoeBalancing follows the proto's MoeBalancing");

v1::RunStart MakeRunStart(const ClientOptions& options) {
  v1::RunStart start;
  start.set_run_id(options.run_id);
  start.set_rank(options.rank);
  start.set_world_size(options.world_size);
  start.set_attempt(options.attempt);
  start.set_precision(ToProto(options.precision));
  start.set_max_norm(options.max_norm);
  start.set_warmup_steps(options.warmup_steps);
  start.set_scaler_growth_interval(options.scaler_growth_interval);
  if (options.adam_eps) start.set_adam_eps(*options.adam_eps);
  if (options.adam_beta2) start.set_adam_beta2(*options.adam_beta2);
  start.mutable_labels()->insert(options.labels.begin(), options.labels.end());
  start.set_host(options.host);
  if (options.moe) {
    v1::MoeConfig& moe = *start.mutable_moe();
    moe.set_num_experts(options.moe->num_experts);
    moe.set_top_k(options.moe->top_k);
    moe.set_ep_size(options.moe->ep_size);
    moe.set_balancing(static_cast<v1::MoeBalancing>(options.moe->balancing));
    moe.set_aux_loss_coeff(options.moe->aux_loss_coeff);
    moe.set_z_loss_coeff(options.moe->z_loss_coeff);
    moe.set_bias_update_rate(options.moe->bias_update_rate);
    moe.set_capacity_factor(options.moe->capacity_factor);
  }
  return start;
}

void DeriveClipping(double max_norm, v1::StepRecord* record) {
  if (max_norm <= 0) return;
  const double norm = record->grad_norm();
  if (!record->has_clipped()) {
    // +Inf is clipped (to zero); NaN compares false: clip_grad_norm_ turns it
    // into a NaN coefficient, which scales nothing down.
    record->set_clipped(norm > max_norm);
  }
  if (!record->has_clip_coef()) {
    if (std::isfinite(norm)) {
      record->set_clip_coef(std::min(1.0, max_norm / (norm + kClipEpsilon)));
    } else if (norm > 0) {
      record->set_clip_coef(0.0);  // max_norm / +Inf
    }  // NaN: no meaningful coefficient, leave it absent.
  }
}

void FillStepRecord(const Step& step, double max_norm, v1::StepRecord* out) {
  out->set_step(step.step);
  out->set_grad_norm(step.grad_norm);
  if (step.clipped) out->set_clipped(*step.clipped);
#define TW_SET(name) \
  if (step.name) out->set_##name(*step.name);
  TRAINWATCH_STEP_OPTIONAL_DOUBLES(TW_SET)
#undef TW_SET
  out->set_skipped(step.skipped);
  out->set_time_unix_nanos(step.time_unix_nanos);
  out->mutable_batch_ids()->Add(step.batch_ids.begin(), step.batch_ids.end());
  for (const auto& [layer, stat] : step.layer_stats) {
    v1::LayerStats& proto = (*out->mutable_layer_stats())[layer];
    proto.set_grad_norm(stat.grad_norm);
    proto.set_grad_rms(stat.grad_rms);
    proto.set_g_over_sqrt_v_rms(stat.g_over_sqrt_v_rms);
    if (stat.update_rms_ratio) proto.set_update_rms_ratio(*stat.update_rms_ratio);
    if (stat.kind != LayerKind::kUnspecified) {
      proto.set_kind(static_cast<v1::LayerKind>(stat.kind));
    }
  }
  for (const auto& [tensor, stat] : step.fp8) {
    v1::Fp8TensorStats& proto = (*out->mutable_fp8())[tensor];
    proto.set_format(static_cast<v1::Fp8Format>(stat.format));
    proto.set_amax(stat.amax);
    proto.set_scale(stat.scale);
    proto.set_amax_history_len(stat.amax_history_len);
    proto.set_margin(stat.margin);
    if (stat.overflow_fraction) proto.set_overflow_fraction(*stat.overflow_fraction);
    if (stat.underflow_fraction) proto.set_underflow_fraction(*stat.underflow_fraction);
    proto.set_amax_group(stat.amax_group);
  }
  for (const MoeLayerStat& stat : step.moe) {
    v1::MoeLayerStats& proto = *out->mutable_moe()->add_layers();
    proto.set_layer(stat.layer);
    proto.mutable_tokens_per_expert()->Add(stat.tokens_per_expert.begin(),
                                           stat.tokens_per_expert.end());
    if (stat.dropped) proto.set_dropped(*stat.dropped);
    if (stat.aux_loss) proto.set_aux_loss(*stat.aux_loss);
    if (stat.z_loss) proto.set_z_loss(*stat.z_loss);
    proto.mutable_expert_bias()->Add(stat.expert_bias.begin(), stat.expert_bias.end());
    if (stat.router_logit_max) proto.set_router_logit_max(*stat.router_logit_max);
  }
  DeriveClipping(max_norm, out);
}

void AddStepRecord(QueueItem&& item, double max_norm, v1::StepBatch* batch) {
  if (auto* record = std::get_if<std::unique_ptr<v1::StepRecord>>(&item)) {
    v1::StepRecord* added = record->release();
    batch->mutable_records()->AddAllocated(added);
    DeriveClipping(max_norm, added);
    return;
  }
  FillStepRecord(std::get<Step>(item), max_norm, batch->add_records());
}

void FillRunEvent(const EventItem& event, v1::RunEvent* out) {
  out->set_step(event.step);
  out->set_kind(ToProto(event.kind));
  out->set_detail(event.detail);
  out->set_time_unix_nanos(event.time_unix_nanos);
}

}  // namespace trainwatch::internal
