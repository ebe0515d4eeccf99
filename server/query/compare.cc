// Reference runs over the query API (docs/baselines.md): `trainwatchctl
// baseline set|show|clear` and `compare`. A comparison reads the run and its
// references from the store on the query thread and runs the band the
// BaselineDeviation detector runs (health/signals/baseline_band.h), so the
// table, the report and the alert agree.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/validate.h"
#include "engine/baseline_loader.h"
#include "query/query.h"

namespace trainwatch {

namespace {

absl::Status ValidateRefs(const google::protobuf::RepeatedPtrField<v1::BaselineRef>& refs) {
  if (static_cast<size_t>(refs.size()) > kMaxBaselines) {
    return absl::InvalidArgumentError(
        absl::StrCat(refs.size(), " baselines: at most ", kMaxBaselines));
  }
  for (const v1::BaselineRef& ref : refs) {
    if (absl::Status s = ValidateRunId(ref.run()); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("baseline: ", s.message()));
    }
  }
  return absl::OkStatus();
}

// What the run is judged against now: its lead's RunStart resolved by the
// engine (a run not stored yet: only a set, or none).
std::pair<std::vector<v1::BaselineRef>, std::string> Resolve(const Store& store, Engine& engine,
                                                             const std::string& run_id) {
  absl::StatusOr<v1::RunStart> lead = store.GetLeadStart(run_id);
  v1::RunStart start;
  if (lead.ok()) {
    start = *std::move(lead);
  } else {
    start.set_run_id(run_id);
  }
  return engine.ResolveBaselines(start);
}

}  // namespace

absl::StatusOr<v1::BaselinesResponse> Query::SetBaselines(
    const v1::SetBaselinesRequest& request) const {
  if (absl::Status s = ValidateRunId(request.run_id()); !s.ok()) return s;
  if (absl::Status s = ValidateRefs(request.baselines()); !s.ok()) return s;
  for (const v1::BaselineRef& ref : request.baselines()) {
    if (ref.run() == request.run_id()) {
      absl::StatusOr<v1::RunStart> lead = store_->GetLeadStart(request.run_id());
      if (lead.ok() && ref.attempt() >= lead->attempt()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "run ", ref.run(), "@", ref.attempt(), " is not an earlier attempt of itself"));
      }
    }
  }
  if (absl::Status s = engine_->SetBaselines(
          request.run_id(), {request.baselines().begin(), request.baselines().end()});
      !s.ok()) {
    return s;
  }
  v1::GetBaselinesRequest get;
  get.set_run_id(request.run_id());
  return GetBaselines(get);
}

absl::StatusOr<v1::BaselinesResponse> Query::GetBaselines(
    const v1::GetBaselinesRequest& request) const {
  if (absl::Status s = ValidateRunId(request.run_id()); !s.ok()) return s;
  auto [refs, source] = Resolve(*store_, *engine_, request.run_id());
  v1::BaselinesResponse out;
  out.set_run_id(request.run_id());
  for (v1::BaselineRef& ref : refs) *out.add_baselines() = std::move(ref);
  out.set_source(source);
  return out;
}

absl::StatusOr<v1::CompareRunsResponse> Query::CompareRuns(
    const v1::CompareRunsRequest& request) const {
  if (absl::Status s = ValidateRunId(request.run_id()); !s.ok()) return s;
  if (absl::Status s = ValidateRefs(request.refs()); !s.ok()) return s;
  const std::optional<BaselineMetric> metric =
      BaselineMetricByName(request.metric().empty() ? "loss" : request.metric());
  if (!metric.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metric \"", request.metric(), "\": loss, grad_norm, log_z or max_attn_logit"));
  }
  std::optional<BaselineAxis> wanted;
  if (request.axis() == "step") {
    wanted = BaselineAxis::kStep;
  } else if (request.axis() == "tokens") {
    wanted = BaselineAxis::kTokens;
  } else if (!request.axis().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("axis \"", request.axis(), "\": tokens or step"));
  }
  absl::StatusOr<v1::RunStart> lead = store_->GetLeadStart(request.run_id());
  if (!lead.ok()) return lead.status();
  std::vector<v1::BaselineRef> refs(request.refs().begin(), request.refs().end());
  std::string source = "request";
  if (refs.empty()) std::tie(refs, source) = engine_->ResolveBaselines(*lead);
  if (refs.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run ", request.run_id(), " has no baselines: name them (--ref RUN@ATTEMPT) or "
        "set them (trainwatchctl baseline set)"));
  }
  absl::StatusOr<std::shared_ptr<const BaselineReferences>> loaded =
      ReadReferences(*store_, refs, source);
  if (!loaded.ok()) return loaded.status();
  if (*loaded == nullptr) {
    return absl::NotFoundError("none of the baselines is stored (run@attempt)");
  }
  // The run's lead attempt, from its warmup on.
  std::vector<v1::StepRecord> records;
  absl::Status read = store_->ReadSteps(
      request.run_id(), lead->warmup_steps(), 0, lead->rank(), kRecordsPerMessage,
      [&](v1::StepRecords& chunk) {
        for (v1::StepRecords::Item& item : *chunk.mutable_items()) {
          if (item.attempt() == lead->attempt()) records.push_back(std::move(*item.mutable_record()));
        }
        return true;
      });
  if (!read.ok()) return read;

  v1::CompareRunsResponse out;
  out.set_run_id(request.run_id());
  out.set_attempt(lead->attempt());
  for (const ReferenceRun& r : (*loaded)->runs) *out.add_refs() = r.ref;
  out.set_metric(std::string(BaselineMetricName(*metric)));
  if (records.empty()) return out;
  const BaselineAxis axis = ChooseAxis(records.front(), **loaded, wanted);
  if (wanted == BaselineAxis::kTokens && axis != BaselineAxis::kTokens) {
    return absl::FailedPreconditionError(
        "--axis tokens: the run or a baseline has records without tokens");
  }
  out.set_axis(std::string(BaselineAxisName(axis)));
  BaselineBand band(*metric, axis, *loaded, lead->warmup_steps());
  ResidualCusum cusum(engine_->health_config().change.arl0, BandOptions{}.bin_steps);
  std::vector<double> widths;
  for (const v1::StepRecord& r : records) {
    const std::optional<BandBin> b = band.Add(r);
    if (!b.has_value()) continue;
    v1::CompareBin& bin = *out.add_bins();
    bin.set_x(b->x);
    bin.set_first_step(b->first_step);
    bin.set_last_step(b->last_step);
    bin.set_value(BaselineUnits(*metric, b->value));
    bin.set_ref_median(BaselineUnits(*metric, b->ref_median));
    bin.set_lo(BaselineUnits(*metric, b->lo));
    bin.set_hi(BaselineUnits(*metric, b->hi));
    bin.set_z(b->z);
    if (std::isfinite(b->lr_ratio)) bin.set_lr_ratio(b->lr_ratio);
    widths.push_back(b->half_width);
    const ResidualCusum::Verdict v = cusum.Add(*b);
    if ((v.worse || v.better) && !out.left_band()) {
      out.set_left_band(true);
      out.set_first_step_outside(v.onset_step);
    }
  }
  if (!widths.empty()) {
    std::nth_element(widths.begin(), widths.begin() + widths.size() / 2, widths.end());
    out.set_band_half_width(widths[widths.size() / 2]);
  }
  return out;
}

}  // namespace trainwatch
