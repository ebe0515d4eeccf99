// Detector thresholds (docs/detectors.md). The defaults here are the documented
// defaults; a deployment changes them in the YAML file given with --config.
#ifndef TRAINWATCH_SERVER_HEALTH_HEALTH_CONFIG_H_
#define TRAINWATCH_SERVER_HEALTH_HEALTH_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>

namespace trainwatch {

// The closed loop (docs/closed-loop.md): what the server asks a trainer to
// do when a critical alert with a restart plan fires.
struct ClosedLoopConfig {
  enum class Mode {
    kOff,      // no directive is proposed
    kPropose,  // directives wait for `trainwatchctl approve`
    kAuto,     // the actions in `auto_actions` are approved by policy at once
  };
  Mode mode = Mode::kPropose;
  // Actions approved by policy in auto mode (Directive's oneof names:
  // checkpoint_now, skip, rollback, scale_lr, stop).
  std::set<std::string> auto_actions = {"checkpoint_now", "skip"};
  uint32_t max_rollbacks = 3;        // then Stop and ClosedLoopExhausted
  // A new rollback for an alert in the same attempt needs this many steps
  // after the one before (a still-firing incident is not a new one).
  uint32_t min_steps_between = 200;
  // apply_at_step = the highest step any rank reported + lead_steps.
  uint32_t lead_steps = 2;
};

// "off", "propose", "auto" <-> Mode (the flag's and the YAML's words).
inline const char* ClosedLoopModeName(ClosedLoopConfig::Mode mode) {
  switch (mode) {
    case ClosedLoopConfig::Mode::kOff: return "off";
    case ClosedLoopConfig::Mode::kPropose: return "propose";
    case ClosedLoopConfig::Mode::kAuto: return "auto";
  }
  return "propose";
}
inline std::optional<ClosedLoopConfig::Mode> ParseClosedLoopMode(const std::string& word) {
  for (auto m : {ClosedLoopConfig::Mode::kOff, ClosedLoopConfig::Mode::kPropose,
                 ClosedLoopConfig::Mode::kAuto}) {
    if (word == ClosedLoopModeName(m)) return m;
  }
  return std::nullopt;
}
// The actions closed_loop.auto may list (Directive's oneof names).
inline constexpr const char* kDirectiveActions[] = {"checkpoint_now", "skip", "rollback",
                                                    "scale_lr", "stop"};

// The timing rules' options (timing/).
struct StragglerConfig {
  // Sequential detection (one-sided CUSUM) on log(rank's step time / the
  // median rank's level): a rank running `slack` x the median forever never
  // fires (in expectation); one at 1.3x fires after about
  // threshold / log(1.3 / slack) = 25 steps, one at 1.2x after about 70.
  double slack = 1.15;
  double threshold = 3.0;  // in log units
  // One step counts at most this slow: a checkpoint save or an evaluation
  // that stalls every rank once adds log(clip / slack) = 0.27, and a rank
  // must be slow step after step to reach the threshold.
  double clip = 1.5;
  // A rank's level: an EMA of its log step time, updated with innovations
  // clipped to +-log(clip) (so one-off slow steps barely move it).
  double ema_alpha = 0.1;
  // Fire threshold named in the alert (docs/detectors.md: >= 20% above the median).
  double ratio = 1.2;
  // While firing, the condition holds until the rank's level falls below
  // this ratio (hysteresis); then resolve_after_steps clear steps resolve it.
  double resolve_ratio = 1.1;
  // Ranks with a level needed for a median; a rank's first records are not
  // judged (start-up, compilation).
  uint32_t min_ranks = 3;
  uint32_t warmup_records = 10;
};

struct InputStallConfig {
  // Fires when the median over the last kSteps lead steps of
  // data_wait_s / step_time_s is >= fraction (so more than half of recent
  // steps waited that much: one slow batch at an epoch start is not a
  // stall); holds while it stays >= resolve_fraction.
  double fraction = 0.2;
  double resolve_fraction = 0.1;
};

struct GoodputConfig {
  // A gap between two lead records is silent time when it is longer than
  // both gap_factor x the typical step time and min_gap_seconds; what
  // exceeds the typical step time is lost.
  double gap_factor = 10.0;
  double min_gap_seconds = 30.0;
};

struct SpikeReplayConfig {
  // The replay is judged once the new attempt is this many steps past the
  // spike's step (or when the run finishes past the spike's step); a spike
  // within `tolerance` steps of the old one is the same spike recurring.
  uint32_t judge_after_steps = 50;
  uint32_t tolerance_steps = 20;
};

struct TimingConfig {
  StragglerConfig straggler;
  InputStallConfig input_stall;
  GoodputConfig goodput;
  SpikeReplayConfig spike_replay;
};

struct HostSuspectConfig {
  int64_t window_seconds = 86400;  // incidents older than this are forgotten
  uint32_t min_runs = 2;           // distinct runs naming the host
  // Bounds: hosts tracked (the oldest-touched is dropped past it) and
  // incidents kept per host (the oldest dropped).
  size_t max_hosts = 10000;
  size_t max_incidents_per_host = 64;
};

struct HealthConfig {
  // Window length W in post-warmup steps; also the baseline length.
  uint32_t window_steps = 1000;
  // A windowed alert resolves after its condition was false this many steps.
  uint32_t resolve_after_steps = 100;
  // Alertnames switched off in this deployment.
  std::set<std::string> disabled;

