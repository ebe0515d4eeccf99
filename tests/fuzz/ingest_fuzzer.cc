// Fuzz target: validation and health of arbitrary Report streams.
//
// The input becomes a health config and a sequence of ReportRequests, either
// parsed from raw protobuf bytes (mode 0) or built field by field from
// extreme values (mode 1: NaN, +-Inf, denormals, huge, steps backwards or
// repeated, ranks and attempts changing, layer_stats, batch_ids), plus, in
// mode 1, what the engine does besides ingest: a muted replay of history,
// restored alerts and RunSilent. Requests go through the server's validation
// and, when accepted, through a model of the engine's per-run pipeline
// (Engine::ProcessRecords: the store's duplicate filter, lead-stream choice,
// rewinds on a new attempt) into RunHealth and its windows and detectors.
// The model works at the level of RunHealth's public interface, not the
// Engine with its threads and SQLite, so an input costs microseconds.
//
// Checked beyond "no crash, leak or UB":
//  - a refused request is INVALID_ARGUMENT with a message;
//  - the windows hold exactly the last W post-warmup values (a shadow copy):
//    slots, ranked, every quantile nearest-rank over the finite ones, max;
//    the flag windows' counts; RecommendedMaxNorm is the window's p98;
//  - the alert listener sees fire and resolve alternate per alert, never
//    while muted, never for a disabled alert, and agrees with the tracker;
//    an episode survives ToProto/FromProto (how alerts are stored);
//  - a spike is reported for the record being processed.
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
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "common/validate.h"
#include "google/protobuf/stubs/logging.h"
#include "health/alert_catalog.h"
#include "health/alert_tracker.h"
#include "health/convert.h"
#include "health/run_health.h"
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
  void Expect(const OrderStatWindow& w) const {
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
    clipped.Push(r.step(), r.clipped() && !r.skipped());
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
// A model of the engine's per-run pipeline over RunHealth.

struct StreamState {
  v1::RunStart start;
  std::optional<uint64_t> last_stored;  // the store's duplicate filter
};

class RunModel {
 public:
  RunModel(std::string run_id, const HealthConfig& config)
      : run_id_(std::move(run_id)), config_(config), shadow_(config.window_steps) {}

  // Engine::ProcessRecords for a batch the store committed.
  void OnBatch(StreamState& stream, const v1::StepBatch& batch) {
    std::vector<const v1::StepRecord*> fresh;
    for (const v1::StepRecord& r : batch.records()) {
      if (stream.last_stored.has_value() && r.step() <= *stream.last_stored) {
        continue;
      }
      stream.last_stored = r.step();
      fresh.push_back(&r);
    }
    if (fresh.empty()) return;
    const uint32_t rank = stream.start.rank(), attempt = stream.start.attempt();
    if (rank < lead_rank_ || (rank == lead_rank_ && attempt > lead_attempt_)) {
      lead_rank_ = rank;
      lead_attempt_ = attempt;
      EnsureHealth(stream.start);
    }
    const bool lead = rank == lead_rank_ && attempt == lead_attempt_;
    if (health_->tracker().firing(AlertKind::kRunSilent)) {
      health_->tracker().Resolve(AlertKind::kRunSilent, fresh.front()->step());
      ExpectAlerts();
    }
    for (const v1::StepRecord* r : fresh) {
      health_->OnRankRecord(rank, attempt, *r);
      ExpectAlerts();
      if (lead) FeedLead(attempt, *r);
    }
    ExpectWindows();
  }

  // Engine::ProcessEvent.
  void OnEvent(const v1::RunEvent& event) {
    if (event.kind() != v1::RUN_FINISHED && event.kind() != v1::RUN_FAILED) return;
    if (health_ != nullptr && health_->tracker().firing(AlertKind::kRunSilent)) {
      health_->tracker().Resolve(AlertKind::kRunSilent, event.step());
      ExpectAlerts();
    }
  }

  // Engine::CheckSilence once the run has been quiet too long.
  void FireSilent(double seconds) {
    if (health_ == nullptr) return;
    const uint64_t step = health_->last_step().value_or(0);
    health_->tracker().BeginStep(step, ++now_);
    health_->tracker().Fire(AlertKind::kRunSilent, step, seconds,
                            AlertText{"silent", "no step"});
    ExpectAlerts();
  }

  // Engine::Rebuild: alerts stored as firing before a restart.
  void Restore(AlertKind kind, uint64_t started_step, double peak) {
    if (health_ == nullptr || Disabled(kind)) return;
    AlertEpisode e{.kind = kind,
                   .firing = true,
                   .started_step = started_step,
                   .peak_value = peak,
                   .text = AlertText{"restored", "from the store"}};
    health_->tracker().Restore(FromProto(ToProto(run_id_, e)));
    listener_firing_[static_cast<size_t>(kind)] = true;
    ExpectAlerts();
  }

  // Engine::Rebuild replays history muted.
  void SetMuted(bool muted) {
    if (health_ == nullptr) return;
    muted_ = muted;
    health_->tracker().set_muted(muted);
  }

 private:
  bool Disabled(AlertKind kind) const {
    return config_.disabled.contains(std::string(Spec(kind).name));
  }

  void EnsureHealth(const v1::RunStart& start) {
    if (health_ != nullptr) {
      health_->set_info(InfoFrom(start));
      return;
    }
    health_ = std::make_unique<RunHealth>(
        InfoFrom(start), config_,
        [this](const AlertEpisode& e) { OnTransition(e); },
        [this](const SpikeInfo& s) {
          Check(!muted_, "no spike is reported while muted");
          Check(current_ != nullptr && s.step == current_->step(),
                "a spike is reported for the record being processed");
        });
    health_->tracker().set_muted(muted_);
  }

  void OnTransition(const AlertEpisode& e) {
    Check(!muted_, "no alert transition while muted");
    bool& firing = listener_firing_[static_cast<size_t>(e.kind)];
    Check(e.firing != firing, "fire and resolve alternate");
    Check(!e.firing || !Disabled(e.kind), "a disabled alert never fires");
    firing = e.firing;
    AlertEpisode back = FromProto(ToProto(run_id_, e));
    Check(back.kind == e.kind && back.firing == e.firing &&
              back.started_step == e.started_step &&
              back.resolved_step == (e.firing ? 0 : e.resolved_step) &&
              SameDouble(back.peak_value, e.peak_value) &&
              back.text.summary == e.text.summary &&
              back.text.description == e.text.description &&
              back.batch_ids == e.batch_ids &&
              e.batch_ids.size() <= AlertTracker::kMaxBatchIds,
          "an alert episode survives ToProto/FromProto");
  }

  // Engine::FeedLead.
  void FeedLead(uint32_t attempt, const v1::StepRecord& r) {
    RunHealth& h = *health_;
    if (health_attempt_ != attempt) {
      if (health_attempt_.has_value() && h.last_step().has_value() &&
          r.step() <= *h.last_step()) {
        h.Rewind(r.step());
        shadow_.RewindTo(r.step());
        ExpectWindows();
      }
      health_attempt_ = attempt;
    }
    if (r.step() >= h.info().warmup_steps) shadow_.Push(r);
    current_ = &r;
    h.OnLeadRecord(r, ++now_);
    current_ = nullptr;
    ExpectAlerts();
    Check(h.last_step() == r.step(), "last_step is the record's step");
  }

  void ExpectWindows() const {
    if (health_ == nullptr) return;
    const RunWindow& w = health_->window();
    shadow_.Expect(w);
    Check(health_->post_warmup_seen() >= w.grad_norm.slots(),
          "post_warmup_seen counts what the window holds");
    std::optional<double> rec = health_->RecommendedMaxNorm();
    if (w.grad_norm.ranked() < config_.clip_fraction.min_steps) {
      Check(!rec.has_value(), "no recommendation before min_steps");
    } else {
      Check(rec == w.grad_norm.Quantile(0.98), "recommendation is the p98");
    }
  }

  void ExpectAlerts() const {
    const AlertTracker& t = health_->tracker();
    int firing = 0;
    for (size_t i = 0; i < kAlertKindCount; ++i) {
      const bool f = t.firing(static_cast<AlertKind>(i));
      Check(f == listener_firing_[i], "tracker and listener agree");
      firing += f ? 1 : 0;
    }
    Check(t.active_count() == firing, "active_count counts firing alerts");
  }

  std::string run_id_;
  const HealthConfig& config_;
  uint32_t lead_rank_ = std::numeric_limits<uint32_t>::max();
  uint32_t lead_attempt_ = 0;
  std::optional<uint32_t> health_attempt_;
  std::unique_ptr<RunHealth> health_;
  ShadowWindow shadow_;
  std::array<bool, kAlertKindCount> listener_firing_{};
  bool muted_ = false;
  const v1::StepRecord* current_ = nullptr;
  int64_t now_ = 0;
};

// The server side of Report streams: validation (as ingest.cc does it), then
// the run models.
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
                             std::make_unique<RunModel>(start.run_id(), config_))
                   .first;
        }
        current_run_ = it->second.get();
        return;
      }
      case v1::ReportRequest::kBatch: {
        if (current_ == nullptr) return;  // FAILED: RunStart first
        absl::Status s = ValidateStepBatch(request.batch(), limits_);
        ExpectRefusal(s);
        if (s.ok()) current_run_->OnBatch(*current_, request.batch());
        return;
      }
      case v1::ReportRequest::kEvent: {
        if (current_ == nullptr) return;
        absl::Status s = ValidateRunEvent(request.event(), limits_);
        ExpectRefusal(s);
        if (s.ok()) current_run_->OnEvent(request.event());
        return;
      }
      case v1::ReportRequest::MSG_NOT_SET:
        return;
    }
  }

  RunModel* current_run() { return current_run_; }

 private:
  static void ExpectRefusal(const absl::Status& s) {
    Check(s.ok() || (s.code() == absl::StatusCode::kInvalidArgument &&
                     !s.message().empty()),
          "a refused request is INVALID_ARGUMENT with a message");
  }

  const HealthConfig& config_;
  ValidationLimits limits_;
  std::map<std::tuple<std::string, uint32_t, uint32_t>, StreamState> streams_;
  std::map<std::string, std::unique_ptr<RunModel>> runs_;
  StreamState* current_ = nullptr;
  RunModel* current_run_ = nullptr;
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
  c.fp16_scaler.steps = count(w);
  c.adam.stall_reports = count(4);
  c.spike.ema_beta = in.ConsumeBool() ? 0.5 : 0.99;
  // Some alerts switched off: they must never fire.
  const uint32_t disabled = in.ConsumeIntegral<uint32_t>();
  for (const AlertSpec& spec : AllAlertSpecs()) {
    if (((disabled >> 31) & 1) != 0 &&
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
        if (RunModel* run = server.current_run()) run->SetMuted(in.ConsumeBool());
        continue;
      case 4:
        if (RunModel* run = server.current_run()) {
          run->Restore(static_cast<AlertKind>(in.ConsumeIntegralInRange<size_t>(
                           0, kAlertKindCount - 1)),
                       step, ConsumeDouble(in));
        }
        continue;
      case 5:
        if (RunModel* run = server.current_run()) run->FireSilent(ConsumeDouble(in));
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
