// The engine's part in reference runs (docs/baselines.md): which runs a
// stream is judged against, and their curves loaded off the shard before its
// records are processed.
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "engine/baseline_loader.h"
#include "engine/engine.h"
#include "engine/run_state.h"

namespace trainwatch {

absl::Status Engine::LoadBaselineSets() {
  absl::StatusOr<std::vector<std::pair<std::string, std::vector<v1::BaselineRef>>>> sets =
      store_->ListBaselines();
  if (!sets.ok()) return sets.status();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [run, refs] : *sets) set_baselines_[run] = std::move(refs);
  }
  baseline_loader_ = std::make_unique<BaselineLoader>(store_);
  return absl::OkStatus();
}

std::pair<std::vector<v1::BaselineRef>, std::string> Engine::ResolveBaselines(
    const v1::RunStart& start) {
  {
    absl::MutexLock lock(&mu_);
    auto it = set_baselines_.find(start.run_id());
    if (it != set_baselines_.end() && !it->second.empty()) return {it->second, "set"};
  }
  if (start.baselines_size() > 0) {
    return {{start.baselines().begin(), start.baselines().end()}, "run_start"};
  }
  if (start.attempt() > 0) {
    v1::BaselineRef previous;
    previous.set_run(start.run_id());
    previous.set_attempt(start.attempt() - 1);
    return {{previous}, "previous_attempt"};
  }
  return {{}, "none"};
}

void Engine::StartCommitted(const StreamHandle& stream, WriteResult result) {
  const auto go_on = [stream](WriteResult r, std::shared_ptr<const BaselineReferences> refs,
                              bool set) {
    stream->shard->Post([stream, r = std::move(r), refs = std::move(refs), set] {
      stream->shard->AssertOnShard();
      if (set) stream->run->pipeline.SetBaselines(refs);
      OnStartCommitted(*stream, r);
    });
  };
  // The lead's RunStart (rank 0) says what the run is judged against; the
  // other ranks' go on at once.
  std::vector<v1::BaselineRef> refs;
  std::string source;
  if (result.status.ok() && stream->key.rank == 0 && baseline_loader_ != nullptr) {
    std::tie(refs, source) = ResolveBaselines(stream->start);
  }
  if (refs.empty()) {
    go_on(std::move(result), nullptr, /*set=*/result.status.ok() && stream->key.rank == 0);
    return;
  }
  baseline_loader_->Load(std::move(refs), std::move(source),
                         [go_on, result = std::move(result)](
                             std::shared_ptr<const BaselineReferences> loaded) mutable {
                           go_on(std::move(result), std::move(loaded), true);
                         });
}

absl::Status Engine::SetBaselines(const std::string& run_id,
                                  std::vector<v1::BaselineRef> refs) {
  absl::Notification committed;
  absl::Status status;
  store_->Submit(WriteOp{.key = StreamKey{.run_id = run_id},
                         .body = WriteOp::Baselines{refs},
                         .received_unix_nanos = clock_->NowUnixNanos(),
                         .done = [&](WriteResult r) {
                           status = r.status;
                           committed.Notify();
                         }});
  committed.WaitForNotification();
  if (!status.ok()) return status;
  std::shared_ptr<RunState> run;
  {
    absl::MutexLock lock(&mu_);
    if (refs.empty()) {
      set_baselines_.erase(run_id);
    } else {
      set_baselines_[run_id] = std::move(refs);
    }
    auto it = runs_.find(run_id);
    if (it != runs_.end() && !it->second->finished) run = it->second;
  }
  if (run == nullptr || baseline_loader_ == nullptr) return absl::OkStatus();
  absl::StatusOr<v1::RunStart> lead = store_->GetLeadStart(run_id);
  if (!lead.ok()) return absl::OkStatus();  // not started: its first stream loads them
  auto [resolved, source] = ResolveBaselines(*lead);
  Shard* shard = ShardFor(run_id);
  baseline_loader_->Load(std::move(resolved), std::move(source),
                         [run, shard](std::shared_ptr<const BaselineReferences> loaded) {
                           shard->Post([run, shard, loaded = std::move(loaded)] {
                             shard->AssertOnShard();
                             run->pipeline.SetBaselines(loaded);
                           });
                         });
  return absl::OkStatus();
}

}  // namespace trainwatch
