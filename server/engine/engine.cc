#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <limits>
#include <map>
#include <optional>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/alert_catalog.h"
#include "engine/convert.h"
#include "engine/run_health.h"

namespace trainwatch {

// Per-run state. `finished` and `finished_unix_nanos` are guarded by
// Engine::mu_; everything else is touched only by the run's shard thread (or
// by Create before serving, or by ForgetFinishedRuns once nothing else holds
// the run).
struct RunState {
  std::string run_id;
  std::unique_ptr<RunMetrics> metrics;
  bool finished = false;
  int64_t finished_unix_nanos = 0;  // server clock
  // The lead stream (DESIGN.md §3): lowest rank, latest attempt of it.
  uint32_t lead_rank = std::numeric_limits<uint32_t>::max();
  uint32_t lead_attempt = 0;
  // The attempt whose records the health last took in.
  std::optional<uint32_t> health_attempt;
  std::unique_ptr<RunHealth> health;
  int64_t last_record_unix_nanos = 0;  // server clock
  uint64_t last_step = 0;
  // The lead stream's RunStart labels, sent with every notification.
  std::map<std::string, std::string> labels;
  // Per stream (rank << 32 | attempt): the first step not yet processed.
  // Absent until the engine knows where the stream resumes.
  absl::flat_hash_map<uint64_t, uint64_t> next_step;
};

namespace {
uint64_t StreamSlot(const StreamKey& key) {
  return (uint64_t{key.rank} << 32) | key.attempt;
}
}  // namespace

Engine::Engine(EngineOptions options, Store* store, Metrics* metrics,
               const Clock* clock)
    : options_(std::move(options)),
      store_(store),
      metrics_(metrics),
      clock_(clock) {
  size_t n = options_.shards == 0 ? 1 : options_.shards;
  for (size_t i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>());
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options,
                                                       Store* store,
                                                       Metrics* metrics,
                                                       const Clock* clock) {
  std::unique_ptr<Engine> engine(
      new Engine(std::move(options), store, metrics, clock));
  absl::StatusOr<std::vector<v1::RunSummary>> runs = store->ListRuns();
  if (!runs.ok()) return runs.status();
  if (absl::Status s = engine->ResolveAlertsOfFinishedRuns(*runs); !s.ok()) {
    return s;
  }
  for (const v1::RunSummary& summary : *runs) {
    if (summary.state() != "running") continue;
    std::shared_ptr<RunState> run;
    {
      std::lock_guard<std::mutex> lock(engine->mu_);
      bool added = false;
      run = engine->FindOrAddRunLocked(summary.run_id(), &added);
    }
    // No shard touches the run yet: rebuilding here, before serving, is safe.
    if (absl::Status s = engine->Rebuild(*run, summary); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("rebuilding run ",
                                                 summary.run_id(), ": ",
                                                 s.message()));
    }
  }
  if (engine->options_.silence_check_interval.count() > 0) {
    engine->silence_thread_ = std::thread([e = engine.get()] { e->SilenceLoop(); });
  }
  return engine;
}

Engine::~Engine() { Stop(); }

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (silence_thread_.joinable()) silence_thread_.join();
  for (auto& shard : shards_) shard->Stop();
}

Shard* Engine::ShardFor(const std::string& run_id) {
  return shards_[absl::HashOf(run_id) % shards_.size()].get();
}

std::shared_ptr<RunState> Engine::FindOrAddRunLocked(const std::string& run_id,
                                                     bool* added) {
  auto it = runs_.find(run_id);
  if (it != runs_.end()) {
    *added = false;
    if (it->second->finished) {
      it->second->finished = false;
      it->second->metrics->finished.Set(0);
      ++active_runs_;
    }
    return it->second;
  }
  auto run = std::make_shared<RunState>();
  run->run_id = run_id;
  run->metrics = metrics_->AddRun(run_id, AlertLabels());
  run->last_record_unix_nanos = clock_->NowUnixNanos();
  runs_.emplace(run_id, run);
  ++active_runs_;
  metrics_->runs_active.Set(static_cast<double>(active_runs_));
  *added = true;
  return run;
}