  // Sequential change detection of the level signals (log grad norm, clip
  // and skip rates, max attention logit, log Z) against the run's baseline.
  struct {
    // In-control average run length: steps between false alarms of one
    // signal on a run with no change (CUSUM threshold by Siegmund's
    // approximation). Larger: fewer false alarms, slightly later detection.
    double arl0 = 1e6;
    // A level alert resolves once the signal is clearly below this fraction
    // of its fire level (hysteresis) for resolve_after_steps.
    double resolve_ratio = 0.8;
    // A level shift must persist about this many steps to be named: no
    // single value (a heavy tail, a 4-6x excursion) counts for more.
    uint32_t min_steps = 16;
  } change;

  struct {
    double threshold = 0.05;   // clipped fraction over W
    uint32_t min_steps = 100;  // steps in W before it may fire
    // ... and over the last recent_steps post-warmup steps, and either
    // > rise_ratio x the share over the first baseline_steps post-warmup
    // steps or >= settle_steps post-warmup steps seen.
    uint32_t recent_steps = 100;
    uint32_t baseline_steps = 100;
    double rise_ratio = 2.0;
    uint32_t settle_steps = 1000;
  } clip_fraction;

  struct {
    double sigmas = 6.0;       // log norm >= EMA mean + sigmas * sd ...
    double min_ratio = 5.0;    // ... and norm >= min_ratio * EMA geometric mean
    double hard_ratio = 10.0;  // or norm >= hard_ratio * EMA geometric mean
    double ema_beta = 0.99;
    uint32_t min_steps = 100;  // post-warmup steps before the EMA is trusted
  } spike;

  struct {
    double ratio = 2.0;  // the norm's level >= ratio * baseline level
    // While the LR is below this fraction of its peak (a schedule's decay
    // to its floor), the norm may rise like sqrt(fraction * peak / lr)
    // without counting as drift (AdamW: steady-state norm ~ sqrt(wd / lr)).
    double lr_decay_fraction = 0.5;
  } drift;

  struct {
    uint32_t halvings = 4;        // decreases of the scale ...
    uint32_t within_steps = 100;  // ... within this many steps, no growth between
    double min_scale = 1.0;       // or a scale below this
    // or this many halvings with no growth between (a slow bleed: the
    // scaler never gets growth_interval clean steps to grow back).
    uint32_t bleed_halvings = 6;
  } loss_scale;

  struct {
    double threshold = 0.01;   // skipped fraction over W
    uint32_t min_steps = 100;  // steps in W before it may fire
  } skip_rate;

  struct {
    uint32_t consecutive = 5;  // skipped steps in a row with an unchanged scale
  } scaler_stuck;

  struct {
    uint32_t steps = 100;             // recent fp16 steps looked at
    double clip_fraction = 0.9;       // clipped on at least this share of them
    double min_norm_to_scale = 1e-3;  // median norm / loss scale at least this
  } clip_before_unscale;

  struct {
    uint32_t min_steps = 100;    // steps in W before it may fire
    double pile_fraction = 0.02; // share of W exactly at max_norm ...
    uint32_t min_pile = 5;       // ... and at least this many
  } post_clip;

  struct {
    double ratio = 2.0;  // the level >= ratio * baseline level
    double cap = 100.0;  // or any value >= cap
    // or the trend forecasts reaching the cap within this many steps.
    uint32_t horizon_steps = 2000;
  } attention;

