#include "config/config_fields.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trainwatch {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

constexpr Range kFraction = {0, true, 1, false, "in (0, 1]"};
constexpr Range kOpenFraction = {0, true, 1, true, "in (0, 1)"};
constexpr Range kPositive = {0, true, kInf, true, "> 0"};
constexpr Range kAboveOne = {1, true, kInf, true, "> 1"};
constexpr Range kCount = {1, false, std::numeric_limits<uint32_t>::max(), false,
                          "an integer >= 1"};
// Each run keeps W values per series: a typo must not cost gigabytes.
constexpr Range kWindow = {10, false, 1'000'000, false,
                           "an integer in [10, 1000000]"};
// Cross-rank digests: 12 bytes a step of lag, per run.
constexpr Range kLag = {1, false, 10'000'000, false,
                        "an integer in [1, 10000000]"};
constexpr Range kFlag = {0, false, 1, false, "true or false"};  // bools
constexpr Range kNonNegative = {0, false, kInf, true, ">= 0"};
constexpr Range kAny = {-kInf, true, kInf, true, "a finite number"};
// A tensor's last reports are kept as bits of one word.
constexpr Range kReports = {1, false, 64, false, "an integer in [1, 64]"};
constexpr Range kSeconds = {1, false, 365.0 * 24 * 3600, false,
                            "an integer in [1, 31536000]"};

// The tiers (config.h): what a user tunes first, and the internals.
constexpr ConfigTier kTuned = ConfigTier::kTuned;
constexpr ConfigTier kInternal = ConfigTier::kInternal;

// A list of words as YAML's flow sequence: [a, b].
std::string List(const std::set<std::string>& words) {
  return absl::StrCat("[", absl::StrJoin(words, ", "), "]");
}

constexpr WordKey kWordKeys[] = {
    {"", "disabled", "a list of alertnames", kTuned,
     "alertnames switched off, e.g. [RunSilent, LogZDrift]",
     [](const HealthConfig& c) { return List(c.disabled); }},
    {"closed_loop", "mode", "off, propose or auto", kTuned,
     "off | propose (wait for trainwatchctl approve) | auto; --closed-loop overrides",
     [](const HealthConfig& c) { return std::string(ClosedLoopModeName(c.closed_loop.mode)); }},
    {"closed_loop", "auto", "a list of checkpoint_now, skip, rollback, scale_lr, stop",
     kTuned, "actions auto mode approves by policy at once",
     [](const HealthConfig& c) { return List(c.closed_loop.auto_actions); }},
};

// What each group of keys is about (the comment on its line of the YAML):
// its alerts, or the part of the server it tunes.
struct Group {
  absl::string_view name;
  absl::string_view doc;
};

constexpr Group kGroupDocs[] = {
    {"change",
     "sequential change detection (CUSUM) of the level signals: log grad norm, clip and skip "
     "rates, max attention logit, log Z (docs/detectors.md)"},
    {"clip_fraction", "ClipFractionHigh"},
    {"spike", "GradNormSpike (EMA of post-warmup log norms)"},
    {"drift", "GradNormDrift"},
    {"loss_scale", "LossScaleCollapse (fp16)"},
    {"skip_rate", "SkipRateHigh (fp16)"},
    {"scaler_stuck", "ScalerStuck (fp16)"},
    {"clip_before_unscale", "ClipBeforeUnscale (fp16)"},
    {"post_clip", "PostClipNormReported"},
    {"attention", "AttentionLogitGrowth"},
    {"log_z", "LogZDrift"},
    {"loss_spike", "LossSpike (info)"},
    {"loss_divergence", "LossDivergence (critical; losses all > 0 only)"},
    {"rank_mismatch", "RankNormMismatch"},
    {"shard_mismatch", "ShardNormMismatch"},
    {"ranks", "the cross-rank checks' bookkeeping"},
    {"fp16_scaler", "Fp16WithoutScaler"},
    {"adam", "AdamStaleSecondMoment, LayerUpdateStall (layer_stats)"},
    {"moe",
     "the Moe* alerts (MoeStats reports; a level is the median of a layer's last reports)"},
    {"hazard", "SpikeHazard (needs layer_stats every step; calibrated on the lab, docs/lab.md)"},
    {"fp8", "Fp8Overflow, Fp8Underflow, Fp8ScaleMismatch, Fp8AmaxDesync, Fp8AmaxGrowth"},
    {"silent", "RunSilent"},
    {"finished_runs", "runs that reported RUN_FINISHED or RUN_FAILED"},
    {"closed_loop", "directives to the trainer (docs/closed-loop.md)"},
    {"straggler", "RankStraggler (step_time_s; docs/goodput-and-stragglers.md)"},
    {"input_stall", "InputPipelineStall (data_wait_s of the lead rank)"},
    {"goodput", "trainwatch_goodput_ratio, health's goodput line"},
    {"spike_replay", "the restart loop: a new attempt replaying a spike"},
    {"host_suspect", "HostSuspect (lemon hosts)"},
};

}  // namespace

