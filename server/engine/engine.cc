#include "engine/engine.h"

#include <algorithm>
#include <future>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "engine/baseline_loader.h"
#include "engine/run_state.h"
#include "health/run/convert.h"
#include "store/codec/step_codec.h"

namespace trainwatch {

Engine::Engine(EngineOptions options, Store* store, Metrics* metrics,
               const Clock* clock, Notifier* notifier, ClosedLoop* closed_loop)
    : options_(std::move(options)),
      store_(store),
      metrics_(metrics),
      clock_(clock),
      notifier_(notifier),
      closed_loop_(closed_loop),
      host_watch_(options_.health.host_suspect, store, metrics) {
  size_t n = options_.threads == 0 ? 1 : options_.threads;
  for (size_t i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>());
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options,
                                                       Store* store,
                                                       Metrics* metrics,
                                                       const Clock* clock,
                                                       Notifier* notifier,
                                                       ClosedLoop* closed_loop) {
  std::unique_ptr<Engine> engine(
      new Engine(std::move(options), store, metrics, clock, notifier, closed_loop));
  absl::StatusOr<std::vector<v1::RunSummary>> runs = store->ListRuns();
  if (!runs.ok()) return runs.status();
  if (absl::Status s = engine->ResolveAlertsOfFinishedRuns(*runs); !s.ok()) {
    return s;
  }
  if (absl::Status s = engine->host_watch_.Load(clock->NowUnixNanos()); !s.ok()) {
    return s;
  }
  if (absl::Status s = engine->LoadBaselineSets(); !s.ok()) return s;
  for (const v1::RunSummary& summary : *runs) {
    if (summary.state() != "running") continue;
    std::shared_ptr<RunState> run;
    {
      absl::MutexLock lock(&engine->mu_);
      run = engine->FindOrAddRunLocked(summary.run_id());
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
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  stop_cv_.SignalAll();
  if (silence_thread_.joinable()) silence_thread_.join();
  // Its last loads post to the shards, which finish them.
  if (baseline_loader_ != nullptr) baseline_loader_->Stop();
  for (auto& shard : shards_) shard->Stop();
}

Shard* Engine::ShardFor(const std::string& run_id) {
  return shards_[absl::HashOf(run_id) % shards_.size()].get();
}

std::shared_ptr<RunState> Engine::FindOrAddRunLocked(const std::string& run_id) {
  auto it = runs_.find(run_id);
  if (it != runs_.end()) {
    if (it->second->finished) {
      it->second->finished = false;
      it->second->metrics->finished.Set(0);
      it->second->last_batch_unix_nanos.store(clock_->NowUnixNanos(),
                                              std::memory_order_relaxed);
      ++active_runs_;
    }
    return it->second;
  }
  auto run = std::make_shared<RunState>(
      run_id, metrics_->AddRun(run_id, AlertLabels()), store_, metrics_,
      notifier_, &host_watch_, closed_loop_, options_.health,
      clock_->NowUnixNanos());
  runs_.emplace(run_id, run);
  ++active_runs_;
  metrics_->runs_active.Set(static_cast<double>(active_runs_));
  return run;
}

absl::StatusOr<StreamHandle> Engine::OpenStream(const v1::RunStart& start,
                                                DoneCallback done,
                                                std::optional<RunQuota> quota) {
  std::shared_ptr<RunState> run;
  {
    absl::MutexLock lock(&mu_);
    if (deleting_.contains(start.run_id())) {
      return absl::UnavailableError(absl::StrCat(
          "run ", start.run_id(), " is being deleted (trainwatchctl delete-run); retry"));
    }
    auto it = runs_.find(start.run_id());
    bool known_active = it != runs_.end() && !it->second->finished;
    if (!known_active && quota.has_value() &&
        active_by_token_[quota->token] >= quota->max_active_runs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "run ", start.run_id(), ": this token (line ", quota->token,
          " of the token file) already has ", active_by_token_[quota->token],
          " active runs, its runs:", quota->max_active_runs,
          " quota; finish old runs (RUN_FINISHED), or they leave the active "
          "set after --run-idle-timeout without a step"));
    }
    if (!known_active && active_runs_ >= options_.max_active_runs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this server already monitors ", active_runs_,
          " active runs, its --max-active-runs limit; finish old runs or use "
          "another server"));
    }
    run = FindOrAddRunLocked(start.run_id());
    run->open_streams.fetch_add(1);
    if (!known_active && quota.has_value()) {
      run->quota_token = quota->token;
      ++active_by_token_[quota->token];
    }
    metrics_->runs_active.Set(static_cast<double>(active_runs_));
  }
  auto handle = std::make_shared<Stream>(
      StreamKey{start.run_id(), start.rank(), start.attempt()}, start,
      std::move(run), ShardFor(start.run_id()));
  store_->Submit(WriteOp{.key = handle->key,
                         .body = WriteOp::Start{start},
                         .received_unix_nanos = clock_->NowUnixNanos(),
                         .done = [this, handle, done = std::move(done)](WriteResult r) {
        absl::Status status = r.status;
        StartCommitted(handle, std::move(r));
        done(status);
      }});
  return handle;
}

void Stream::Close() {
  if (!closed_.exchange(true)) run->open_streams.fetch_sub(1);
}

void Engine::RunInOrder(const StreamHandle& stream,
                        std::function<void(absl::Status)> work, bool small) {
  const bool prompt = small && stream->normal_queued.load() == 0;
  if (!prompt) stream->normal_queued.fetch_add(1);
  auto task = [stream, prompt, work = std::move(work)]() mutable {
    stream->shard->AssertOnShard();
    const bool known =
        stream->run->pipeline.KnowsStream(stream->key.rank, stream->key.attempt);
    if (!stream->held.empty() || (!known && !stream->start_result.has_value())) {
      stream->held.push_back(std::move(work));
    } else {
      work(stream->start_result.value_or(absl::OkStatus()));
    }
    if (!prompt) stream->normal_queued.fetch_sub(1);
  };
  stream->shard->Post(std::move(task),
                      prompt ? Shard::Lane::kPrompt : Shard::Lane::kNormal);
}