  struct {
    double nats = 5.0;  // |level - baseline level| >= nats
    // or the trend forecasts moving that far within this many steps.
    uint32_t horizon_steps = 2000;
    // Its baseline: the median of log Z over this many post-warmup steps
    // (not W: held-out lab runs drift within their first 300 post-warmup
    // steps, and a healthy run's log Z settles within ~200).
    uint32_t baseline_steps = 200;
  } log_z;

  struct {
    double sigmas = 6.0;        // loss >= recent level + sigmas * sd (linear) ...
    double log_sigmas = 3.0;    // log loss >= its level + log_sigmas * sd of the logs ...
    double min_ratio = 1.5;     // ... and loss >= min_ratio * recent level
    uint32_t stay_steps = 3;    // on this many steps ...
    uint32_t stay_window = 5;   // ... of this many from the first
    uint32_t recent_steps = 100;  // the recent level: median of these
  } loss_spike;

  // LossDivergence (detectors/loss.cc): the loss did not come back. Judged
  // on losses that are all > 0 (in log space); a loss that reaches 0 or
  // below (an RL policy loss) is not judged.
  struct {
    uint32_t level_steps = 20;      // the loss's level: the median of these
    // A spike that stays: check_after_steps after a LossSpike's onset the
    // level is still >= spike_ratio x the level before it.
    uint32_t check_after_steps = 50;
    double spike_ratio = 1.5;
    // A slow rise: the level >= ratio x the run's best post-warmup level,
    // and >= sigmas standard errors of the level (the robust sd of the log
    // losses at the best / sqrt(level_steps)) above it, on sustain_steps
    // steps in a row.
    double ratio = 2.0;
    double sigmas = 4.0;
    uint32_t sustain_steps = 20;
    // A rise still under way, named before it doubles: the level >=
    // early_ratio x the best (and sigmas robust sd of the log losses, a
    // step's noise, above it) and >= early_rise x
    // the level level_steps steps before, on early_sustain_steps in a row.
    double early_ratio = 1.5;
    double early_rise = 1.05;
    uint32_t early_sustain_steps = 10;
    // Holds until the level is back under resolve_ratio x its reference.
    double resolve_ratio = 1.25;
  } loss_divergence;

  struct {
    double relative_spread = 1e-3;  // (max - min) / max over ranks of one step
    // Ranks arriving up to this many steps apart are compared step by step
    // (a few bytes per step kept for the slowest rank).
    uint32_t horizon_steps = 131072;
  } rank_mismatch;

  struct {
    double relative_error = 1e-3;  // |sqrt(sum shard_sq_sum) - norm| / norm
  } shard_mismatch;

  // Arrival order (docs/architecture.md): a run's verdicts do not depend on
  // the order its ranks' streams arrive in, within these bounds.
  struct {
    // A rank that sent nothing for this long (one never seen: since the
    // attempt's first record) is missing: the cross-rank checks stop waiting
    // for it, and a higher rank may lead the run in place of a lower one.
    int64_t missing_after_seconds = 60;
    // A rank that would lead but waits for a lower rank keeps at most this
    // many records; past it, it leads at once.
    uint32_t max_pending_lead_records = 100000;
    // Step times kept for steps not judged yet, over all ranks: with R
    // ranks, ranks at most max_pending_values / R steps apart (and
    // rank_mismatch.horizon_steps) are judged step by step.
    uint32_t max_pending_values = uint32_t{1} << 22;
  } ranks;

  struct {
    uint32_t steps = 100;  // first steps of an fp16 run checked for a scale
  } fp16_scaler;

  struct {
    double g_over_sqrt_v = 5.0;  // a layer's RMS of g/sqrt(v) at least this
    // ... and at least this times its median over the layer's previous
    // reports (min_reports of them): Adam adapting after warmup is not stale.
    double jump_ratio = 3.0;
    uint32_t min_reports = 3;
    double eps_multiple = 10.0;  // a layer's grad RMS at most this * adam_eps ...
    uint32_t stall_reports = 3;  // ... on this many reports in a row
    // LayerUpdateStall's collapse rule (any optimizer): the median layer's
    // update_rms_ratio (the median of its last 10 reports) at least
    // collapse_ratio x below its median over the first 50 post-warmup
    // reports, for at least collapse_fraction of the post-warmup steps so
    // far (and 20 steps): the end of a schedule that takes the LR to 0 is
    // shorter than that (cosine: the last 6% of the run under 1/100, 11%
    // with weights that grow 3x; a linear decay: the last 1%).
    double collapse_ratio = 100.0;
    double collapse_fraction = 0.2;
  } adam;