void Engine::EnsureHealth(RunState& run, const v1::RunStart& start) {
  run.labels = std::map<std::string, std::string>(start.labels().begin(),
                                                  start.labels().end());
  if (run.health != nullptr) {
    run.health->set_info(InfoFrom(start));
    return;
  }
  RunState* r = &run;
  run.health = std::make_unique<RunHealth>(
      InfoFrom(start), options_.health,
      [this, r](const AlertEpisode& e) {
        v1::Alert alert = ToProto(r->run_id, e);
        size_t i = static_cast<size_t>(e.kind);
        r->metrics->alert_active[i].Set(e.firing ? 1 : 0);
        if (e.firing) r->metrics->alerts_fired[i].Get().Increment();
        // Only enqueues: the notifier's threads do the network.
        if (options_.notifier != nullptr) {
          options_.notifier->Notify(ToNotice(alert, r->labels));
        }
        store_->Submit(WriteOp{.kind = WriteOp::Kind::kAlert,
                               .key = {r->run_id, 0, 0},
                               .alert = std::move(alert)});
      },
      [this, r](const SpikeInfo& s) {
        v1::Spike spike;
        spike.set_step(s.step);
        spike.set_grad_norm(s.grad_norm);
        spike.set_ratio_to_ema(s.ratio_to_ema);
        spike.set_sigmas(s.sigmas);
        spike.mutable_batch_ids()->Add(s.batch_ids.begin(), s.batch_ids.end());
        store_->Submit(WriteOp{.kind = WriteOp::Kind::kSpike,
                               .key = {r->run_id, 0, 0},
                               .spike = std::move(spike)});
      });
}

absl::Status Engine::Rebuild(RunState& run, const v1::RunSummary& summary) {
  RunMetrics& m = *run.metrics;
  m.last_step.Set(static_cast<double>(summary.last_step()));
  m.last_step_timestamp.Set(static_cast<double>(summary.last_seen_unix_nanos()) * 1e-9);
  if (summary.max_norm() > 0) m.clip_threshold.Set(summary.max_norm());
  run.last_step = summary.last_step();

  absl::StatusOr<v1::RunStart> start = store_->GetLeadStart(summary.run_id());
  if (!start.ok()) return start.status();
  run.lead_rank = start->rank();
  run.lead_attempt = start->attempt();
  EnsureHealth(run, *start);
  absl::StatusOr<std::vector<v1::Alert>> firing =
      store_->ListAlerts(summary.run_id(), /*active_only=*/true);
  if (!firing.ok()) return firing.status();
  for (const v1::Alert& a : *firing) {
    if (!AlertKindByName(a.alertname()).has_value()) continue;
    AlertEpisode e = FromProto(a);
    run.health->tracker().Restore(e);
    m.alert_active[static_cast<size_t>(e.kind)].Set(1);
    // Alertmanager forgets an alert that is not re-sent (endsAt passes):
    // keep re-sending what was firing when the server stopped.
    if (options_.notifier != nullptr) {
      options_.notifier->Restore(ToNotice(a, run.labels));
    }
  }
  // Replay history muted: the first W post-warmup steps give the baselines,
  // the last 2W steps the windows and the EMA. Alerts already stored as
  // firing stay firing; nothing fires again.
  run.health->tracker().set_muted(true);
  const uint64_t w = options_.health.window_steps;
  const uint64_t baseline_end = start->warmup_steps() + w;
  const uint64_t tail_from = summary.last_step() > 2 * w ? summary.last_step() - 2 * w : 0;
  auto feed = [&](v1::StepRecords& chunk) {
    for (const v1::StepRecords::Item& item : chunk.items()) {
      if (item.attempt() > run.lead_attempt) continue;
      FeedLead(run, item.attempt(), item.record());
    }
    return true;
  };
  absl::Status s = store_->ReadSteps(summary.run_id(), 0, baseline_end,
                                     run.lead_rank, 4096, feed);
  if (s.ok() && tail_from > baseline_end) {
    s = store_->ReadSteps(summary.run_id(), tail_from, 0, run.lead_rank, 4096, feed);
  } else if (s.ok()) {
    s = store_->ReadSteps(summary.run_id(), baseline_end + 1, 0, run.lead_rank, 4096, feed);
  }
  run.health->tracker().set_muted(false);
  if (!s.ok()) return s;
  UpdateWindowMetrics(run);
  return absl::OkStatus();
}

