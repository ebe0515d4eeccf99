// Fuzz target: validation and the real per-run pipeline on arbitrary Report
// streams.
//
// The input becomes a health config and a sequence of ReportRequests, either
// parsed from raw protobuf bytes (mode 0) or built field by field from
// extreme values (mode 1: NaN, +-Inf, denormals, huge, steps backwards or
// repeated, ranks and attempts changing, layer_stats, fp8, batch_ids), plus, in
// mode 1, what the engine does besides ingest: RunSilent checks and server
// restarts (a new pipeline recovers the lead and the firing alerts, then
// replays the stored history muted). Requests go through the server's
// validation and, when accepted, through the engine's own RunPipeline
// (health/run/run_pipeline.h: dedup, lead-stream choice, rewinds, RunHealth with
// its windows, detectors and alert tracker). The fuzzer is the pipeline's
// RunObserver; it keeps an oracle written from the documented semantics (the
// store's duplicate filter, the lead rule, rewinds, shadow windows). No
// threads and no SQLite, so an input costs microseconds.
//
// Checked beyond "no crash, leak or UB":
//  - a refused request is INVALID_ARGUMENT with a message;
//  - the windows hold exactly the last W post-warmup values (a shadow copy):
//    slots, ranked, every quantile nearest-rank over the finite ones, max;
//    the flag windows' counts; RecommendedMaxNorm is the window's p98;
//  - the alert listener sees fire and resolve alternate per alert, never
//    while muted, never for a disabled alert, and agrees with the tracker;
//    an episode survives ToProto/FromProto (how alerts are stored);
//  - a spike is reported for the record being processed;
//  - fresh records are those the store would keep, the lead records reach
//    the health once each and in order, the lead is the lowest rank and
//    latest attempt, a fresh record or the run's end resolves RunSilent,
//    RunSilent fires exactly at the configured silence.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "ingest/validate.h"
#include "google/protobuf/stubs/logging.h"
#include "health/alert_catalog.h"
#include "health/run/alert_tracker.h"
#include "health/run/convert.h"
#include "health/run/run_health.h"
#include "health/run/run_pipeline.h"
#include "trainwatch/v1/alert_names.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {
namespace {

[[noreturn]] void Fail(std::string_view what) {
  std::fprintf(stderr, "ingest_fuzzer: %.*s\n", static_cast<int>(what.size()),
               what.data());
  std::abort();
}

void Check(bool ok, std::string_view what) {
  if (!ok) Fail(what);
}

bool SameDouble(double a, double b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

// ---------------------------------------------------------------------------
// Shadow windows: the documented semantics of window.h, kept naively.

// The last `capacity` (step, value) pushes, oldest first; a rewind drops the
// newest entries from `step` on.
template <typename T>
class ShadowRing {
 public:
  explicit ShadowRing(size_t capacity) : capacity_(capacity) {}
  void Push(uint64_t step, T value) {
    if (capacity_ == 0) return;
    if (entries_.size() == capacity_) entries_.pop_front();
    entries_.emplace_back(step, value);
  }
  void RewindTo(uint64_t step) {
    while (!entries_.empty() && entries_.back().first >= step) {
      entries_.pop_back();
    }
  }

 protected:
  size_t capacity_;
  std::deque<std::pair<uint64_t, T>> entries_;
};

class ShadowValues : public ShadowRing<double> {
 public:
  using ShadowRing::ShadowRing;
  // OrderStatWindow (the grad norm) or ValueWindow: the same answers.
  template <typename Window>
  void Expect(const Window& w) const {
    Check(w.slots() == entries_.size(), "window slots");
    std::vector<double> finite;
    for (const auto& [step, v] : entries_) {
      if (std::isfinite(v)) finite.push_back(v);
    }
    Check(w.ranked() == finite.size(), "window ranked count");
    std::sort(finite.begin(), finite.end());
    for (double q : {0.0, 0.02, 0.5, 0.9, 0.98, 0.99, 1.0}) {
      std::optional<double> got = w.Quantile(q);
      if (finite.empty()) {
        Check(!got.has_value(), "quantile of an empty window");
        continue;
      }
      size_t rank = static_cast<size_t>(
          std::ceil(q * static_cast<double>(finite.size())));
      Check(got.has_value() && *got == finite[rank == 0 ? 0 : rank - 1],
            "window quantile is nearest-rank over the finite values");
    }
    std::optional<double> max = w.Max();
    Check(finite.empty() ? !max.has_value()
                         : (max.has_value() && *max == finite.back()),
          "window max");
  }
};

class ShadowFlags : public ShadowRing<bool> {
 public:
  using ShadowRing::ShadowRing;
  // FlagSeries (RunWindow's flags) or FlagWindow: the same counts.
  template <typename Flags>
  void Expect(const Flags& w) const {
    size_t count = 0;
    for (const auto& [step, f] : entries_) count += f ? 1 : 0;
    Check(w.size() == entries_.size() && w.count() == count,
          "flag window size and count");
    Check(w.fraction() >= 0 && w.fraction() <= 1, "flag fraction in [0, 1]");
  }
};

struct ShadowWindow {
  explicit ShadowWindow(size_t w)
      : grad_norm(w), clipped(w), skipped(w), max_attn_logit(w), log_z(w) {}
  ShadowValues grad_norm;
  ShadowFlags clipped;
  ShadowFlags skipped;
  ShadowValues max_attn_logit;
  ShadowValues log_z;

  // What RunHealth::OnLeadRecord pushes for a post-warmup record.
  void Push(const v1::StepRecord& r) {
    grad_norm.Push(r.step(), r.grad_norm());
    // A skipped step, or one with a non-finite norm, was not clipped.
    clipped.Push(r.step(), r.clipped() && !r.skipped() && std::isfinite(r.grad_norm()));
    skipped.Push(r.step(), r.skipped());
    if (r.has_max_attn_logit()) max_attn_logit.Push(r.step(), r.max_attn_logit());
    if (r.has_log_z()) log_z.Push(r.step(), r.log_z());
  }
  void RewindTo(uint64_t step) {
    grad_norm.RewindTo(step);
    clipped.RewindTo(step);
    skipped.RewindTo(step);
    max_attn_logit.RewindTo(step);
    log_z.RewindTo(step);
  }
  void Expect(const RunWindow& w) const {
    grad_norm.Expect(w.grad_norm);
    clipped.Expect(w.clipped);
    skipped.Expect(w.skipped);
    max_attn_logit.Expect(w.max_attn_logit);
    log_z.Expect(w.log_z);
  }
};

// ---------------------------------------------------------------------------
// The real per-run pipeline (health/run/run_pipeline.h), watched: the fuzzer is
// its RunObserver, and an oracle kept here from the documented semantics
// (the store's duplicate filter, lead-stream choice, rewinds, the shadow
// windows) says what it must report.

struct StreamState {
  v1::RunStart start;
  std::optional<uint64_t> last_stored;  // the store's duplicate filter
};

class WatchedRun final : public RunObserver {
 public:
  WatchedRun(std::string run_id, const HealthConfig& config)
      : run_id_(std::move(run_id)), config_(config), shadow_(config.window_steps) {
    Reset();
  }

  // The stream's RunStart committed (also when a stream reconnects).
  void OnStart(const StreamState& stream) {
    pipeline_->OnStreamStarted(stream.start.rank(), stream.start.attempt(),
                               stream.last_stored);
  }

  // Engine::SubmitBatch for a batch of a started stream.
  void OnBatch(StreamState& stream, const v1::StepBatch& batch) {
    const uint32_t rank = stream.start.rank(), attempt = stream.start.attempt();
    std::vector<const v1::StepRecord*> fresh;
    for (const v1::StepRecord& r : batch.records()) {
      if (stream.last_stored.has_value() && r.step() <= *stream.last_stored) {
        continue;
      }
      stream.last_stored = r.step();
      fresh.push_back(&r);
    }
    expect_lead_change_ = false;
    bool lead = false;
    if (!fresh.empty()) {
      if (rank < lead_rank_ || (rank == lead_rank_ && attempt > lead_attempt_)) {
        lead_rank_ = rank;
        lead_attempt_ = attempt;
        lead_start_ = stream.start;
        expect_lead_change_ = true;
      }
      lead = rank == lead_rank_ && attempt == lead_attempt_;
      for (const v1::StepRecord* r : fresh) {
        if (lead) expected_lead_.push_back(r->step());
        if (history_.size() < kMaxHistory) history_.push_back({rank, attempt, *r});
      }
    }
    current_attempt_ = attempt;
    accepted_.reset();
    batch_done_.reset();
    pipeline_->OnBatch(stream.start, batch.records(), batch.dropped(),
                       now_ += kTick);
    if (!fresh.empty()) last_fresh_ = now_;
    Check(!expect_lead_change_, "the lead changes when a lower rank or a later "
                                "attempt of the lead rank brings records");
    Check(expected_lead_.empty(), "every fresh lead record reaches the health, in order");
    if (fresh.empty()) {
      Check(!accepted_.has_value(), "a batch of records seen before reports nothing");
      return;
    }
    Check(accepted_ == fresh.size(), "fresh records counted as the store counts them");
    Check(pipeline_->lead_rank() == lead_rank_ && pipeline_->lead_attempt() == lead_attempt_,
          "the lead is the lowest rank, latest attempt");
    Check(!pipeline_->health()->tracker().firing(AlertKind::kRunSilent),
          "a fresh record resolves RunSilent");
    if (lead) {
      Check(batch_done_ == fresh.back()->step() &&
                pipeline_->last_step() == fresh.back()->step(),
            "a lead batch ends at its last fresh step");
    } else {
      Check(!batch_done_.has_value(), "no lead batch end for another stream");
    }
    ExpectWindows();
    ExpectAlerts();
  }

  // Engine::SubmitEvent once the event is stored.
  void OnEvent(const v1::RunStart& start, const v1::RunEvent& event) {
    const bool ends = pipeline_->OnEvent(start.rank(), start.attempt(), event);
    Check(ends == (event.kind() == v1::RUN_FINISHED || event.kind() == v1::RUN_FAILED),
          "only RUN_FINISHED and RUN_FAILED end a run");
    if (pipeline_->health() == nullptr) return;
    Check(!ends || !pipeline_->health()->tracker().firing(AlertKind::kRunSilent),
          "the end of a run resolves RunSilent");
    ExpectAlerts();
  }

  // Engine::CheckSilence just before and at the configured silence.
  void CheckSilence() {
    const int64_t limit = config_.silent.seconds * 1'000'000'000;
    const size_t before = transitions_;
    const bool was_silent = pipeline_->health() != nullptr &&
                            pipeline_->health()->tracker().firing(AlertKind::kRunSilent);
    pipeline_->OnTick(last_fresh_ + limit - 1);
    Check(transitions_ == before, "no RunSilent before the silence is long enough");
    pipeline_->OnTick(last_fresh_ + limit);
    if (pipeline_->health() == nullptr) {
      Check(transitions_ == before, "no RunSilent before the run has a lead");
      return;
    }
    Check(pipeline_->health()->tracker().firing(AlertKind::kRunSilent) ==
              (was_silent || !Disabled(AlertKind::kRunSilent)),
          "RunSilent fires after the silence unless disabled");
    ExpectAlerts();
  }

  // Engine::Rebuild after a restart: a new pipeline recovers the lead, the
  // alerts stored as firing (and `extra`, as if stored by an older server),
  // and replays the stored lead-rank history muted.
  void Restart(std::optional<AlertKind> extra) {
    const RunHealth* old = pipeline_->health();
    if (old == nullptr) {
      Reset();
      return;
    }
    HealthSnapshot snap = pipeline_->Snapshot();
    const uint64_t last_step = pipeline_->last_step();
    Reset();
    pipeline_->Recover(lead_start_, last_step);
    shadow_rank_ = lead_start_.rank();
    for (const v1::Alert& a : snap.active_alerts) {
      pipeline_->RestoreAlert(a);
      listener_firing_[static_cast<size_t>(*AlertKindByName(a.alertname()))] = true;
    }
    if (extra.has_value() && !Disabled(*extra)) {
      pipeline_->RestoreAlert(ToProto(run_id_, AlertEpisode{.kind = *extra,
                                                            .firing = true,
                                                            .started_step = last_step,
                                                            .text = AlertText{"restored", "stored"}}));
      listener_firing_[static_cast<size_t>(*extra)] = true;
    }
    ExpectAlerts();
    muted_ = true;
    pipeline_->BeginReplay();
    for (const auto& [rank, attempt, r] : history_) {
      if (rank != lead_rank_ || attempt > lead_attempt_) continue;
      pipeline_->Replay(attempt, r, now_ += kTick);
      Shadow(attempt, r);
    }
    pipeline_->EndReplay();
    muted_ = false;
    Check(windows_seen_, "the end of a replay reports the windows");
    ExpectWindows();
    ExpectAlerts();
  }

  // RunObserver.
  void OnAlert(AlertKind kind, const v1::Alert& a, bool update) override {
    Check(!muted_, "no alert transition while muted");
    ++transitions_;
    const bool now_firing = v1::Firing(a);
    bool& firing = listener_firing_[static_cast<size_t>(kind)];
    if (update) {
      // An episode already firing is reported again when its cause fired a
      // few steps later (caused_by set) or a spike's recurrence amended its
      // text: not a new fire.
      Check(now_firing && firing, "an update is of a firing alert");
    } else {
      Check(now_firing != firing, "fire and resolve alternate");
    }
    Check(!now_firing || !Disabled(kind), "a disabled alert never fires");
    Check(a.alertname() == Spec(kind).name, "the alert names its kind");
    firing = now_firing;
    // What recovery does with a stored alert gives the same alert back.
    const v1::Alert back = ToProto(run_id_, FromProto(a));
    Check(back.alertname() == a.alertname() && back.state() == a.state() &&
              back.severity() == a.severity() &&
              back.started_step() == a.started_step() &&
              back.resolved_step() == a.resolved_step() &&
              SameDouble(back.peak_value(), a.peak_value()) &&
              back.summary() == a.summary() &&
              back.description() == a.description() &&
              back.caused_by() == a.caused_by() && back.host() == a.host() &&
              back.batch_ids_size() == a.batch_ids_size() &&
              static_cast<size_t>(a.batch_ids_size()) <= AlertTracker::kMaxBatchIds,
          "an alert survives FromProto/ToProto");
  }
  void OnSpike(const SpikeInfo& s) override {
    Check(!muted_, "no spike is reported while muted");
    // A gradient spike names the record being processed; a loss spike,
    // reported once the loss has stayed up for stay_steps, names its onset:
    // an earlier lead step.
    Check(!expected_lead_.empty() &&
              (s.step == expected_lead_.front() ||
               (s.step < expected_lead_.front() && lead_seen_.contains(s.step))),
          "a spike names the record being processed or an earlier lead step");
  }
  void OnLeadChanged(const v1::RunStart& start) override {
    Check(expect_lead_change_ && start.rank() == lead_rank_ &&
              start.attempt() == lead_attempt_,
          "OnLeadChanged names the new lead");
    expect_lead_change_ = false;
    if (shadow_rank_.has_value() && *shadow_rank_ != start.rank()) {
      // A lower rank took over: the lead's windows hold its records only.
      shadow_ = ShadowWindow(config_.window_steps);
      shadow_attempt_.reset();
      shadow_last_step_.reset();
    }
    shadow_rank_ = start.rank();
  }
  void OnLeadRecord(const v1::StepRecord& r) override {
    Check(!muted_, "no lead record reported while replaying");
    Check(!expected_lead_.empty() && r.step() == expected_lead_.front(),
          "lead records reach the health once each, in order");
    lead_seen_.insert(r.step());
    expected_lead_.pop_front();
    Shadow(current_attempt_, r);
    Check(pipeline_->health()->last_step() == r.step(),
          "last_step is the record's step");
    ExpectAlerts();
  }
  void OnRecordsAccepted(size_t fresh, uint64_t) override { accepted_ = fresh; }
  void OnLeadBatchDone(const v1::StepRecord& last, int64_t) override {
    batch_done_ = last.step();
  }
  void OnWindows(const RunHealth& health) override {
    Check(&health == pipeline_->health(), "the windows reported are the run's");
    windows_seen_ = true;
  }

 private:
  static constexpr int64_t kTick = 1'000'000;  // between records, nanos
  static constexpr size_t kMaxHistory = 4096;

  bool Disabled(AlertKind kind) const {
    return config_.disabled.contains(std::string(Spec(kind).name));
  }

  // A pipeline as after a restart, and the oracle's view of it.
  void Reset() {
    pipeline_ = std::make_unique<RunPipeline>(run_id_, config_, this, now_);
    last_fresh_ = now_;
    shadow_ = ShadowWindow(config_.window_steps);
    shadow_attempt_.reset();
    shadow_last_step_.reset();
    shadow_rank_.reset();
    listener_firing_ = {};
    windows_seen_ = false;
  }

  // The oracle's copy of what the lead record does to the windows: a new
  // attempt at or below the last step rewinds, post-warmup records enter.
  void Shadow(uint32_t attempt, const v1::StepRecord& r) {
    if (shadow_attempt_ != attempt) {
      if (shadow_attempt_.has_value() && shadow_last_step_.has_value() &&
          r.step() <= *shadow_last_step_) {
        shadow_.RewindTo(r.step());
      }
      shadow_attempt_ = attempt;
    }
    if (r.step() >= lead_start_.warmup_steps()) shadow_.Push(r);
    shadow_last_step_ = r.step();
  }

  void ExpectWindows() const {
    const RunHealth* h = pipeline_->health();
    if (h == nullptr) return;
    const RunWindow& w = h->window();
    shadow_.Expect(w);
    Check(h->post_warmup_seen() >= w.grad_norm.slots(),
          "post_warmup_seen counts what the window holds");
    std::optional<double> rec = h->RecommendedMaxNorm();
    if (w.grad_norm.ranked() < config_.clip_fraction.min_steps) {
      Check(!rec.has_value(), "no recommendation before min_steps");
    } else {
      Check(rec == w.grad_norm.Quantile(0.98), "recommendation is the p98");
    }
    Check(pipeline_->Snapshot().window.steps() == w.grad_norm.slots(),
          "the snapshot reports the window");
  }

  void ExpectAlerts() const {
    const RunHealth* h = pipeline_->health();
    if (h == nullptr) return;
    const AlertTracker& t = h->tracker();
    int firing = 0;
    for (size_t i = 0; i < kAlertKindCount; ++i) {
      const bool f = t.firing(static_cast<AlertKind>(i));
      Check(f == listener_firing_[i], "tracker and listener agree");
      firing += f ? 1 : 0;
    }
    Check(t.active_count() == firing, "active_count counts firing alerts");
  }

  const std::string run_id_;
  const HealthConfig& config_;
  int64_t now_ = 0;
  int64_t last_fresh_ = 0;  // when a batch last brought a fresh record
  std::unique_ptr<RunPipeline> pipeline_;
  // The oracle.
  uint32_t lead_rank_ = std::numeric_limits<uint32_t>::max();
  uint32_t lead_attempt_ = 0;
  v1::RunStart lead_start_;
  bool expect_lead_change_ = false;
  std::deque<uint64_t> expected_lead_;
  std::set<uint64_t> lead_seen_;  // lead steps processed, any attempt
  uint32_t current_attempt_ = 0;
  std::optional<size_t> accepted_;
  std::optional<uint64_t> batch_done_;
  bool windows_seen_ = false;
  ShadowWindow shadow_;
  std::optional<uint32_t> shadow_attempt_;
  std::optional<uint64_t> shadow_last_step_;
  std::optional<uint32_t> shadow_rank_;  // the lead rank the shadow follows
  std::array<bool, kAlertKindCount> listener_firing_{};
  size_t transitions_ = 0;
  bool muted_ = false;
  // Stored records of the run, (rank, attempt, record), for a restart.
  std::vector<std::tuple<uint32_t, uint32_t, v1::StepRecord>> history_;
};

// The server side of Report streams: validation (as ingest.cc does it), then
// the runs' pipelines.
class Server {
 public:
  explicit Server(const HealthConfig& config) : config_(config) {
    limits_.max_batch_records = 64;
    limits_.max_labels = 4;
    limits_.max_label_key_chars = 16;
    limits_.max_label_value_chars = 32;
    limits_.max_layers = 8;
    limits_.max_batch_ids = 16;
    limits_.max_event_detail_chars = 64;
  }

  // A RunStart opens a new stream, which becomes the current one.
  void Handle(const v1::ReportRequest& request) {
    switch (request.msg_case()) {
      case v1::ReportRequest::kStart: {
        absl::Status s = ValidateRunStart(request.start(), limits_);
        ExpectRefusal(s);
        if (!s.ok()) return;
        const v1::RunStart& start = request.start();
        Check(start.rank() < std::max(start.world_size(), 1u) &&
                  std::isfinite(start.max_norm()) && start.max_norm() >= 0,
              "an accepted RunStart has rank < world_size and a finite max_norm");
        auto key = std::make_tuple(start.run_id(), start.rank(), start.attempt());
        StreamState& stream = streams_[key];
        stream.start = start;  // a reconnect keeps the stored last step
        current_ = &stream;
        auto it = runs_.find(start.run_id());
        if (it == runs_.end()) {
          it = runs_.emplace(start.run_id(),
                             std::make_unique<WatchedRun>(start.run_id(), config_))
                   .first;
        }
        current_run_ = it->second.get();
        current_run_->OnStart(stream);
        return;
      }
      case v1::ReportRequest::kBatch: {
        if (current_ == nullptr) return;  // FAILED: RunStart first
        absl::Status s = ValidateBatchShape(request.batch(), limits_);
        ExpectRefusal(s);
        if (!s.ok()) return;
        // A bad record is refused alone: the rest of its batch goes on.
        v1::StepBatch kept = request.batch();
        kept.clear_records();
        for (const v1::StepRecord& r : request.batch().records()) {
          absl::Status rs = ValidateStepRecord(r, limits_, current_->start.moe());
          ExpectRefusal(rs);
          if (rs.ok()) *kept.add_records() = r;
        }
        current_run_->OnBatch(*current_, kept);
        return;
      }
      case v1::ReportRequest::kEvent: {
        if (current_ == nullptr) return;
        absl::Status s = ValidateRunEvent(request.event(), limits_);
        ExpectRefusal(s);
        if (s.ok()) current_run_->OnEvent(current_->start, request.event());
        return;
      }
      case v1::ReportRequest::kDirectiveAck:
        // A rank's answer to a directive goes to the closed loop, not to the
        // records or their health (closed_loop_test covers it).
        return;
      case v1::ReportRequest::MSG_NOT_SET:
        return;
    }
  }

  WatchedRun* current_run() { return current_run_; }

  // A server restart: the current run recovers, then its streams reconnect.
  void Restart(std::optional<AlertKind> extra) {
    if (current_run_ == nullptr) return;
    current_run_->Restart(extra);
    for (const auto& [key, stream] : streams_) {
      if (std::get<0>(key) == current_->start.run_id()) current_run_->OnStart(stream);
    }
  }

 private:
  static void ExpectRefusal(const absl::Status& s) {
    Check(s.ok() || (s.code() == absl::StatusCode::kInvalidArgument &&
                     !s.message().empty()),
          "a refused request is INVALID_ARGUMENT with a message");
  }

  const HealthConfig& config_;
  ValidationLimits limits_;
  std::map<std::tuple<std::string, uint32_t, uint32_t>, StreamState> streams_;
  std::map<std::string, std::unique_ptr<WatchedRun>> runs_;
  StreamState* current_ = nullptr;
  WatchedRun* current_run_ = nullptr;
};

// ---------------------------------------------------------------------------
// Input decoding.

// Small windows and thresholds, within what config.cc accepts, so detectors
// reach their firing conditions within a few dozen records.
HealthConfig ConsumeConfig(FuzzedDataProvider& in) {
  HealthConfig c;
  c.window_steps = in.ConsumeIntegralInRange<uint32_t>(10, 40);
  const uint32_t w = c.window_steps;
  auto count = [&](uint32_t hi) { return in.ConsumeIntegralInRange<uint32_t>(1, hi); };
  c.resolve_after_steps = count(16);
  c.clip_fraction.min_steps = count(w);
  c.spike.min_steps = count(w);
  c.skip_rate.min_steps = count(w);
  c.post_clip.min_steps = count(w);
  c.post_clip.min_pile = count(8);
  c.loss_scale.halvings = count(4);
  c.loss_scale.within_steps = count(32);
  c.scaler_stuck.consecutive = count(6);
  c.clip_before_unscale.steps = count(w);
  c.rank_mismatch.horizon_steps = count(64);
  // A higher rank leads at the end of its first batch, as the oracle's lead
  // rule says (waiting for a lower rank is arrival_order_test's and
  // arrival_order_fuzzer's to check).
  c.ranks.max_pending_lead_records = 1;
  c.fp16_scaler.steps = count(w);
  c.adam.stall_reports = count(4);
  c.spike.ema_beta = in.ConsumeBool() ? 0.5 : 0.99;
  // Some alerts switched off: they must never fire.
  // Bit 63 switches the mask on; bits 0..62 are the alert kinds.
  static_assert(kAlertKindCount <= 63, "one bit an alert kind");
  const uint64_t disabled = in.ConsumeIntegral<uint64_t>();
  for (const AlertSpec& spec : AllAlertSpecs()) {
    if (((disabled >> 63) & 1) != 0 &&
        ((disabled >> static_cast<size_t>(spec.kind)) & 1) != 0) {
      c.disabled.insert(std::string(spec.name));
    }
  }
  return c;
}

double ConsumeDouble(FuzzedDataProvider& in) {
  static constexpr double kSpecial[] = {
      0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-6, 1e-3, 10.0, 100.0, 65536.0,
      std::numeric_limits<double>::quiet_NaN(),
      -std::numeric_limits<double>::quiet_NaN(),
      std::numeric_limits<double>::infinity(),
      -std::numeric_limits<double>::infinity(),
      std::numeric_limits<double>::denorm_min(),
      -std::numeric_limits<double>::denorm_min(),
      std::numeric_limits<double>::min(),
      std::numeric_limits<double>::max(),
      -std::numeric_limits<double>::max(),
      std::numeric_limits<double>::epsilon(), 1e300, 1e-300};
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return in.PickValueInArray(kSpecial);
    case 1: {  // any bit pattern, NaN payloads included
      uint64_t bits = in.ConsumeIntegral<uint64_t>();
      double d;
      std::memcpy(&d, &bits, sizeof d);
      return d;
    }
    case 2:
      return static_cast<double>(in.ConsumeIntegralInRange<int>(-4, 64)) / 4;
    default:
      return in.ConsumeFloatingPoint<double>();
  }
}

std::string ConsumeName(FuzzedDataProvider& in, size_t max) {
  static constexpr const char* kNames[] = {"r", "run-1", "a/b:c.d_e", "layer.0", ""};
  if (in.ConsumeBool()) return in.PickValueInArray(kNames);
  return in.ConsumeRandomLengthString(max);
}

v1::RunStart ConsumeStart(FuzzedDataProvider& in) {
  v1::RunStart s;
  s.set_run_id(in.ConsumeIntegralInRange<int>(0, 7) == 0 ? ConsumeName(in, 140)
                                                         : "r");
  s.set_world_size(in.ConsumeIntegralInRange<uint32_t>(0, 4));
  s.set_rank(in.ConsumeIntegralInRange<uint32_t>(0, 4));
  s.set_attempt(in.ConsumeIntegralInRange<uint32_t>(0, 3));
  s.set_precision(static_cast<v1::Precision>(in.ConsumeIntegralInRange<int>(0, 4)));
  s.set_max_norm(in.ConsumeBool() ? 1.0 : ConsumeDouble(in));
  s.set_warmup_steps(in.ConsumeIntegralInRange<uint64_t>(0, 8));
  s.set_scaler_growth_interval(in.ConsumeIntegralInRange<uint32_t>(0, 8));
  if (in.ConsumeBool()) s.set_adam_eps(in.ConsumeBool() ? 1e-8 : ConsumeDouble(in));
  if (in.ConsumeBool()) s.set_adam_beta2(in.ConsumeBool() ? 0.999 : ConsumeDouble(in));
  const int labels = in.ConsumeIntegralInRange<int>(0, 5);
  for (int i = 0; i < labels; ++i) {
    (*s.mutable_labels())[ConsumeName(in, 20)] = in.ConsumeRandomLengthString(40);
  }
  return s;
}

uint64_t NextStep(FuzzedDataProvider& in, uint64_t prev) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return prev;  // repeated
    case 1:
      return prev - std::min<uint64_t>(prev, in.ConsumeIntegralInRange<uint64_t>(1, 40));
    case 2: {
      static constexpr uint64_t kSteps[] = {
          0, 1, std::numeric_limits<uint64_t>::max(),
          std::numeric_limits<uint64_t>::max() - 1,
          uint64_t{1} << 63, std::numeric_limits<uint32_t>::max()};
      return in.PickValueInArray(kSteps);
    }
    case 3:
      return prev + in.ConsumeIntegralInRange<uint64_t>(2, 1000);
    default:
      return prev + 1;
  }
}