  // The MoE routing rules (detectors/moe.cc), on MoeStats reports. A
  // layer's level is the median of its last level_reports reports; none is
  // judged in the first settle_steps post-warmup steps (a router balances
  // its load in ~150 steps: Megatron's balancing loss goes 1.44 -> 1.01).
  struct {
    uint32_t settle_steps = 200;
    uint32_t level_reports = 10;
    // MoeRouterCollapse: the fewest experts carrying 90% of the
    // assignments <= collapse_top_k_multiple x top_k (at most half the layer).
    double collapse_top_k_multiple = 2.0;
    uint32_t dead_steps = 100;       // MoeDeadExpert: no assignment this long
    uint32_t dead_min_reports = 3;   // ... over at least this many reports
    double imbalance = 2.0;          // MoeImbalanceHigh: max/mean level
    uint32_t horizon_steps = 2000;   // ... or its trend gets there this soon
    // MoeAuxLossOffBalance: >= aux_high (and, where the layer reports its
    // counts, aux_high - 1 above its level after settling) ...
    double aux_high = 1.2;
    double aux_low = 0.9;            // ... or < aux_low
    // MoeRouterZLossGrowth: the level >= z_ratio x its lowest over the
    // z_growth_steps before the rise: the logits growing, not a router that
    // sharpens slowly as it learns (without z-loss its logits climb ~1.3x in
    // 500 steps and stay healthy; a router that runs away doubles in 100).
    double z_ratio = 2.0;
    uint32_t z_growth_steps = 500;
    // MoeImbalanceHigh's line and MoeRouterZLossGrowth hold this long, on
    // every report and at least persist_reports of them, before they page:
    // a level that comes back sooner was an excursion.
    uint32_t persist_steps = 100;
    uint32_t persist_reports = 3;
    double dropped_fraction = 0.01;  // MoeTokensDropped
    double ep_ratio = 1.5;           // MoeExpertParallelImbalance: max / mean block
    // MoeExpertBiasDrift: |mean bias| >= bias_mean_sd x the bias's spread
    // across experts (and > 0.05 in absolute terms), or the bias's update
    // flips sign on >= bias_flip_share of the experts report after report.
    double bias_mean_sd = 2.0;
    double bias_flip_share = 0.75;
  } moe;

  // SpikeHazard (detectors/hazard.cc): a layer statistic's jump over its
  // median of the last `window` reports, ln(x / median) - alpha ln(B) with
  // B = sqrt(1/(1-beta2)), >= theta in >= min_layers layers.
  struct {
    // Off by default: on families it was not fitted on its precision is
    // under 0.5 (docs/lab.md, "Held out by family").
    bool enabled = false;
    bool use_update_ratio = true;  // true: update_rms_ratio, false: g/sqrt(v) RMS
    uint32_t window = 50;
    double alpha = 0.0;
    double theta = 1.25;            // ln 3.5
    uint32_t min_layers = 4;
    uint32_t cooldown_steps = 20;
  } hazard;

  // FP8 per-tensor scaling (docs/detectors.md Fp8*), judged on the fp8
  // reports (every N steps) of each tensor.
  struct {
    double overflow_fraction = 1e-4;   // saturated share of a report ...
    double underflow_fraction = 0.1;   // ... flushed share of a report ...
    uint32_t reports = 10;             // ... on most of a tensor's last reports
    double scale_ratio = 1.5;          // scale vs the recipe's, either way
    double amax_spread = 1e-3;         // across the ranks of one amax_group
    double growth_factor = 100.0;      // amax forecast to reach this x baseline
    uint32_t horizon_steps = 2000;     // within this many steps
  } fp8;

  struct {
    int64_t seconds = 300;  // no step for this long from an unfinished run
  } silent;

  // RankStraggler, InputPipelineStall, goodput and the spike replay check
  // (docs/goodput-and-stragglers.md).
  TimingConfig timing;
  // HostSuspect: a host named by incidents of >= min_runs runs in a window.
  HostSuspectConfig host_suspect;

  struct {
    // A finished run's live state and series are kept this long, then
    // dropped (its firing alerts resolve).
    int64_t retention_seconds = 3600;
  } finished_runs;

  ClosedLoopConfig closed_loop;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_HEALTH_HEALTH_CONFIG_H_
