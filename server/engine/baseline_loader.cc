#include "engine/baseline_loader.h"

#include <cmath>
#include <cstdio>
#include <utility>

namespace trainwatch {

namespace {

ReferencePoint PointOf(const v1::StepRecord& r) {
  ReferencePoint p;
  p.step = r.step();
  if (r.has_tokens()) p.tokens = r.tokens();
  if (const std::optional<double> lr = BaselineLr(r)) p.lr = static_cast<float>(*lr);
  for (BaselineMetric m : kBaselineMetrics) {
    const std::optional<double> v = BaselineValue(m, r);
    p.value[static_cast<size_t>(m)] =
        v.has_value() ? static_cast<float>(*v) : std::nanf("");
  }
  return p;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const BaselineReferences>> ReadReferences(
    const Store& store, const std::vector<v1::BaselineRef>& refs, const std::string& source) {
  auto out = std::make_shared<BaselineReferences>();
  out->source = source;
  for (const v1::BaselineRef& ref : refs) {
    absl::StatusOr<v1::RunStart> start = store.GetAttemptStart(ref.run(), ref.attempt());
    if (absl::IsNotFound(start.status())) continue;
    if (!start.ok()) return start.status();
    ReferenceRun run;
    run.ref = ref;
    const uint64_t warmup = start->warmup_steps();
    absl::Status s = store.ReadSteps(
        ref.run(), warmup, 0, start->rank(), 4096, [&](v1::StepRecords& chunk) {
          for (const v1::StepRecords::Item& item : chunk.items()) {
            if (item.attempt() != ref.attempt() || item.record().step() < warmup) continue;
            if (!run.points.empty() && item.record().step() <= run.points.back().step) continue;
            run.points.push_back(PointOf(item.record()));
          }
          return true;
        });
    if (absl::IsNotFound(s)) continue;
    if (!s.ok()) return s;
    if (!run.points.empty()) out->runs.push_back(std::move(run));
  }
  if (out->runs.empty()) return std::shared_ptr<const BaselineReferences>();
  return std::shared_ptr<const BaselineReferences>(std::move(out));
}

BaselineLoader::BaselineLoader(const Store* store) : store_(store) {
  thread_ = std::thread([this] { Loop(); });
}

BaselineLoader::~BaselineLoader() { Stop(); }

void BaselineLoader::Load(std::vector<v1::BaselineRef> refs, std::string source, Done done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(Job{std::move(refs), std::move(source), std::move(done)});
      return;
    }
  }
  done(nullptr);
}

void BaselineLoader::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void BaselineLoader::Loop() {
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](BaselineLoader* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(l->mu_) {
            return l->stopping_ || !l->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, and nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::StatusOr<std::shared_ptr<const BaselineReferences>> refs =
        ReadReferences(*store_, job.refs, job.source);
    if (!refs.ok()) {
      std::fprintf(stderr, "trainwatch-server: reading reference runs: %s\n",
                   refs.status().ToString().c_str());
      job.done(nullptr);
      continue;
    }
    job.done(*std::move(refs));
  }
}

}  // namespace trainwatch
