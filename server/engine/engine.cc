#include "engine/engine.h"

#include <cmath>
#include <limits>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace trainwatch {

// Per-run state. `finished` is guarded by Engine::mu_; everything else is
// touched only by the run's shard thread.
struct RunState {
  std::string run_id;
  std::unique_ptr<RunMetrics> metrics;
  bool finished = false;
  // Run-level health follows the lowest rank that has reported (DESIGN.md §3).
  uint32_t lead_rank = std::numeric_limits<uint32_t>::max();
};

Engine::Engine(EngineOptions options, Store* store, Metrics* metrics,
               const Clock* clock)
    : options_(options), store_(store), metrics_(metrics), clock_(clock) {
  size_t n = options_.shards == 0 ? 1 : options_.shards;
  for (size_t i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>());
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options,
                                                       Store* store,
                                                       Metrics* metrics,
                                                       const Clock* clock) {
  std::unique_ptr<Engine> engine(new Engine(options, store, metrics, clock));
  absl::StatusOr<std::vector<v1::RunSummary>> runs = store->ListRuns();
  if (!runs.ok()) return runs.status();
  std::lock_guard<std::mutex> lock(engine->mu_);
  for (const v1::RunSummary& summary : *runs) {
    if (summary.state() != "running") continue;
    bool added = false;
    RunState* run = engine->FindOrAddRunLocked(summary.run_id(), &added);
    run->metrics->last_step.Set(static_cast<double>(summary.last_step()));
    run->metrics->last_step_timestamp.Set(
        static_cast<double>(summary.last_seen_unix_nanos()) * 1e-9);
    if (summary.max_norm() > 0) {
      run->metrics->clip_threshold.Set(summary.max_norm());
    }
  }
  return engine;
}

Engine::~Engine() { Stop(); }

void Engine::Stop() {
  for (auto& shard : shards_) shard->Stop();
}

Shard* Engine::ShardFor(const std::string& run_id) {
  return shards_[absl::HashOf(run_id) % shards_.size()].get();
}

RunState* Engine::FindOrAddRunLocked(const std::string& run_id, bool* added) {
  auto it = runs_.find(run_id);
  if (it != runs_.end()) {
    *added = false;
    if (it->second->finished) {
      it->second->finished = false;
      ++active_runs_;
    }
    return it->second.get();
  }
  auto run = std::make_unique<RunState>();
  run->run_id = run_id;
  run->metrics = metrics_->AddRun(run_id);
  RunState* raw = run.get();
  runs_.emplace(run_id, std::move(run));
  ++active_runs_;
  metrics_->runs_active.Set(static_cast<double>(active_runs_));
  *added = true;
  return raw;
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
  metrics_->streams_active.Increment();
  RunState* run = stream->run;
  double max_norm = start.max_norm();
  stream->shard->Post([run, max_norm] {
    if (max_norm > 0) run->metrics->clip_threshold.Set(max_norm);
  });
  store_->Submit(WriteOp{
      .kind = WriteOp::Kind::kStart,
      .key = stream->key,
      .start = start,
      .received_unix_nanos = clock_->NowUnixNanos(),
      .done = [done = std::move(done)](WriteResult r) { done(r.status); }});
  return StreamHandle(std::move(stream));
}

void Engine::SubmitBatch(const StreamHandle& stream, v1::StepBatch batch,
                         DoneCallback done) {
  WriteOp op{.kind = WriteOp::Kind::kBatch,
             .key = stream->key,
             .received_unix_nanos = clock_->NowUnixNanos()};
  op.records.assign(std::make_move_iterator(batch.mutable_records()->begin()),
                    std::make_move_iterator(batch.mutable_records()->end()));
  uint64_t dropped = batch.dropped();
  op.done = [this, stream, dropped, done = std::move(done)](WriteResult r) {
    if (!r.status.ok()) {
      done(r.status);
      return;
    }
    stream->shard->Post([this, stream, dropped, done = std::move(done),
                         fresh = std::move(r.fresh)] {
      ProcessRecords(*stream->run, *stream, fresh, dropped);
      done(absl::OkStatus());
    });
  };
  store_->Submit(std::move(op));
}

void Engine::SubmitEvent(const StreamHandle& stream, v1::RunEvent event,
                         DoneCallback done) {
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
}

void Engine::CloseStream(const StreamHandle& stream) {
  metrics_->streams_active.Decrement();
}

void Engine::ProcessRecords(RunState& run, const Stream& stream,
                            const std::vector<v1::StepRecord>& records,
                            uint64_t client_dropped) {
  metrics_->ingest_records.Increment(static_cast<double>(records.size()));
  RunMetrics& m = *run.metrics;
  // A resent batch whose records were all stored before reports its drops
  // again; count drops only with a batch that brought something new.
  if (client_dropped > 0 && !records.empty()) {
    m.client_dropped_steps.Increment(static_cast<double>(client_dropped));
  }
  if (records.empty()) return;
  if (stream.key.rank < run.lead_rank) run.lead_rank = stream.key.rank;
  if (stream.key.rank != run.lead_rank) return;  // stored; cross-rank checks later
  for (const v1::StepRecord& r : records) {
    m.steps.Increment();
    if (r.clipped()) m.clipped_steps.Increment();
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
  const v1::StepRecord& last = records.back();
  m.last_step.Set(static_cast<double>(last.step()));
  int64_t t = last.time_unix_nanos() != 0 ? last.time_unix_nanos()
                                          : clock_->NowUnixNanos();
  m.last_step_timestamp.Set(static_cast<double>(t) * 1e-9);
  m.grad_norm.Set(last.grad_norm());
}

void Engine::ProcessEvent(RunState& run, const v1::RunEvent& event) {
  if (event.kind() != v1::RUN_FINISHED && event.kind() != v1::RUN_FAILED) {
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!run.finished) {
    run.finished = true;
    --active_runs_;
    metrics_->runs_active.Set(static_cast<double>(active_runs_));
  }
}

}  // namespace trainwatch