void Engine::OnStartCommitted(Stream& stream, const WriteResult& result) {
  stream.shard->AssertOnShard();
  stream.start_result = result.status;
  if (result.status.ok()) {
    stream.run->pipeline.OnStreamStarted(stream.key.rank, stream.key.attempt,
                                         result.last_step);
  }
  std::vector<std::function<void(absl::Status)>> held = std::move(stream.held);
  stream.held.clear();
  for (auto& work : held) work(result.status);
}

void Engine::SubmitBatch(const StreamHandle& stream, v1::StepBatch batch,
                         DoneCallback done, std::function<void()> processed) {
  // Swaps the records' pointers (neither field is on an arena): a copy into
  // a vector was 8% of the server's CPU at 16 streams.
  WriteOp::Batch::Records records;
  records.Swap(batch.mutable_records());
  Submit(stream, WriteOp::Batch(std::move(records)), batch.dropped(), std::move(done),
         std::move(processed));
}

void Engine::SubmitBatch(const StreamHandle& stream, std::shared_ptr<google::protobuf::Arena> arena,
                         v1::StepBatch* batch, DoneCallback done,
                         std::function<void()> processed) {
  // A field on the same arena (CreateMessage: Arena::Create would put it on
  // the heap): Swap exchanges pointers.
  auto* records = google::protobuf::Arena::CreateMessage<WriteOp::Batch::Records>(arena.get());
  records->Swap(batch->mutable_records());
  Submit(stream, WriteOp::Batch(std::move(arena), records), batch->dropped(), std::move(done),
         std::move(processed));
}

void Engine::Submit(const StreamHandle& stream, WriteOp::Batch records, uint64_t dropped,
                    DoneCallback done, std::function<void()> processed) {
  // On the thread that parsed them: the MoE counts' code for the store
  // (3 passes over 49 KB a 48 x 128 report, which the store thread, a queue
  // later, read from memory). Rank 0's only: the store keeps the other
  // ranks' records as digests by default, and codes any chunk it is not
  // handed a code for.
  if (stream->key.rank == 0) records.set_moe_counts(EncodeMoeCounts(records.records()));
  WriteOp op{.key = stream->key,
             .body = std::move(records),
             .received_unix_nanos = clock_->NowUnixNanos()};
  stream->run->last_batch_unix_nanos.store(op.received_unix_nanos,
                                           std::memory_order_relaxed);
  op.done = [done = std::move(done)](WriteResult r) { done(r.status); };
  const bool small = op.records() <= options_.prompt_batch_records;
  RunInOrder(stream, [this, stream, dropped, op = std::move(op),
                      processed = std::move(processed)](absl::Status started) mutable {
    if (started.ok()) {
      stream->run->pipeline.OnBatch(stream->start,
                                    std::get<WriteOp::Batch>(op.body).records(), dropped,
                                    clock_->NowUnixNanos());
    }
    if (processed) processed();
    if (!started.ok()) {
      op.done(WriteResult{.status = started});
      return;
    }
    store_->Submit(std::move(op));
  }, small);
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
    WriteOp op{.key = stream->key,
               .body = WriteOp::Event{event},
               .received_unix_nanos = clock_->NowUnixNanos()};
    op.done = [this, stream, event = std::move(event),
               done = std::move(done)](WriteResult r) {
      if (!r.status.ok()) {
        done(r.status);
        return;
      }
      stream->shard->Post([this, stream, event, done] {
        if (stream->run->pipeline.OnEvent(stream->key.rank, stream->key.attempt,
                                          event)) {
          MarkFinished(*stream->run);
        }
        done(absl::OkStatus());
      });
    };
    store_->Submit(std::move(op));
  }, /*small=*/true);
}

void Engine::SubmitDirectiveAck(const StreamHandle& stream, v1::DirectiveAck ack,
                                DoneCallback done) {
  RunInOrder(stream, [this, stream, ack = std::move(ack),
                      done = std::move(done)](absl::Status started) mutable {
    if (!started.ok() || closed_loop_ == nullptr) {
      done(started);
      return;
    }
    // The stream's rank, whatever the ack says.
    ack.set_rank(stream->key.rank);
    closed_loop_->OnAck(stream->key.run_id, ack, std::move(done));
  }, /*small=*/true);
}

void Engine::MarkFinished(RunState& run) {
  absl::MutexLock lock(&mu_);
  MarkFinishedLocked(run);
}

void Engine::MarkFinishedLocked(RunState& run) {
  if (run.finished) return;
  if (run.quota_token.has_value()) {
    auto it = active_by_token_.find(*run.quota_token);
    if (it != active_by_token_.end() && --it->second == 0) active_by_token_.erase(it);
    run.quota_token.reset();
  }
  run.finished = true;
  run.finished_unix_nanos = clock_->NowUnixNanos();
  run.metrics->finished.Set(1);
  --active_runs_;
  metrics_->runs_active.Set(static_cast<double>(active_runs_));
}

absl::StatusOr<HealthSnapshot> Engine::GetHealth(const std::string& run_id) {
  std::shared_ptr<RunState> run;
  {
    absl::MutexLock lock(&mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "run \"", run_id, "\" has no live health on this server"));
    }
    run = it->second;
  }
  std::promise<HealthSnapshot> result;
  ShardFor(run_id)->Post([&] { result.set_value(run->pipeline.Snapshot()); });
  return result.get_future().get();
}

}  // namespace trainwatch