bool InRange(double v, const Range& r) {
  const bool lo_ok = r.lo_open ? v > r.lo : v >= r.lo;
  const bool hi_ok = r.hi_open ? v < r.hi : v <= r.hi;
  return lo_ok && hi_ok;
}

std::vector<Field> Fields(HealthConfig& c) {
  return {
      {"", "window_steps", kWindow, &c.window_steps, kTuned,
       "W: rolling window and baseline length, in post-warmup steps (>= 10)"},
      {"", "resolve_after_steps", kCount, &c.resolve_after_steps, kTuned,
       "a level alert resolves after its condition was false this many steps"},
      {"change", "arl0", kAboveOne, &c.change.arl0, kInternal,
       "in-control average run length: steps between false alarms of one signal of a run that "
       "does not change (sets the CUSUM threshold)"},
      {"change", "resolve_ratio", kOpenFraction, &c.change.resolve_ratio, kInternal,
       "hysteresis: resolves once clearly below this fraction of the fire level"},
      {"change", "min_steps", kCount, &c.change.min_steps, kInternal,
       "a level shift must persist about this many steps (one value, a 4-6x excursion or a heavy "
       "tail, counts for at most 1/min_steps of the way)"},
      {"clip_fraction", "threshold", kFraction, &c.clip_fraction.threshold, kTuned,
       "clipped share above this: named by a CUSUM (tens of steps after a jump) or by the share "
       "over W"},
      {"clip_fraction", "min_steps", kCount, &c.clip_fraction.min_steps, kInternal,
       "steps in W before the windowed rule may fire"},
      {"clip_fraction", "recent_steps", kWindow, &c.clip_fraction.recent_steps, kInternal,
       "... and the last this many post-warmup steps clip above it too (clipping now, not a "
       "settling run's early hard batches) ..."},
      {"clip_fraction", "baseline_steps", kCount, &c.clip_fraction.baseline_steps, kInternal,
       "... and that share is > rise_ratio x the share over the first this many post-warmup "
       "steps (a rise) ..."},
      {"clip_fraction", "rise_ratio", kAboveOne, &c.clip_fraction.rise_ratio, kInternal,
       "... the factor of that rise ..."},
      {"clip_fraction", "settle_steps", kCount, &c.clip_fraction.settle_steps, kInternal,
       "... or the run has had this many post-warmup steps (clipping since the start, the clip "
       "acting as the LR, is named once the run has settled)"},
      {"spike", "sigmas", kPositive, &c.spike.sigmas, kTuned,
       "log norm >= EMA mean + sigmas * EMA sd ..."},
      {"spike", "min_ratio", kAboveOne, &c.spike.min_ratio, kTuned,
       "... and norm >= min_ratio * EMA geometric mean"},
      {"spike", "hard_ratio", kAboveOne, &c.spike.hard_ratio, kTuned,
       "or norm >= hard_ratio * EMA geometric mean alone"},
      {"spike", "ema_beta", kOpenFraction, &c.spike.ema_beta, kInternal,
       "EMA decay, in (0, 1)"},
      {"spike", "min_steps", kCount, &c.spike.min_steps, kInternal,
       "post-warmup steps before the EMA is trusted"},
      {"drift", "ratio", kAboveOne, &c.drift.ratio, kTuned,
       "the norm's level >= ratio * baseline median (first W steps), by CUSUM"},
      {"drift", "lr_decay_fraction", kFraction, &c.drift.lr_decay_fraction, kInternal,
       "LR below this fraction of its peak: a rise up to sqrt(fraction*peak/lr) is the "
       "end-of-schedule rise (AdamW), not drift"},
      {"loss_scale", "halvings", kCount, &c.loss_scale.halvings, kTuned,
       "this many decreases of the scale ..."},
      {"loss_scale", "within_steps", kCount, &c.loss_scale.within_steps, kTuned,
       "... within this many steps, with no growth between"},
      {"loss_scale", "min_scale", kPositive, &c.loss_scale.min_scale, kTuned,
       "or a scale below this"},
      {"loss_scale", "bleed_halvings", kCount, &c.loss_scale.bleed_halvings, kTuned,
       "or this many halvings with no growth since (a slow bleed; the description forecasts when "
       "it reaches min_scale)"},
      {"skip_rate", "threshold", kFraction, &c.skip_rate.threshold, kTuned,
       "skipped share above this: by CUSUM, or by the share over W"},
      {"skip_rate", "min_steps", kCount, &c.skip_rate.min_steps, kInternal,
       "steps in W before the windowed rule may fire"},
      {"scaler_stuck", "consecutive", kCount, &c.scaler_stuck.consecutive, kTuned,
       "skipped steps in a row with an unchanged loss scale"},
      {"clip_before_unscale", "steps", kCount, &c.clip_before_unscale.steps, kInternal,
       "recent fp16 steps looked at"},
      {"clip_before_unscale", "clip_fraction", kFraction, &c.clip_before_unscale.clip_fraction,
       kTuned,
       "clipped on at least this share of the recent fp16 steps ..."},
      {"clip_before_unscale", "min_norm_to_scale", kPositive,
       &c.clip_before_unscale.min_norm_to_scale, kTuned,
       "... and median norm / loss scale at least this"},
      {"post_clip", "min_steps", kCount, &c.post_clip.min_steps, kInternal,
       "steps in W before it may fire"},
      {"post_clip", "pile_fraction", kFraction, &c.post_clip.pile_fraction, kTuned,
       "share of W at exactly max_norm (and none above) ..."},
      {"post_clip", "min_pile", kCount, &c.post_clip.min_pile, kTuned,
       "... and at least this many such steps"},
      {"attention", "ratio", kAboveOne, &c.attention.ratio, kTuned,
       "the max logit's level >= ratio * baseline median, by CUSUM"},
      {"attention", "cap", kPositive, &c.attention.cap, kTuned,
       "or any max attention logit >= cap"},
      {"attention", "horizon_steps", kCount, &c.attention.horizon_steps, kInternal,
       "or its trend (Theil-Sen) reaches cap within this many steps"},
      {"log_z", "nats", kPositive, &c.log_z.nats, kTuned,
       "|log Z's level - baseline median| >= nats, either way, by CUSUM"},
      {"log_z", "horizon_steps", kCount, &c.log_z.horizon_steps, kInternal,
       "or its trend gets that far within this many steps"},
      {"log_z", "baseline_steps", kWindow, &c.log_z.baseline_steps, kInternal,
       "the baseline: median of the first this many post-warmup steps"},
      {"loss_spike", "sigmas", kPositive, &c.loss_spike.sigmas, kTuned,
       "a loss <= 0 somewhere (RL): loss >= recent level + sigmas * robust sd ..."},
      {"loss_spike", "log_sigmas", kPositive, &c.loss_spike.log_sigmas, kTuned,
       "all > 0 (LM, DPO): log loss >= its level + log_sigmas * robust sd of the logs ..."},
      {"loss_spike", "min_ratio", kAboveOne, &c.loss_spike.min_ratio, kTuned,
       "... and loss >= min_ratio * recent level"},
      {"loss_spike", "stay_steps", kCount, &c.loss_spike.stay_steps, kInternal,
       "a spike is high on this many steps ..."},
      {"loss_spike", "stay_window", kCount, &c.loss_spike.stay_window, kInternal,
       "... of this many from the first high one (fewer: a hard batch)"},
      {"loss_spike", "recent_steps", kWindow, &c.loss_spike.recent_steps, kInternal,
       "recent level: median of the last this many losses (>= 10)"},
      {"loss_divergence", "level_steps", kWindow, &c.loss_divergence.level_steps, kInternal,
       "the loss's level: the median of the last this many losses"},
      {"loss_divergence", "check_after_steps", kCount, &c.loss_divergence.check_after_steps,
       kInternal,
       "a spike is judged this many steps after its onset (spike_ratio)"},
      {"loss_divergence", "spike_ratio", kAboveOne, &c.loss_divergence.spike_ratio, kTuned,
       "a spike diverged if, check_after_steps after its onset, the level is still >= this x the "
       "level before it"},
      {"loss_divergence", "ratio", kAboveOne, &c.loss_divergence.ratio, kTuned,
       "a slow rise: the level >= this x the run's best post-warmup level (and sigmas above it, "
       "sustain_steps in a row)"},
      {"loss_divergence", "sigmas", kPositive, &c.loss_divergence.sigmas, kInternal,
       "a slow rise is >= this many of the level's standard errors (robust sd of the log losses "
       "/ sqrt(level_steps)) above the best ..."},
      {"loss_divergence", "sustain_steps", kCount, &c.loss_divergence.sustain_steps, kInternal,
       "... on this many steps in a row"},
      {"loss_divergence", "early_ratio", kAboveOne, &c.loss_divergence.early_ratio, kInternal,
       "a rise still under way: the level >= this x the best (and sigmas robust sd of the log "
       "losses above it) ..."},
      {"loss_divergence", "early_rise", kAboveOne, &c.loss_divergence.early_rise, kInternal,
       "... and >= this x the level level_steps steps before ..."},
      {"loss_divergence", "early_sustain_steps", kCount, &c.loss_divergence.early_sustain_steps,
       kInternal,
       "... on this many steps in a row"},
      {"loss_divergence", "resolve_ratio", kAboveOne, &c.loss_divergence.resolve_ratio, kInternal,
       "holds until the level is back under this x its reference"},
      {"rank_mismatch", "relative_spread", kOpenFraction, &c.rank_mismatch.relative_spread, kTuned,
       "(max - min) / max of grad_norm or clip_coef over ranks of one step"},
      {"rank_mismatch", "horizon_steps", kLag, &c.rank_mismatch.horizon_steps, kInternal,
       "ranks arriving up to this many steps apart are judged step by step (12 bytes a step of "
       "lag, per run)"},
      {"shard_mismatch", "relative_error", kOpenFraction, &c.shard_mismatch.relative_error, kTuned,
       "|sqrt(sum of shard_sq_sum) - norm| / norm"},
      {"ranks", "missing_after_seconds", kSeconds, &c.ranks.missing_after_seconds, kInternal,
       "a rank silent this long is missing: the checks stop waiting for it"},
      {"ranks", "max_pending_lead_records", kCount, &c.ranks.max_pending_lead_records, kInternal,
       "a would-be lead waiting for a lower rank keeps at most this many"},
      {"ranks", "max_pending_values", kCount, &c.ranks.max_pending_values, kInternal,
       "step times kept for steps not judged yet, over all ranks"},
      {"fp16_scaler", "steps", kCount, &c.fp16_scaler.steps, kInternal,
       "first steps of an fp16 run checked for a loss scale"},
      {"adam", "g_over_sqrt_v", kAboveOne, &c.adam.g_over_sqrt_v, kTuned,
       "AdamStaleSecondMoment: a layer's RMS of g/sqrt(v) at least this (about 1 when healthy) "
       "..."},
      {"adam", "jump_ratio", kAboveOne, &c.adam.jump_ratio, kTuned,
       "... and this times its median over its previous reports (min_reports of them, "
       "post-warmup)"},
      {"adam", "min_reports", kCount, &c.adam.min_reports, kInternal,
       "AdamStaleSecondMoment: a layer's previous reports needed, at least (post-warmup)"},
      {"adam", "eps_multiple", kPositive, &c.adam.eps_multiple, kTuned,
       "LayerUpdateStall: a layer's grad RMS at most eps_multiple * adam_eps (on stall_reports "
       "reports in a row) ..."},
      {"adam", "stall_reports", kCount, &c.adam.stall_reports, kInternal,
       "LayerUpdateStall: that low on this many layer_stats reports in a row"},
      {"adam", "collapse_ratio", kAboveOne, &c.adam.collapse_ratio, kTuned,
       "... or the median layer's update/weight RMS this many times below its post-warmup start "
       "(for collapse_fraction of the run)"},
      {"adam", "collapse_fraction", kFraction, &c.adam.collapse_fraction, kInternal,
       "LayerUpdateStall: a collapse lasts this share of the post-warmup steps so far (any "
       "optimizer)"},
      {"moe", "settle_steps", kCount, &c.moe.settle_steps, kInternal,
       "none judged in the first this many post-warmup steps (routers balance in ~150)"},
      {"moe", "level_reports", kCount, &c.moe.level_reports, kInternal,
       "a layer's level: the median of its last this many reports"},
      {"moe", "collapse_top_k_multiple", kAboveOne, &c.moe.collapse_top_k_multiple, kTuned,
       "MoeRouterCollapse: the fewest experts carrying 90% of the assignments <= this x top_k "
       "(at most half)"},
      {"moe", "dead_steps", kCount, &c.moe.dead_steps, kTuned,
       "MoeDeadExpert: an expert starved (no assignment on 90%+ of its reports) this many steps "
       "(over dead_min_reports reports)"},
      {"moe", "dead_min_reports", kCount, &c.moe.dead_min_reports, kInternal,
       "MoeDeadExpert: starved over at least this many reports"},
      {"moe", "imbalance", kAboveOne, &c.moe.imbalance, kTuned,
       "MoeImbalanceHigh: a layer's max/mean level >= this (or its trend gets there within "
       "horizon_steps)"},
      {"moe", "horizon_steps", kCount, &c.moe.horizon_steps, kInternal,
       "MoeImbalanceHigh: or its trend gets to imbalance within this many steps"},
      {"moe", "aux_high", kAboveOne, &c.moe.aux_high, kTuned,
       "MoeAuxLossOffBalance: the normalised aux loss >= this (with counts: and this - 1 above "
       "its settled level) ..."},
      {"moe", "aux_low", kFraction, &c.moe.aux_low, kTuned,
       "... or below this (the router games it)"},
      {"moe", "z_ratio", kAboveOne, &c.moe.z_ratio, kTuned,
       "MoeRouterZLossGrowth: z-loss (max router logit where none) >= this x its lowest level "
       "over z_growth_steps"},
      {"moe", "z_growth_steps", kCount, &c.moe.z_growth_steps, kInternal,
       "MoeRouterZLossGrowth: its lowest level over this many steps before the rise (a slow "
       "climb as the router learns is not a growth)"},
      {"moe", "persist_steps", kCount, &c.moe.persist_steps, kInternal,
       "MoeImbalanceHigh's line and MoeRouterZLossGrowth hold this many steps ..."},
      {"moe", "persist_reports", kCount, &c.moe.persist_reports, kInternal,
       "... and this many reports before they page (sooner back: an excursion)"},
      {"moe", "dropped_fraction", kFraction, &c.moe.dropped_fraction, kTuned,
       "MoeTokensDropped: dropped / assignments above this"},
      {"moe", "ep_ratio", kAboveOne, &c.moe.ep_ratio, kTuned,
       "MoeExpertParallelImbalance: max / mean EP rank's assignments >= this"},
      {"moe", "bias_mean_sd", kPositive, &c.moe.bias_mean_sd, kTuned,
       "MoeExpertBiasDrift: |mean bias| >= this x its spread across experts ..."},
      {"moe", "bias_flip_share", kFraction, &c.moe.bias_flip_share, kTuned,
       "... or its update flips sign on this share of the experts, report after report"},
      {"hazard", "enabled", kFlag, &c.hazard.enabled, kTuned,
       "off by default: held-out precision < 0.5 (docs/lab.md); true to switch it on"},
      {"hazard", "use_update_ratio", kFlag, &c.hazard.use_update_ratio, kInternal,
       "the precursor: true update_rms_ratio, false g/sqrt(v) RMS"},
      {"hazard", "window", kWindow, &c.hazard.window, kInternal,
       "a layer's level: the median of its last this many reports, a step apart"},
      {"hazard", "alpha", kNonNegative, &c.hazard.alpha, kInternal,
       "jump = ln(x / level) - alpha * ln(sqrt(1 / (1 - adam_beta2)))"},
      {"hazard", "theta", kAny, &c.hazard.theta, kTuned,
       "fires when the jump is at least this (ln 3.5) ..."},
      {"hazard", "min_layers", kCount, &c.hazard.min_layers, kTuned,
       "... in at least this many non-embedding layers"},
      {"hazard", "cooldown_steps", kCount, &c.hazard.cooldown_steps, kInternal,
       "after a fire, quiet for this many steps"},
      {"fp8", "overflow_fraction", kOpenFraction, &c.fp8.overflow_fraction, kTuned,
       "a report overflows above this saturated share ..."},
      {"fp8", "underflow_fraction", kOpenFraction, &c.fp8.underflow_fraction, kTuned,
       "... underflows above this flushed share (the alert holds on most of a tensor's last "
       "`reports` reports)"},
      {"fp8", "reports", kReports, &c.fp8.reports, kInternal,
       "Fp8Overflow and Fp8Underflow hold on most of a tensor's last this many reports"},
      {"fp8", "scale_ratio", kAboveOne, &c.fp8.scale_ratio, kTuned,
       "a scale this far from the recipe's, either way, on most tensors of a format"},
      {"fp8", "amax_spread", kOpenFraction, &c.fp8.amax_spread, kTuned,
       "relative spread of amax or scale across the ranks of one amax_group"},
      {"fp8", "growth_factor", kAboveOne, &c.fp8.growth_factor, kTuned,
       "amax forecast to reach this times its baseline (within horizon_steps)"},
      {"fp8", "horizon_steps", kCount, &c.fp8.horizon_steps, kInternal,
       "Fp8AmaxGrowth: the forecast looks this many steps ahead"},
      {"silent", "seconds", kSeconds, &c.silent.seconds, kTuned,
       "no step for this long from a run that has not finished"},
      {"finished_runs", "retention_seconds", kSeconds, &c.finished_runs.retention_seconds,
       kInternal,
       "keep their live health and series this long, then forget them (alerts still firing "
       "resolve; history stays stored)"},
      {"closed_loop", "max_rollbacks", kCount, &c.closed_loop.max_rollbacks, kTuned,
       "rollbacks per run, then Stop and ClosedLoopExhausted"},
      {"closed_loop", "min_steps_between", kCount, &c.closed_loop.min_steps_between, kInternal,
       "an alert this close to the last proposal in one attempt proposes nothing"},
      {"closed_loop", "lead_steps", kCount, &c.closed_loop.lead_steps, kInternal,
       "apply_at_step = highest step any rank reported + this"},
      {"straggler", "slack", kAboveOne, &c.timing.straggler.slack, kTuned,
       "CUSUM of log(rank / median rank) - log(slack): with threshold 3, a rank at 1.3x fires in "
       "~25 steps, 1.2x in ~70, 1.15x never"},
      {"straggler", "threshold", kPositive, &c.timing.straggler.threshold, kInternal,
       "the CUSUM fires at this"},
      {"straggler", "clip", kAboveOne, &c.timing.straggler.clip, kInternal,
       "one step counts at most this slow (checkpoints, evals)"},
      {"straggler", "ratio", kAboveOne, &c.timing.straggler.ratio, kInternal,
       "the ratio the alert is about (named in its text)"},
      {"straggler", "resolve_ratio", kAboveOne, &c.timing.straggler.resolve_ratio, kInternal,
       "firing holds while the rank's level is >= this x the median"},
      {"straggler", "min_ranks", kCount, &c.timing.straggler.min_ranks, kInternal,
       "ranks with step times needed for a median"},
      {"straggler", "warmup_records", kCount, &c.timing.straggler.warmup_records, kInternal,
       "a rank's first this many records are not judged"},
      {"input_stall", "fraction", kFraction, &c.timing.input_stall.fraction, kTuned,
       "median wait share over its last 32 steps that fires"},
      {"input_stall", "resolve_fraction", kFraction, &c.timing.input_stall.resolve_fraction,
       kInternal,
       "firing holds while the median stays >= this"},
      {"goodput", "gap_factor", kAboveOne, &c.timing.goodput.gap_factor, kTuned,
       "a gap > gap_factor x the typical step time ..."},
      {"goodput", "min_gap_seconds", kPositive, &c.timing.goodput.min_gap_seconds, kTuned,
       "... and > this is silent time"},
      {"spike_replay", "judge_after_steps", kCount, &c.timing.spike_replay.judge_after_steps,
       kInternal,
       "judged this many steps past the spike's step"},
      {"spike_replay", "tolerance_steps", kCount, &c.timing.spike_replay.tolerance_steps, kInternal,
       "a spike this close to the old one is its recurrence"},
      {"host_suspect", "window_seconds", kSeconds, &c.host_suspect.window_seconds, kTuned,
       "incidents within this long ..."},
      {"host_suspect", "min_runs", kCount, &c.host_suspect.min_runs, kTuned,
       "... from this many different runs name a host"},
  };
}

std::span<const WordKey> WordKeys() { return kWordKeys; }

absl::string_view GroupDoc(absl::string_view group) {
  for (const Group& g : kGroupDocs) {
    if (g.name == group) return g.doc;
  }
  return "";
}

std::vector<absl::string_view> Groups(const std::vector<Field>& fields) {
  std::vector<absl::string_view> groups;
  for (const Field& f : fields) {
    if (!f.group.empty() && std::find(groups.begin(), groups.end(), f.group) == groups.end()) {
      groups.push_back(f.group);
    }
  }
  return groups;
}

}  // namespace trainwatch