absl::StatusOr<StreamHandle> Engine::OpenStream(const v1::RunStart& start,
                                                DoneCallback done) {
  auto stream = std::make_shared<Stream>();
  stream->key = StreamKey{start.run_id(), start.rank(), start.attempt()};
  stream->start = start;
  stream->shard = ShardFor(start.run_id());
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(start.run_id());
    bool known_active = it != runs_.end() && !it->second->finished;
    if (!known_active && active_runs_ >= options_.max_active_runs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this server already monitors ", active_runs_,
          " active runs (the limit); finish old runs or use another server"));
    }
    bool added = false;
    stream->run = FindOrAddRunLocked(start.run_id(), &added);
    metrics_->runs_active.Set(static_cast<double>(active_runs_));
  }
  StreamHandle handle(std::move(stream));
  store_->Submit(WriteOp{
      .kind = WriteOp::Kind::kStart,
      .key = handle->key,
      .start = start,
      .received_unix_nanos = clock_->NowUnixNanos(),
      .done = [this, handle, done = std::move(done)](WriteResult r) {
        absl::Status status = r.status;
        handle->shard->Post([this, handle, r = std::move(r)] {
          OnStartCommitted(*handle, r);
        });
        done(status);
      }});
  return handle;
}

void Engine::RunInOrder(const StreamHandle& stream,
                        std::function<void(absl::Status)> work) {
  stream->shard->Post([this, stream, work = std::move(work)]() mutable {
    const std::optional<absl::Status>& started = stream->start_result;
    const bool known = stream->run->next_step.contains(StreamSlot(stream->key));
    if (!stream->held.empty() || (!known && !started.has_value())) {
      stream->held.push_back(std::move(work));
    } else {
      work(started.has_value() ? *started : absl::OkStatus());
    }
  });
}

void Engine::OnStartCommitted(const Stream& stream, const WriteResult& result) {
  stream.start_result = result.status;
  if (result.status.ok()) {
    // The store can only be behind what this engine processed (records are
    // processed before their commit), so keep the larger.
    const uint64_t resume = result.last_step.has_value() ? *result.last_step + 1 : 0;
    auto [it, added] =
        stream.run->next_step.try_emplace(StreamSlot(stream.key), resume);
    if (!added) it->second = std::max(it->second, resume);
  }
  std::vector<std::function<void(absl::Status)>> held = std::move(stream.held);
  stream.held.clear();
  for (auto& work : held) work(result.status);
}

void Engine::SubmitBatch(const StreamHandle& stream, v1::StepBatch batch,
                         DoneCallback done, std::function<void()> processed) {
  WriteOp op{.kind = WriteOp::Kind::kBatch,
             .key = stream->key,
             .received_unix_nanos = clock_->NowUnixNanos()};
  op.records.assign(std::make_move_iterator(batch.mutable_records()->begin()),
                    std::make_move_iterator(batch.mutable_records()->end()));
  const uint64_t dropped = batch.dropped();
  op.done = [done = std::move(done)](WriteResult r) { done(r.status); };
  RunInOrder(stream, [this, stream, dropped, op = std::move(op),
                      processed = std::move(processed)](absl::Status started) mutable {
    if (started.ok()) ProcessRecords(*stream->run, *stream, op.records, dropped);
    if (processed) processed();
    if (!started.ok()) {
      op.done(WriteResult{.status = started});
      return;
    }
    store_->Submit(std::move(op));
  });
}