v1::StepRecord ConsumeRecord(FuzzedDataProvider& in, uint64_t step) {
  v1::StepRecord r;
  r.set_step(step);
  // Mostly plain norms around 1 so that windows and EMAs settle, then break.
  r.set_grad_norm(in.ConsumeIntegralInRange<int>(0, 2) != 0
                      ? 1.0 + in.ConsumeIntegralInRange<int>(0, 8) / 8.0
                      : ConsumeDouble(in));
  const uint32_t has = in.ConsumeIntegral<uint32_t>();
  if (has & 1) r.set_clipped(in.ConsumeBool());
  if (has & 2) r.set_clip_coef(in.ConsumeBool() ? 1.0 : ConsumeDouble(in));
  if (has & 4) r.set_loss_scale(in.ConsumeBool() ? 65536.0 : ConsumeDouble(in));
  if (has & 8) r.set_skipped(true);
  if (has & 16) r.set_max_attn_logit(ConsumeDouble(in));
  if (has & 32) r.set_log_z(ConsumeDouble(in));
  if (has & 64) r.set_loss(ConsumeDouble(in));
  if (has & 128) r.set_lr(ConsumeDouble(in));
  if (has & 256) {
    r.set_time_unix_nanos(in.ConsumeBool() ? in.ConsumeIntegral<int64_t>()
                                           : static_cast<int64_t>(step >> 12));
  }
  if (has & 512) {
    const int n = in.ConsumeIntegralInRange<int>(0, 20);
    for (int i = 0; i < n; ++i) r.add_batch_ids(in.ConsumeIntegral<int64_t>());
  }
  if (has & 1024) r.set_shard_sq_sum(ConsumeDouble(in));
  if (has & 2048) {
    const int n = in.ConsumeIntegralInRange<int>(0, 9);
    for (int i = 0; i < n; ++i) {
      v1::LayerStats& l = (*r.mutable_layer_stats())[ConsumeName(in, 12)];
      l.set_grad_norm(ConsumeDouble(in));
      l.set_grad_rms(ConsumeDouble(in));
      l.set_g_over_sqrt_v_rms(ConsumeDouble(in));
      if (in.ConsumeBool()) l.set_update_rms_ratio(ConsumeDouble(in));
    }
  }
  if (has & 4096) {
    // FP8 stats: a few tensor names shared across ranks (one amax_group),
    // so the cross-rank desync check sees agreeing and disagreeing copies.
    const int n = in.ConsumeIntegralInRange<int>(0, 4);
    for (int i = 0; i < n; ++i) {
      v1::Fp8TensorStats& f = (*r.mutable_fp8())[ConsumeName(in, 3)];
      f.set_format(static_cast<v1::Fp8Format>(in.ConsumeIntegralInRange<int>(0, 5)));
      f.set_amax(in.ConsumeBool() ? 4.0 : ConsumeDouble(in));
      f.set_scale(in.ConsumeBool() ? 100.0 : ConsumeDouble(in));
      f.set_amax_history_len(in.ConsumeIntegralInRange<uint32_t>(0, 2048));
      if (in.ConsumeBool()) f.set_overflow_fraction(ConsumeDouble(in));
      if (in.ConsumeBool()) f.set_underflow_fraction(ConsumeDouble(in));
      if (in.ConsumeBool()) f.set_amax_group("tp0");
    }
  }
  return r;
}

