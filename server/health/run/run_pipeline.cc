#include "health/run/run_pipeline.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "health/alert_catalog.h"
#include "health/run/convert.h"

namespace trainwatch {
namespace {

uint64_t StreamSlot(uint32_t rank, uint32_t attempt) {
  return (uint64_t{rank} << 32) | attempt;
}

}  // namespace

RunPipeline::RunPipeline(std::string run_id, const HealthConfig& config,
                         RunObserver* observer, int64_t now_unix_nanos)
    : run_id_(std::move(run_id)),
      config_(config),
      observer_(observer),
      last_record_unix_nanos_(now_unix_nanos) {}

bool RunPipeline::KnowsStream(uint32_t rank, uint32_t attempt) const {
  return last_processed_.contains(StreamSlot(rank, attempt));
}

void RunPipeline::OnStreamStarted(uint32_t rank, uint32_t attempt,
                                  std::optional<uint64_t> last_stored_step) {
  auto [it, added] =
      last_processed_.try_emplace(StreamSlot(rank, attempt), last_stored_step);
  if (!added && last_stored_step.has_value()) {
    it->second = std::max(it->second.value_or(0), *last_stored_step);
  }
}

void RunPipeline::EnsureHealth(const v1::RunStart& start) {
  if (health_ != nullptr) return;
  health_ = std::make_unique<RunHealth>(
      InfoFrom(start), config_,
      [this](const AlertEpisode& e) { Report(e); },
      [this](const SpikeInfo& s) {
        observer_->OnSpike(s);
        // A hard batch has no restart plan and no replay to judge.
        if (s.kind == SpikeInfo::Kind::kHardBatch) return;
        OnSpikeVerdicts(health_->timing().OnSpike(s.step, s.batch_ids), s.step);
      });
  if (baseline_refs_ != nullptr) health_->SetBaselines(baseline_refs_);
}

void RunPipeline::SetBaselines(std::shared_ptr<const BaselineReferences> refs) {
  baseline_refs_ = std::move(refs);
  if (health_ != nullptr) health_->SetBaselines(baseline_refs_);
}

void RunPipeline::SetLead(const v1::RunStart& start) {
  EnsureHealth(start);
  health_->set_info(InfoFrom(start));
}

bool RunPipeline::CanLead(uint32_t rank) const {
  return rank == 0 || (health_ != nullptr &&
                       health_->rank_progress().AllMissingBelow(rank));
}

void RunPipeline::TakeLead(const v1::RunStart& start, int64_t now_unix_nanos) {
  if (lead_rank_ != kNoLead && start.rank() != lead_rank_) {
    // A lower rank took over: its windows hold its own records only.
    health_->ResetLead(last_step_, now_unix_nanos);
    health_attempt_.reset();
  }
  lead_rank_ = start.rank();
  lead_attempt_ = start.attempt();
  if (pending_.has_value() && pending_->start.rank() >= lead_rank_) pending_.reset();
  SetLead(start);
  observer_->OnLeadChanged(start);
}

void RunPipeline::PromotePending(int64_t now_unix_nanos) {
  PendingLead p = std::move(*pending_);
  pending_.reset();
  TakeLead(p.start, now_unix_nanos);
  if (p.records.empty()) return;
  const int64_t saved = now_unix_nanos_;
  for (const auto& [r, at] : p.records) {
    now_unix_nanos_ = at;
    LeadRecord(p.start.attempt(), r, at);
  }
  now_unix_nanos_ = saved;
  const v1::StepRecord& last = p.records.back().first;
  last_step_ = last.step();
  observer_->OnLeadBatchDone(last, now_unix_nanos);
  observer_->OnWindows(*health_);
}

void RunPipeline::LeadRecord(uint32_t attempt, const v1::StepRecord& r,
                             int64_t now_unix_nanos) {
  // A live record's input wait (not history's: replay feeds no timing).
  health_->timing().AddLeadWait(r);
  FeedLead(attempt, r, now_unix_nanos);
  OnSpikeVerdicts(health_->timing().OnLeadRecord(r, now_unix_nanos), r.step());
  observer_->OnLeadRecord(r);
}

void RunPipeline::Report(const AlertEpisode& e) {
  observer_->OnAlert(e.kind, ToProto(run_id_, e), e.update);
}

void RunPipeline::OnSpikeVerdicts(const std::vector<SpikeOutcome>& outcomes,
                                  uint64_t step) {
  for (const SpikeOutcome& o : outcomes) {
    observer_->OnSpikeOutcome(o);
    AlertTracker& tracker = health_->tracker();
    if (!o.recurred) {
      // The restart worked: the spike's alert is over.
      tracker.Resolve(AlertKind::kGradNormSpike, step);
      tracker.Resolve(AlertKind::kLossSpike, step);
      continue;
    }
    if (!o.optimizer_or_lr()) continue;
    // Recurred although its batches were skipped: not the data.
    for (AlertKind kind : {AlertKind::kGradNormSpike}) {
      if (!tracker.firing(kind)) continue;
      AlertText text = tracker.episode(kind).text;
      text.description += absl::StrFormat(
          "; it recurred at step %d after a restart that skipped batches of "
          "step %d: the cause is the optimizer state or the learning rate, "
          "not the data (restart earlier, lower the LR or Adam's beta2)",
          o.recurrence_step, o.spike_step);
      tracker.Amend(kind, std::move(text), v1::SEVERITY_CRITICAL);
    }
  }
}

void RunPipeline::FeedLead(uint32_t attempt, const v1::StepRecord& r,
                           int64_t now_unix_nanos) {
  RunHealth& h = *health_;
  if (health_attempt_ != attempt) {
    // A restart from a checkpoint: forget what came after its first step.
    if (health_attempt_.has_value() && h.last_step().has_value() &&
        r.step() <= *h.last_step()) {
      h.Rewind(r.step());
    }
    health_attempt_ = attempt;
  }
  h.OnLeadRecord(r, now_unix_nanos);
}

void RunPipeline::OnBatch(
    const v1::RunStart& start,
    const google::protobuf::RepeatedPtrField<v1::StepRecord>& records,
    uint64_t client_dropped, int64_t now_unix_nanos) {
  const uint32_t rank = start.rank(), attempt = start.attempt();
  // A duplicate or a step that went backwards (a resent batch) is skipped,
  // as the store skips it (docs/contracts.md, "Semantics").
  std::optional<uint64_t>& seen = last_processed_[StreamSlot(rank, attempt)];
  auto is_new = [&seen](const v1::StepRecord& r) {
    return !seen.has_value() || r.step() > *seen;
  };
  int first = 0;
  while (first < records.size() && !is_new(records[first])) ++first;
  if (first == records.size()) return;
  EnsureHealth(start);
  if (rank < lead_rank_ || (rank == lead_rank_ && attempt > lead_attempt_)) {
    if (CanLead(rank)) {
      TakeLead(start, now_unix_nanos);
    } else if (!pending_.has_value() || rank < pending_->start.rank() ||
               (rank == pending_->start.rank() &&
                attempt > pending_->start.attempt())) {
      // Waits for the lower ranks (rank 0 may arrive last).
      pending_ = PendingLead{.start = start};
    }
  }
  const bool lead = rank == lead_rank_ && attempt == lead_attempt_;
  PendingLead* pending =
      !lead && pending_.has_value() && pending_->start.rank() == rank &&
              pending_->start.attempt() == attempt
          ? &*pending_
          : nullptr;
  RunHealth& health = *health_;
  last_record_unix_nanos_ = now_unix_nanos;
  health.OnActivity(records[first].step());
  const v1::StepRecord* last = nullptr;
  size_t fresh = 0;
  now_unix_nanos_ = now_unix_nanos;
  for (int i = first; i < records.size(); ++i) {
    const v1::StepRecord& r = records[i];
    if (!is_new(r)) continue;
    seen = r.step();
    last = &r;
    ++fresh;
    health.OnRankRecord(rank, attempt, r, start.host(), now_unix_nanos);
    if (pending != nullptr) {
      pending->records.emplace_back(r, now_unix_nanos);
      continue;
    }
    if (lead) LeadRecord(attempt, r, now_unix_nanos);
  }
  observer_->OnRecordsAccepted(fresh, client_dropped);
  if (pending != nullptr &&
      pending->records.size() >= config_.ranks.max_pending_lead_records) {
    // Too long without the lower ranks to wait any longer.
    PromotePending(now_unix_nanos);
    return;
  }
  if (!lead) {
    // Other ranks' step times move the run's step-time figures.
    if (health.timing().step_times().ready()) observer_->OnWindows(health);
    return;
  }
  last_step_ = last->step();
  observer_->OnLeadBatchDone(*last, now_unix_nanos);
  observer_->OnWindows(health);
}

bool RunPipeline::OnEvent(uint32_t rank, uint32_t attempt,
                          const v1::RunEvent& event) {
  if (event.kind() != v1::RUN_FINISHED && event.kind() != v1::RUN_FAILED) {
    return false;
  }
  if (health_ != nullptr) {
    health_->OnActivity(event.step());
    health_->OnRankFinished(rank, attempt, now_unix_nanos_);
    if (has_lead()) {
      OnSpikeVerdicts(health_->timing().OnFinish(event.step()), event.step());
    }
  }
  return true;
}

void RunPipeline::CheckRanks(int64_t now_unix_nanos) {
  if (health_ == nullptr) return;
  now_unix_nanos_ = now_unix_nanos;
  health_->DeclareMissingRanks(now_unix_nanos);
  if (pending_.has_value() && pending_->start.rank() < lead_rank_ &&
      CanLead(pending_->start.rank())) {
    PromotePending(now_unix_nanos);
  }
  if (health_->timing().step_times().ready()) observer_->OnWindows(*health_);
}

void RunPipeline::OnTick(int64_t now_unix_nanos) {
  if (!has_lead()) return;
  health_->OnTick(now_unix_nanos, last_record_unix_nanos_, last_step_);
}

void RunPipeline::ResolveAll(int64_t now_unix_nanos) {
  if (health_ == nullptr) return;
  AlertTracker& tracker = health_->tracker();
  tracker.SetNow(now_unix_nanos);
  for (const AlertSpec& spec : AllAlertSpecs()) {
    tracker.Resolve(spec.kind, last_step_);
  }
}

void RunPipeline::Recover(const v1::RunStart& lead, uint64_t last_step) {
  last_step_ = last_step;
  lead_rank_ = lead.rank();
  lead_attempt_ = lead.attempt();
  SetLead(lead);
}

void RunPipeline::RestoreAlert(const v1::Alert& firing) {
  health_->tracker().Restore(FromProto(firing));
}

void RunPipeline::BeginReplay() { health_->tracker().set_muted(true); }

void RunPipeline::Replay(uint32_t attempt, const v1::StepRecord& record,
                         int64_t now_unix_nanos) {
  if (attempt > lead_attempt_) return;
  FeedLead(attempt, record, now_unix_nanos);
}

void RunPipeline::EndReplay() {
  health_->tracker().set_muted(false);
  observer_->OnWindows(*health_);
}

HealthSnapshot RunPipeline::Snapshot() const {
  HealthSnapshot snap;
  // W, so that `trainwatchctl health` can say how far the baseline is.
  snap.window.set_window_size(config_.window_steps);
  snap.window.set_clip_fraction_threshold(config_.clip_fraction.threshold);
  if (health_ == nullptr) return snap;
  const RunHealth& h = *health_;
  const RunWindow& w = h.window();
  v1::WindowStats& ws = snap.window;
  ws.set_steps(static_cast<uint32_t>(w.grad_norm.slots()));
  if (w.grad_norm.ranked() > 0) {
    ws.set_grad_norm_p50(*w.grad_norm.Quantile(0.5));
    ws.set_grad_norm_p90(*w.grad_norm.Quantile(0.9));
    ws.set_grad_norm_p99(*w.grad_norm.Quantile(0.99));
  }
  ws.set_clip_fraction(w.clipped.fraction());
  ws.set_skip_fraction(w.skipped.fraction());
  if (h.baselines().grad_norm_median.has_value()) {
    ws.set_baseline_grad_norm_median(*h.baselines().grad_norm_median);
  }
  const Trends& t = h.trends();
  if (auto at = t.max_attn_logit.StepReaching(config_.attention.cap)) {
    ws.set_max_attn_logit_forecast_step(*at);
  }
  if (const std::optional<double> log_z = h.LogZBaseline()) {
    if (auto at = OutwardCrossing(t.log_z, *log_z, config_.log_z.nats)) {
      ws.set_log_z_forecast_step(*at);
    }
  }
  for (const AlertSpec& spec : AllAlertSpecs()) {
    const AlertEpisode& e = h.tracker().episode(spec.kind);
    if (e.firing) snap.active_alerts.push_back(ToProto(run_id_, e));
  }
  snap.recommended_max_norm = h.RecommendedMaxNorm();
  h.timing().FillHealth(&ws, &snap.timing);
  return snap;
}

}  // namespace trainwatch