void Engine::SubmitEvent(const StreamHandle& stream, v1::RunEvent event,
                         DoneCallback done) {
  // Through the shard, so the store sees the stream's messages in order (an
  // event's ack must not overtake an earlier batch's commit).
  RunInOrder(stream, [this, stream, event = std::move(event),
                      done = std::move(done)](absl::Status started) mutable {
    if (!started.ok()) {
      done(started);
      return;
    }
    WriteOp op{.kind = WriteOp::Kind::kEvent,
               .key = stream->key,
               .event = event,
               .received_unix_nanos = clock_->NowUnixNanos()};
    op.done = [this, stream, event = std::move(event),
               done = std::move(done)](WriteResult r) {
      if (!r.status.ok()) {
        done(r.status);
        return;
      }
      stream->shard->Post([this, stream, event, done] {
        ProcessEvent(*stream->run, event);
        done(absl::OkStatus());
      });
    };
    store_->Submit(std::move(op));
  });
}

void Engine::CloseStream(const StreamHandle& stream) {
  // trainwatch_streams_active is counted by ingest, which sees every Report
  // stream (also those that end before their RunStart).
}

void Engine::FeedLead(RunState& run, uint32_t attempt, const v1::StepRecord& r) {
  RunHealth& h = *run.health;
  if (run.health_attempt != attempt) {
    // A restart from a checkpoint: forget what came after its first step.
    if (run.health_attempt.has_value() && h.last_step().has_value() &&
        r.step() <= *h.last_step()) {
      h.Rewind(r.step());
    }
    run.health_attempt = attempt;
  }
  h.OnLeadRecord(r, clock_->NowUnixNanos());
}

void Engine::ProcessRecords(RunState& run, const Stream& stream,
                            const std::vector<v1::StepRecord>& records,
                            uint64_t client_dropped) {
  // A duplicate or a step that went backwards (a resent batch) is skipped,
  // as the store skips it (DESIGN.md §3).
  uint64_t& next = run.next_step[StreamSlot(stream.key)];
  size_t first = 0;
  while (first < records.size() && records[first].step() < next) ++first;
  RunMetrics& m = *run.metrics;
  if (first == records.size()) return;
  // A resent batch whose records were all seen before reports its drops
  // again; count drops only with a batch that brought something new.
  if (client_dropped > 0) {
    m.client_dropped_steps.Increment(static_cast<double>(client_dropped));
  }
  const uint32_t rank = stream.key.rank, attempt = stream.key.attempt;
  if (rank < run.lead_rank || (rank == run.lead_rank && attempt > run.lead_attempt)) {
    run.lead_rank = rank;
    run.lead_attempt = attempt;
    EnsureHealth(run, stream.start);
    if (stream.start.max_norm() > 0) m.clip_threshold.Set(stream.start.max_norm());
  }
  const bool lead = rank == run.lead_rank && attempt == run.lead_attempt;
  RunHealth& health = *run.health;
  run.last_record_unix_nanos = clock_->NowUnixNanos();
  if (health.tracker().firing(AlertKind::kRunSilent)) {
    health.tracker().Resolve(AlertKind::kRunSilent, records[first].step());
  }
  const v1::StepRecord* last = nullptr;
  size_t fresh = 0;
  for (size_t i = first; i < records.size(); ++i) {
    const v1::StepRecord& r = records[i];
    if (r.step() < next) continue;
    next = r.step() + 1;
    last = &r;
    ++fresh;
    health.OnRankRecord(rank, attempt, r);
    if (!lead) continue;
    FeedLead(run, attempt, r);
    m.steps.Increment();
    // A skipped step applied no update, so nothing was clipped.
    if (r.clipped() && !r.skipped()) m.clipped_steps.Increment();
    if (r.skipped()) m.skipped_steps.Increment();
    if (!std::isfinite(r.grad_norm()) || (r.has_loss() && !std::isfinite(r.loss()))) {
      m.nonfinite_steps.Increment();
    }
    // Optional fields keep the last value reported, not the last record's.
    if (r.has_clip_coef()) m.clip_coefficient.Set(r.clip_coef());
    if (r.has_loss_scale()) m.loss_scale.Set(r.loss_scale());
    if (r.has_max_attn_logit()) m.max_attention_logit.Set(r.max_attn_logit());
    if (r.has_log_z()) m.log_z.Set(r.log_z());
    if (r.has_loss()) m.loss.Set(r.loss());
    if (r.has_lr()) m.learning_rate.Set(r.lr());
  }
  metrics_->ingest_records.Increment(static_cast<double>(fresh));
  if (!lead) return;
  run.last_step = last->step();
  m.last_step.Set(static_cast<double>(last->step()));
  int64_t t = last->time_unix_nanos() != 0 ? last->time_unix_nanos()
                                           : clock_->NowUnixNanos();
  m.last_step_timestamp.Set(static_cast<double>(t) * 1e-9);
  m.grad_norm.Set(last->grad_norm());
  UpdateWindowMetrics(run);
}