// Mode 0: length-prefixed serialized ReportRequests, as a client could send.
void RunRaw(FuzzedDataProvider& in, Server& server) {
  while (in.remaining_bytes() > 0) {
    const size_t n = in.ConsumeIntegralInRange<size_t>(0, 2048);
    const std::string bytes = in.ConsumeBytesAsString(n);
    v1::ReportRequest request;
    if (!request.ParseFromString(bytes)) continue;  // gRPC refuses it first
    server.Handle(request);
  }
}

// Mode 1: requests built from extreme values, and the engine's other paths.
void RunStructured(FuzzedDataProvider& in, Server& server) {
  uint64_t step = 0;
  for (int ops = 0; ops < 256 && in.remaining_bytes() > 0; ++ops) {
    v1::ReportRequest request;
    switch (in.ConsumeIntegralInRange<int>(0, 15)) {
      case 0:
      case 1:
        *request.mutable_start() = ConsumeStart(in);
        break;
      case 2: {
        v1::RunEvent& e = *request.mutable_event();
        e.set_step(step);
        e.set_kind(static_cast<v1::EventKind>(in.ConsumeIntegralInRange<int>(0, 4)));
        e.set_detail(in.ConsumeRandomLengthString(80));
        break;
      }
      case 3:
      case 4: {
        std::optional<AlertKind> extra;
        if (in.ConsumeBool()) {
          extra = static_cast<AlertKind>(
              in.ConsumeIntegralInRange<size_t>(0, kAlertKindCount - 1));
        }
        server.Restart(extra);
        continue;
      }
      case 5:
        if (WatchedRun* run = server.current_run()) run->CheckSilence();
        continue;
      default: {
        v1::StepBatch& b = *request.mutable_batch();
        b.set_seq(in.ConsumeIntegral<uint64_t>());
        if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {
          b.set_dropped(in.ConsumeIntegral<uint64_t>());
        }
        const int n = in.ConsumeIntegralInRange<int>(0, 70);
        for (int i = 0; i < n && in.remaining_bytes() > 0; ++i) {
          step = NextStep(in, step);
          *b.add_records() = ConsumeRecord(in, step);
        }
        break;
      }
    }
    server.Handle(request);
  }
}

}  // namespace
}  // namespace trainwatch

// Invalid UTF-8 in a string field is refused by the parse; protobuf's log of
// it would drown libFuzzer's output.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const bool raw = in.ConsumeBool();
  const trainwatch::HealthConfig config = trainwatch::ConsumeConfig(in);
  trainwatch::Server server(config);
  if (raw) {
    trainwatch::RunRaw(in, server);
  } else {
    trainwatch::RunStructured(in, server);
  }
  return 0;
}
