#include "proto_convert.h"

#include <algorithm>
#include <cmath>
#include <variant>

#include "field_convert.h"
#include "trainwatch/run_start.h"
#include "trainwatch/run_start_fields.h"
#include "trainwatch/step_fields.h"
#include "trainwatch/v1/clipping.h"

namespace trainwatch::internal {

// The client's enum classes carry the proto's values (ToWireValue casts).
static_assert(static_cast<int>(Precision::kFp32) == v1::FP32 &&
                  static_cast<int>(Precision::kBf16) == v1::BF16 &&
                  static_cast<int>(Precision::kFp16) == v1::FP16,
              "Precision follows the proto's Precision");
static_assert(static_cast<int>(MoeBalancing::kAuxFreeBias) == v1::AUX_FREE_BIAS &&
                  static_cast<int>(MoeBalancing::kNone) == v1::NO_BALANCING,
              "MoeBalancing follows the proto's MoeBalancing");
static_assert(static_cast<int>(LayerKind::kNorm) == v1::NORM &&
                  static_cast<int>(LayerKind::kRouter) == v1::ROUTER,
              "LayerKind follows the proto's LayerKind");
static_assert(static_cast<int>(Fp8Format::kE4M3) == v1::E4M3 &&
                  static_cast<int>(Fp8Format::kE5M2Fnuz) == v1::E5M2_FNUZ,
              "Fp8Format follows the proto's Fp8Format");

// Each struct's conversion both ways, from its table (field_convert.h);
// the sub-messages before the messages that hold them.
void ToWire(const LayerStat& in, v1::LayerStats* out) {
  TW_APPLY(TRAINWATCH_LAYER_STAT_FIELDS, TW_TO_WIRE)
}
void FromWire(const v1::LayerStats& in, LayerStat* out) {
  TW_APPLY(TRAINWATCH_LAYER_STAT_FIELDS, TW_FROM_WIRE)
}
void ToWire(const Fp8Stat& in, v1::Fp8TensorStats* out) {
  TW_APPLY(TRAINWATCH_FP8_STAT_FIELDS, TW_TO_WIRE)
}
void FromWire(const v1::Fp8TensorStats& in, Fp8Stat* out) {
  TW_APPLY(TRAINWATCH_FP8_STAT_FIELDS, TW_FROM_WIRE)
}
void ToWire(const MoeLayerStat& in, v1::MoeLayerStats* out) {
  TW_APPLY(TRAINWATCH_MOE_LAYER_STAT_FIELDS, TW_TO_WIRE)
}
void FromWire(const v1::MoeLayerStats& in, MoeLayerStat* out) {
  TW_APPLY(TRAINWATCH_MOE_LAYER_STAT_FIELDS, TW_FROM_WIRE)
}
void ToWire(const Step& in, v1::StepRecord* out) {
  TW_APPLY(TRAINWATCH_STEP_FIELDS, TW_TO_WIRE)
}
void FromWire(const v1::StepRecord& in, Step* out) {
  TW_APPLY(TRAINWATCH_STEP_FIELDS, TW_FROM_WIRE)
}
void ToWire(const MoeConfig& in, v1::MoeConfig* out) {
  TW_APPLY(TRAINWATCH_MOE_CONFIG_FIELDS, TW_TO_WIRE)
}
void FromWire(const v1::MoeConfig& in, MoeConfig* out) {
  TW_APPLY(TRAINWATCH_MOE_CONFIG_FIELDS, TW_FROM_WIRE)
}
void ToWire(const BaselineRef& in, v1::BaselineRef* out) {
  TW_APPLY(TRAINWATCH_BASELINE_REF_FIELDS, TW_TO_WIRE)
}

void FromWire(const v1::BaselineRef& in, BaselineRef* out) {
  TW_APPLY(TRAINWATCH_BASELINE_REF_FIELDS, TW_FROM_WIRE)
}

void ToWire(const ClientOptions& in, v1::RunStart* out) {
  TW_APPLY(TRAINWATCH_RUN_START_FIELDS, TW_TO_WIRE)
}
void FromWire(const v1::RunStart& in, ClientOptions* out) {
  TW_APPLY(TRAINWATCH_RUN_START_FIELDS, TW_FROM_WIRE)
}

namespace {

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

}  // namespace

void DeriveClipping(double max_norm, v1::StepRecord* record) {
  if (max_norm <= 0) return;
  const double norm = record->grad_norm();
  if (!record->has_clipped()) {
    // +Inf is clipped (to zero); NaN is not: clip_grad_norm_ turns it into
    // a NaN coefficient, which scales nothing down.
    record->set_clipped(v1::ClippedAt(max_norm, norm));
  }
  if (!record->has_clip_coef()) {
    if (std::isfinite(norm)) {
      record->set_clip_coef(v1::ClipCoef(max_norm, norm));
    } else if (norm > 0) {
      record->set_clip_coef(0.0);  // max_norm / +Inf
    }  // NaN: no meaningful coefficient, leave it absent.
  }
}

void FillStepRecord(const Step& step, double max_norm, v1::StepRecord* out) {
  ToWire(step, out);
  DeriveClipping(max_norm, out);
}

Step StepFromRecord(const v1::StepRecord& record) {
  Step step;
  FromWire(record, &step);
  return step;
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

namespace trainwatch {

v1::RunStart MakeRunStart(const ClientOptions& options) {
  v1::RunStart start;
  internal::ToWire(options, &start);
  return start;
}

void ApplyRunStart(const v1::RunStart& start, ClientOptions* options) {
  internal::FromWire(start, options);
  if (options->world_size == 0) options->world_size = 1;
}

}  // namespace trainwatch