void Engine::UpdateWindowMetrics(RunState& run) {
  const RunHealth& h = *run.health;
  RunMetrics& m = *run.metrics;
  const RunWindow& w = h.window();
  if (w.grad_norm.ranked() > 0) {
    m.grad_norm_p50.Set(*w.grad_norm.Quantile(0.50));
    m.grad_norm_p90.Set(*w.grad_norm.Quantile(0.90));
    m.grad_norm_p99.Set(*w.grad_norm.Quantile(0.99));
  }
  if (w.clipped.size() > 0) m.clip_fraction.Set(w.clipped.fraction());
  if (w.skipped.size() > 0) m.skip_fraction.Set(w.skipped.fraction());
  if (std::optional<double> rec = h.RecommendedMaxNorm()) {
    m.recommended_clip_threshold.Set(*rec);
  }
}

void Engine::ProcessEvent(RunState& run, const v1::RunEvent& event) {
  if (event.kind() != v1::RUN_FINISHED && event.kind() != v1::RUN_FAILED) {
    return;
  }
  if (run.health != nullptr && run.health->tracker().firing(AlertKind::kRunSilent)) {
    run.health->tracker().Resolve(AlertKind::kRunSilent, event.step());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!run.finished) {
    run.finished = true;
    run.finished_unix_nanos = clock_->NowUnixNanos();
    run.metrics->finished.Set(1);
    --active_runs_;
    metrics_->runs_active.Set(static_cast<double>(active_runs_));
  }
}

absl::StatusOr<HealthSnapshot> Engine::GetHealth(const std::string& run_id) {
  std::shared_ptr<RunState> run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "run \"", run_id, "\" has no live health on this server"));
    }
    run = it->second;
  }
  std::promise<HealthSnapshot> result;
  ShardFor(run_id)->Post([&] {
    HealthSnapshot snap;
    if (run->health != nullptr) {
      const RunHealth& h = *run->health;
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
      for (const AlertSpec& spec : AllAlertSpecs()) {
        const AlertEpisode& e = h.tracker().episode(spec.kind);
        if (e.firing) snap.active_alerts.push_back(ToProto(run_id, e));
      }
      snap.recommended_max_norm = h.RecommendedMaxNorm();
    }
    result.set_value(std::move(snap));
  });
  return result.get_future().get();
}

void Engine::CheckSilence() {
  const int64_t now = clock_->NowUnixNanos();
  const int64_t limit = options_.health.silent.seconds * 1'000'000'000;
  std::vector<std::shared_ptr<RunState>> runs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, run] : runs_) {
      if (!run->finished) runs.push_back(run);
    }
  }
  for (std::shared_ptr<RunState>& run : runs) {
    ShardFor(run->run_id)->Post([run = std::move(run), now, limit] {
      if (run->health == nullptr || now - run->last_record_unix_nanos < limit) {
        return;
      }
      double seconds = static_cast<double>(now - run->last_record_unix_nanos) * 1e-9;
      run->health->tracker().BeginStep(run->last_step, now);
      run->health->tracker().Fire(
          AlertKind::kRunSilent, run->last_step, seconds,
          AlertText{absl::StrCat("run ", run->run_id, " is silent"),
                    absl::StrFormat("no step from run %s for %.0f s (last step %d); "
                                    "the run has not reported RUN_FINISHED",
                                    run->run_id, seconds, run->last_step)});
    });
  }
}

void Engine::ForgetFinishedRuns() {
  const int64_t now = clock_->NowUnixNanos();
  const int64_t keep = options_.health.finished_runs.retention_seconds * 1'000'000'000;
  std::vector<std::shared_ptr<RunState>> forgotten;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = runs_.begin(); it != runs_.end();) {
      const RunState& run = *it->second;
      // use_count 1: no stream, nor work queued on a shard, holds the run,
      // and new holders take it only from runs_, under mu_.
      if (run.finished && now - run.finished_unix_nanos >= keep &&
          it->second.use_count() == 1) {
        forgotten.push_back(std::move(it->second));
        runs_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  // Nothing else can reach these runs now, so this thread may touch them.
  for (std::shared_ptr<RunState>& run : forgotten) {
    if (run->health == nullptr) continue;
    AlertTracker& tracker = run->health->tracker();
    tracker.BeginStep(run->last_step, now);
    for (const AlertSpec& spec : AllAlertSpecs()) {
      tracker.Resolve(spec.kind, run->last_step);  // stored, sent, exported
    }
  }
  // Destroying a run removes its series from /metrics.
}

absl::Status Engine::ResolveAlertsOfFinishedRuns(
    const std::vector<v1::RunSummary>& runs) {
  absl::StatusOr<std::vector<v1::Alert>> firing =
      store_->ListAlerts("", /*active_only=*/true);
  if (!firing.ok()) return firing.status();
  absl::flat_hash_map<std::string, const v1::RunSummary*> finished;
  for (const v1::RunSummary& summary : runs) {
    if (summary.state() != "running") finished[summary.run_id()] = &summary;
  }
  // The lead RunStart's labels go with each notice: read once per run.
  absl::flat_hash_map<std::string, std::map<std::string, std::string>> labels;
  const int64_t now = clock_->NowUnixNanos();
  for (v1::Alert& alert : *firing) {
    auto it = finished.find(alert.run());
    if (it == finished.end()) continue;
    alert.set_state("resolved");
    alert.set_resolved_step(std::max(alert.started_step(), it->second->last_step()));
    alert.set_resolved_unix_nanos(now);
    if (options_.notifier != nullptr) {
      auto [run_labels, added] = labels.try_emplace(alert.run());
      if (added) {
        absl::StatusOr<v1::RunStart> start = store_->GetLeadStart(alert.run());
        if (start.ok()) {
          run_labels->second.insert(start->labels().begin(), start->labels().end());
        }
      }
      options_.notifier->Notify(ToNotice(alert, run_labels->second));
    }
    store_->Submit(WriteOp{.kind = WriteOp::Kind::kAlert,
                           .key = {alert.run(), 0, 0},
                           .alert = std::move(alert)});
  }
  return absl::OkStatus();
}

void Engine::SilenceLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    stop_cv_.wait_for(lock, options_.silence_check_interval);
    if (stopping_) break;
    lock.unlock();
    CheckSilence();
    ForgetFinishedRuns();
    lock.lock();
  }
}

}  // namespace trainwatch
