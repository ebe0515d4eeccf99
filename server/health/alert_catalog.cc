#include "health/alert_catalog.h"

namespace trainwatch {
namespace {

using K = AlertKind;

constexpr std::string_view kMoeDetails =
    "Details (layers, experts, numbers): trainwatchctl alerts --run {{ "
    "$labels.run }} --active.";

constexpr std::array<AlertSpec, kAlertKindCount> kSpecs = {{
    {K::kClipFractionHigh, "ClipFractionHigh", v1::SEVERITY_WARNING,
     "The clip threshold is acting as a lower learning rate: gradients are "
     "larger than the threshold on many steps (LR too high, bad data, or a "
     "threshold set below the run's typical norm).",
     "Fix the learning rate or the data upstream rather than leaning on "
     "clipping; set max_norm from trainwatch_recommended_clip_threshold (98th "
     "percentile of pre-clip norms).",
     "more than 5% of steps clipped, and rising (or still so once the "
     "run has settled, 1000 post-warmup steps): the threshold acts as a "
     "lower LR",
     {"grad_norm", "clip_fraction"},
     {.kind = AlertRuleKind::kValued,
      .summary = "Clip fraction high on run {{ $labels.run }}",
      .value = "trainwatch_clip_fraction",
      .description =
          "{{ $value | humanizePercentage }} of the last window's steps of "
          "run {{ $labels.run }} were clipped (threshold 5%); max_norm {{ "
          "with printf \"trainwatch_clip_threshold{run=%q}\" $labels.run | "
          "query }}{{ . | first | value | printf \"%.4g\" }}{{ else }}n/a{{ "
          "end }}, recommended {{ with printf "
          "\"trainwatch_recommended_clip_threshold{run=%q}\" $labels.run | "
          "query }}{{ . | first | value | printf \"%.4g\" }}{{ else }}n/a{{ "
          "end }}."},
     AlertScope::kLead, {K::kLossDivergence, K::kLossSpike, K::kLossScaleCollapse, K::kNonFiniteUpdate}},
    {K::kPostClipNormReported, "PostClipNormReported", v1::SEVERITY_WARNING,
     "The reported norm is the post-clip norm (it never exceeds max_norm and "
     "piles up at exactly max_norm), so clipping and spikes are invisible.",
     "Report the value returned by clip_grad_norm_ (the pre-clip norm).",
     "the logged norm is the post-clip one",
     {"grad_norm", "clip_fraction"},
     {.summary = "Run {{ $labels.run }} reports the post-clip norm",
      .quote_label = "max_norm",
      .quote = "trainwatch_clip_threshold{run=%q}"}},
    {K::kGradNormSpike, "GradNormSpike", v1::SEVERITY_INFO,
     "An isolated gradient spike: usually a bad or unusual batch, or an "
     "out-of-date Adam second moment meeting a large gradient. Clipping "
     "usually absorbs it: when the loss does not move, nothing needs doing.",
     "If loss also jumped (LossSpike), restart from the last checkpoint ~100 "
     "steps before the spike and skip the batches listed (trainwatchctl "
     "spikes --run R).",
     "the pre-clip norm jumps far above its recent level (recorded with "
     "batch ids; clipping usually absorbs it)",
     {},
     {.summary = "Gradient norm spike on run {{ $labels.run }}",
      .quote_label = "last pre-clip norm",
      .quote = "trainwatch_grad_norm{run=%q}",
      // Clipping usually absorbs it: what follows it (a stale second moment
      // at a corrupted batch) is the one page.
      .inhibits = false},
     AlertScope::kLead, {K::kLossSpike, K::kLossDivergence}},
    {K::kGradNormDrift, "GradNormDrift", v1::SEVERITY_WARNING,
     "The typical gradient norm has grown steadily since the start of "
     "training: rising sharpness, a learning rate too high for this phase, or "
     "growing weights.",
     "Lower the learning rate or add warmup/decay; check weight decay and "
     "data mixture changes around the step it started.",
     "the norm's level has doubled over its baseline",
     {},
     {.summary = "Gradient norm drifting up on run {{ $labels.run }}",
      .quote_label = "window median norm",
      .quote = "trainwatch_grad_norm_window{run=%q,percentile=\\\"50\\\"}"},
     AlertScope::kLead, {K::kLossDivergence, K::kLossSpike, K::kLossScaleCollapse, K::kNonFiniteUpdate}},
    {K::kLossSpike, "LossSpike", v1::SEVERITY_INFO,
     "The loss jumped far above its recent level for a few steps: the PaLM / "
     "BLOOM kind of loss spike (hard or bad batches meeting an out-of-date "
     "Adam second moment, or an LR too high for this phase). Most recover "
     "by themselves; one that does not becomes a LossDivergence.",
     "Nothing while the loss comes back. Note the batches listed "
     "(trainwatchctl spikes --run R); if spikes recur, lower the LR or "
     "beta2 (0.95), add warmup or qk-layernorm.",
     "the loss jumps far above its recent level for a few steps "
     "(recorded with batch ids and restart plan)",
     {"grad_norm", "loss"},
     {.summary = "Loss spike on run {{ $labels.run }}",
      .quote_label = "last loss",
      .quote = "trainwatch_loss{run=%q}",
      .details =
          "Details (numbers, step range, batch ids, restart plan): "
          "trainwatchctl alerts --run {{ $labels.run }} --active; "
          "trainwatchctl spikes --run {{ $labels.run }}."},
     AlertScope::kLead, {}, /*implicates_host=*/true},
    {K::kSpikeHazard, "SpikeHazard", v1::SEVERITY_WARNING,
     "A loss spike is likely within the next few steps: a layer's Adam second "
     "moment is out of date for its gradient (RMS of g^2/v) or its update "
     "jumped far above its own level, the precursor of loss spikes in "
     "small-scale proxies and large runs.",
     "Watch the next steps' loss; if it spikes, restart from the last "
     "checkpoint and skip the batches (trainwatchctl spikes). If hazards "
     "recur: lower beta2 (0.95), add warmup or lower the LR, add "
     "qk-layernorm, or clip updates.",
     "off by default (held-out precision 0.41, recall 0.24): a loss "
     "spike likely within a few steps, update norms jumping in several "
     "layers at once (layer stats every step)",
     {},
     {.summary = "Loss spike likely soon on run {{ $labels.run }}",
      .quote_label = "loss",
      .quote = "trainwatch_loss{run=%q}"}},
    {K::kLossDivergence, "LossDivergence", v1::SEVERITY_CRITICAL,
     "The loss left its level and did not come back: a spike whose loss "
     "stayed up, or a slow rise to twice the run's best level (a learning "
     "rate too high for this phase, an optimizer state gone bad, or bad "
     "data); the steps since are wasted.",
     "Restart from the last checkpoint before the onset (trainwatchctl plan "
     "--run R), skip the spike's batches if it had any, and lower the LR "
     "(or beta2); if it diverges again without those batches, the LR or the "
     "optimizer state is the cause, not the data.",
     "the loss did not come back: a spike that stayed up, or a rise to "
     "2x its best level (named at 1.5x while it still climbs); restart "
     "plan attached",
     {"loss"},
     {.summary = "Loss diverged on run {{ $labels.run }}",
      .quote_label = "last loss",
      .quote = "trainwatch_loss{run=%q}",
      .details =
          "Details (onset, level, restart plan): trainwatchctl alerts --run "
          "{{ $labels.run }} --active; trainwatchctl plan --run {{ "
          "$labels.run }}."},
     // An MoE router gone wrong is the root of a loss that follows it; a
     // spike under way, of one without.
     AlertScope::kLead, {K::kMoeRouterCollapse, K::kMoeRouterZLossGrowth, K::kLossSpike},
     /*implicates_host=*/false, /*has_restart_plan=*/true},
    {K::kBaselineDeviation, "BaselineDeviation", v1::SEVERITY_WARNING,
     "The run left the band of its reference runs (its previous attempt, or "
     "runs of the same recipe) at the same tokens or step: something changed "
     "between them, the data (a shard, the mixture, the order), the learning "
     "rate or schedule, the batch size, or a kernel or library version.",
     "Compare the run with its baselines (trainwatchctl compare --run R) from "
     "the step it left the band, and diff the two runs' configs, data and "
     "code there; if the change is meant, set new baselines (trainwatchctl "
     "baseline set).",
     "the loss left its reference runs' band at the same tokens or step, "
     "for 2 bins of 20 steps, or at another LR than theirs sits 2 sds above "
     "them (the grad norm, log Z and attention logit out too are named "
     "with it); info: better than the band (not for another batch size "
     "than theirs), or by step a loss below its centre by over a band sd "
     "bin after bin with its grad norm below theirs too, or a grad norm out "
     "of its band (another batch size?)",
     {"loss"},
     {.summary = "Run {{ $labels.run }} left its baseline's band",
      .quote_label = "last loss",
      .quote = "trainwatch_loss{run=%q}",
      .details = "Details (the baseline, the axis, the step it left the band): "
                 "trainwatchctl alerts --run {{ $labels.run }} --active; trainwatchctl "
                 "compare --run {{ $labels.run }}."},
     // A spike or a divergence under way is the page; the deviation is its
     // consequence at the same steps.
     AlertScope::kLead, {K::kLossDivergence, K::kLossSpike}},
    {K::kLossScaleCollapse, "LossScaleCollapse", v1::SEVERITY_CRITICAL,
     "The fp16 loss scale falls step after step: gradients overflow on every "
     "step, which usually means the run is diverging.",
     "Restart from an earlier checkpoint with a lower learning rate, or move "
     "to bf16.",
     "the fp16 loss scale keeps halving: divergence",
     {"loss_scale"},
     {.summary = "FP16 loss scale collapsing on run {{ $labels.run }}",
      .quote_label = "loss scale",
      .quote = "trainwatch_loss_scale{run=%q}"},
     AlertScope::kLead, {}, /*implicates_host=*/false, /*has_restart_plan=*/true},
    {K::kSkipRateHigh, "SkipRateHigh", v1::SEVERITY_WARNING,
     "Many optimizer steps are skipped for inf/NaN gradients: the fp16 range "
     "is exceeded often (activations or gradients too large).",
     "Lower the learning rate, check for overflow-prone layers, or use bf16.",
     "more than 1% of fp16 steps skipped",
     {"loss_scale"},
     {.summary = "Many skipped optimizer steps on run {{ $labels.run }}",
      .quote_label = "skipped fraction over the window",
      .quote = "trainwatch_skip_fraction{run=%q}",
      .format = "humanizePercentage"},
     AlertScope::kLead, {K::kLossScaleCollapse}},
    {K::kScalerStuck, "ScalerStuck", v1::SEVERITY_CRITICAL,
     "Steps are skipped but the loss scale never drops: scaler.update() is "
     "only called on clean steps, so the scaler cannot recover.",
     "Call scaler.update() after every scaler.step(), including skipped ones.",
     "skipped steps without the loss scale moving",
     {"loss_scale"},
     {.summary = "GradScaler stuck on run {{ $labels.run }}",
      .quote_label = "loss scale",
      .quote = "trainwatch_loss_scale{run=%q}"},
     AlertScope::kLead, {}, /*implicates_host=*/false, /*has_restart_plan=*/true},
    {K::kClipBeforeUnscale, "ClipBeforeUnscale", v1::SEVERITY_CRITICAL,
     "Clipping runs on the scaled fp16 gradients: the norm tracks the loss "
     "scale and every step is clipped, so the effective learning rate is tiny.",
     "Call scaler.unscale_(optimizer) before clip_grad_norm_.",
     "clipping scaled gradients: call `scaler.unscale_` first",
     {"grad_norm", "clip_fraction", "loss_scale"},
     {.summary = "Clipping before unscale on run {{ $labels.run }}",
      .quote_label = "loss scale",
      .quote = "trainwatch_loss_scale{run=%q}"}},
    {K::kFp16WithoutScaler, "Fp16WithoutScaler", v1::SEVERITY_WARNING,
     "An fp16 run without dynamic loss scaling: small gradients flush to "
     "zero and large ones overflow.",
     "Use torch.cuda.amp.GradScaler (or bf16), and report its scale.",
     "fp16 without a loss scaler",
     {"loss_scale"},
     {.summary = "FP16 without a loss scaler on run {{ $labels.run }}",
      .quote_label = "loss scale",
      .quote = "trainwatch_loss_scale{run=%q}"}},
    {K::kNonFiniteUpdate, "NonFiniteUpdate", v1::SEVERITY_CRITICAL,
     "A NaN or Inf gradient norm or loss on a step that was applied: the "
     "weights may now be corrupted.",
     "Stop and restart from the last good checkpoint; make sure inf/NaN "
     "steps are skipped (GradScaler, or a check before optimizer.step()).",
     "NaN/Inf norm or loss on a step that was applied",
     {"grad_norm", "loss"},
     {.summary = "NaN/Inf applied to the weights of run {{ $labels.run }}",
      .quote_label = "non-finite steps so far",
      .quote = "trainwatch_nonfinite_steps_total{run=%q}"},
     AlertScope::kLead, {K::kLossScaleCollapse}, /*implicates_host=*/true,
     /*has_restart_plan=*/true},
    {K::kFp8Overflow, "Fp8Overflow", v1::SEVERITY_WARNING,
     "FP8 values saturate at the format's max: the tensor's scale lags its "
     "amax (a delayed-scaling history too long for how fast the amax grows, "
     "or a margin too small), so its largest values are clipped in the cast.",
     "Raise the margin (each +1 halves the scale: 2x headroom) or shorten "
     "amax_history_len when the amax moves fast; keep the tensor in bf16 if "
     "it keeps saturating.",
     "FP8 values saturate: a tensor's scale lags its amax",
     {"fp8_scaled", "fp8_shares"},
     {.summary = "FP8 values saturate on run {{ $labels.run }}",
      .quote_label = "worst FP8 overflow share",
      .quote = "trainwatch_fp8_overflow_fraction{run=%q}"},
     AlertScope::kLead, {K::kFp8ScaleMismatch, K::kFp8AmaxDesync}},
    {K::kFp8Underflow, "Fp8Underflow", v1::SEVERITY_WARNING,
     "Most of an FP8 tensor's values flush to zero in the cast: its scale is "
     "too small for its bulk (a margin too large, an old outlier held in "
     "the amax history, or outliers that outgrew the bulk).",
     "Lower the margin or shorten the amax history; if one outlier feature "
     "dominates the amax (Fp8AmaxGrowth), fix the outliers (Smooth-SwiGLU, a "
     "lower LR) or use finer-grained (block) scaling.",
     "most of an FP8 tensor's values flush to zero",
     {"fp8_scaled", "fp8_shares"},
     {.summary = "FP8 values flush to zero on run {{ $labels.run }}",
      .quote_label = "worst FP8 underflow share",
      .quote = "trainwatch_fp8_underflow_fraction{run=%q}"},
     AlertScope::kLead, {K::kFp8AmaxGrowth, K::kFp8ScaleMismatch}},
    {K::kFp8ScaleMismatch, "Fp8ScaleMismatch", v1::SEVERITY_CRITICAL,
     "FP8 scales disagree with what the recipe implies from the amax "
     "(fmt_max / max(amax history) / 2^margin): the wrong format maximum, "
     "e.g. E4M3's 448 used for E4M3_FNUZ (240) on ROCm or the reverse, or a "
     "scale computed by other code than the recipe says.",
     "Use the format maximum of the FP8 type the casts really use (E4M3 448, "
     "E4M3_FNUZ 240, E5M2 and E5M2_FNUZ 57344); check the Transformer "
     "Engine build matches the hardware.",
     "FP8 scales off the recipe on most tensors: the wrong format max "
     "(448 for E4M3_FNUZ)",
     {"fp8_scaled"},
     {.summary = "FP8 scales do not match the recipe on run {{ $labels.run }}",
      .quote_label = "worst amax x scale / format max",
      .quote = "trainwatch_fp8_scaled_amax_ratio{run=%q}"}},
    {K::kFp8AmaxDesync, "Fp8AmaxDesync", v1::SEVERITY_CRITICAL,
     "Ranks of one amax reduction group report different amax or scale for "
     "one FP8 tensor at one step: the amax is reduced over the wrong process "
     "group (or not at all), so tensor-parallel shards cast with different "
     "scales. Runs like this diverge.",
     "Reduce the amax over the tensor-parallel group (Transformer Engine: "
     "fp8_group / amax_reduction_group, Megatron's tp group), then restart "
     "from a checkpoint before the desync.",
     "ranks of one amax group report different amax or scale: reduce "
     "over the TP group",
     {"fp8_scaled"},
     {.summary = "FP8 amax not synchronised across the ranks of run {{ $labels.run "
        "}}"},
     AlertScope::kAcrossRanks},
    {K::kFp8AmaxGrowth, "Fp8AmaxGrowth", v1::SEVERITY_WARNING,
     "An FP8 tensor's amax grows steadily and is forecast to reach 100x its "
     "early level: outliers outgrowing the tensor's bulk (as with SwiGLU "
     "weight alignment late in long runs). Per-tensor scaling follows the "
     "outliers, and the bulk will underflow.",
     "Smooth-SwiGLU or another outlier fix, a lower learning rate or more "
     "weight decay; or keep the tensor in bf16, or use block scaling.",
     "an FP8 tensor's amax forecast to reach 100x its baseline: "
     "outliers outgrowing the bulk",
     {"fp8_scaled"},
     {.summary = "FP8 amax growing on run {{ $labels.run }}"}},
    {K::kAttentionLogitGrowth, "AttentionLogitGrowth", v1::SEVERITY_WARNING,
     "Attention logits are growing (query/key norms blow up), a known path to "
     "loss spikes and divergence in large models.",
     "Add qk-layernorm or logit soft-capping (QK-clip), or lower the learning "
     "rate.",
     "max attention logits growing toward the cap",
     {"max_attn_logit"},
     {.summary = "Attention logits growing on run {{ $labels.run }}",
      .quote_label = "max attention logit",
      .quote = "trainwatch_max_attention_logit{run=%q}"}},
    {K::kLogZDrift, "LogZDrift", v1::SEVERITY_WARNING,
     "The output softmax normalizer log Z is drifting: output logits grow or "
     "shrink without bound.",
     "Add a z-loss (e.g. 1e-4 * log Z^2) and check weight decay on the output "
     "layer.",
     "the softmax normaliser drifting away from 0: z-loss, weight decay",
     {"log_z"},
     {.summary = "Output log Z drifting on run {{ $labels.run }}",
      .quote_label = "log Z",
      .quote = "trainwatch_log_z{run=%q}"}},
    {K::kAdamStaleSecondMoment, "AdamStaleSecondMoment", v1::SEVERITY_WARNING,
     "A layer's g/sqrt(v) is far above 1: its Adam second moment is out of "
     "date, and a loss spike tends to follow within a few steps.",
     "Lower beta2 (e.g. 0.95), or clip the update (update clipping).",
     "a layer's g/sqrt(v) jumps: out-of-date second moment",
     {},
     {.summary = "Stale Adam second moment on run {{ $labels.run }}"},
     AlertScope::kLead, {K::kLossSpike, K::kGradNormSpike, K::kLossDivergence}},
    {K::kLayerUpdateStall, "LayerUpdateStall", v1::SEVERITY_WARNING,
     "Updates vanish: a layer's gradient RMS is near Adam's eps, or the "
     "whole model's updates collapsed far below where they started (an LR "
     "schedule gone to ~0 mid-run, gradients that died); the description "
     "says which.",
     "Near eps: use a smaller eps (e.g. 1e-15 for large models). Collapsed "
     "with the LR: check the schedule's length, decay and min_lr against the "
     "run's steps. Collapsed without it: look for frozen or dead layers and a "
     "loss that stopped moving.",
     "a layer's gradient RMS near Adam's eps, or the model's updates "
     "collapsed 100x (an LR schedule gone to ~0 mid-run)",
     {},
     {.summary = "A layer's updates vanish on run {{ $labels.run }}"}},
    {K::kRankNormMismatch, "RankNormMismatch", v1::SEVERITY_CRITICAL,
     "Ranks report different gradient norms or clip coefficients for one "
     "step: clipping uses each shard's local norm (per-shard clipping).",
     "Compute the norm over all ranks before clipping (clip_grad_norm_ on the "
     "FSDP/DDP module, or all-reduce the squared norm).",
     "ranks disagree on the norm: per-shard clipping",
     {},
     {.summary = "Ranks disagree on the gradient norm of run {{ $labels.run }}"},
     AlertScope::kAcrossRanks},
    {K::kShardNormMismatch, "ShardNormMismatch", v1::SEVERITY_CRITICAL,
     "The shards' squared sums do not add up to the reported norm: squares "
     "not reduced across a group, or replicated parameters counted more than "
     "once.",
     "Reduce squared norms over the right process groups and count "
     "replicated (tensor-parallel-duplicated) parameters once.",
     "shard norms do not add up to the global norm",
     {},
     {.summary = "Shard norms do not add up on run {{ $labels.run }}"},
     AlertScope::kAcrossRanks},
    {K::kRunSilent, "RunSilent", v1::SEVERITY_WARNING,
     "No step arrived for a while from a run that has not finished: the job "
     "hung, crashed, or lost its connection to trainwatch.",
     "Check the job's processes and logs; if it crashed, restart from the "
     "last checkpoint.",
     "no step for 300 s from a run that has not finished",
     {},
     {.kind = AlertRuleKind::kCustom},
     AlertScope::kClock},
    {K::kRankStraggler, "RankStraggler", v1::SEVERITY_WARNING,
     "One rank's steps take longer than the others' and every rank waits for "
     "it: a throttled or failing GPU, a slow host (CPU contention, a noisy "
     "neighbour), a degraded network link, or an uneven data shard.",
     "Look at the named host (nvidia-smi clocks and temperature, dmesg, "
     "DCGM diagnostics); drain it and restart the run without it if it stays "
     "slow.",
     "one rank's step time stays >= 20% above the median rank's: names "
     "rank and host",
     {},
     {.summary = "A slow rank holds back run {{ $labels.run }}",
      .quote_label = "share of step time lost to the slowest rank",
      .quote = "trainwatch_straggler_lost_fraction{run=%q}",
      .format = "printf \"%.3g\"",
      .details =
          "Rank and host: trainwatchctl alerts --run {{ $labels.run }} "
          "--active; per-rank step times: trainwatchctl health --run {{ "
          "$labels.run }}."},
     AlertScope::kAcrossRanks, {K::kMoeExpertParallelImbalance},
     /*implicates_host=*/true},
    {K::kInputPipelineStall, "InputPipelineStall", v1::SEVERITY_WARNING,
     "The training loop waits for its input pipeline: too few loader "
     "workers, slow storage or network reads, heavy preprocessing on the "
     "critical path.",
     "Add DataLoader workers and prefetching (prefetch_factor, "
     "pin_memory), cache or pre-tokenize the data, move preprocessing off "
     "the training process.",
     "the lead rank waits for input >= 20% of its step time, sustained",
     {},
     {.summary = "Input pipeline stalls run {{ $labels.run }}",
      .quote_label = "share of step time waiting for data",
      .quote = "trainwatch_data_wait_fraction{run=%q}",
      .format = "printf \"%.3g\"",
      .details =
          "Details: trainwatchctl alerts --run {{ $labels.run }} --active."}},
    {K::kHostSuspect, "HostSuspect", v1::SEVERITY_WARNING,
     "A lemon machine: a GPU with failing memory or silent data corruption, "
     "a throttled or mis-seated card, a bad NIC: different runs fail on it in "
     "the same ways.",
     "Drain the host from the scheduler, run the vendor diagnostics (DCGM "
     "level 3, memory tests), and restart the affected runs elsewhere from "
     "their last checkpoints.",
     "one host named by failures of >= 2 runs within 24 h: a lemon "
     "machine",
     {},
     {.kind = AlertRuleKind::kCustom},
     AlertScope::kServer},
    {K::kMoeRouterCollapse, "MoeRouterCollapse", v1::SEVERITY_CRITICAL,
     "An MoE layer's router sends (almost) every token to the same few "
     "experts: the rest stop learning and the layer is a dense one of their "
     "size. The load-balancing loss is off or too weak, an aux-free bias is "
     "disabled, or an LR spike pushed the router into a corner.",
     "Restart from a checkpoint before the onset with the balancing on (aux "
     "loss coefficient 1e-2, or the aux-free bias with its update on) and a "
     "lower LR for the router; check the router's init (small, not zero).",
     "MoE: a layer's routing collapsed onto a few experts (90% of its "
     "assignments on <= 2 x top_k experts)",
     {},
     {.summary = "MoE routing collapsed on run {{ $labels.run }}",
      .details = kMoeDetails},
     AlertScope::kLead, {}},
    {K::kMoeDeadExpert, "MoeDeadExpert", v1::SEVERITY_WARNING,
     "An expert gets no token in the global batch for a long stretch: its "
     "router logit fell behind the others' and it no longer learns (a "
     "collapse's precursor).",
     "Check the balancing (aux loss coefficient, aux-free bias update); "
     "re-initialise the dead expert's router row or restart from a "
     "checkpoint before it died.",
     "MoE: an expert gets (almost) no token for >= 100 post-warmup steps: "
     "names layer and experts",
     {},
     {.summary = "MoE experts are dead on run {{ $labels.run }}",
      .details = kMoeDetails},
     AlertScope::kLead, {K::kMoeRouterCollapse}},
    {K::kMoeImbalanceHigh, "MoeImbalanceHigh", v1::SEVERITY_WARNING,
     "An MoE layer's load is uneven: its hottest expert takes twice the mean "
     "or more, sustained. The hot expert's rank runs slower and its memory "
     "grows (tokens over capacity are dropped).",
     "Raise the load-balancing loss coefficient (or the aux-free bias "
     "update rate); if the data is one domain, some skew is expected.",
     "MoE: a layer's load max/mean stays >= 2, risen from where it "
     "settled, or is forecast to",
     {},
     {.summary = "MoE load is uneven on run {{ $labels.run }}",
      .details = kMoeDetails},
     AlertScope::kLead, {K::kMoeRouterCollapse, K::kMoeExpertParallelImbalance}},
    {K::kMoeAuxLossOffBalance, "MoeAuxLossOffBalance", v1::SEVERITY_WARNING,
     "The normalised load-balancing loss stays away from 1.0 (balance): "
     "above it, the balancing is losing to the router; below 0.9, the router "
     "games the loss (sigmoid scores under too large a normaliser epsilon).",
     "Above: raise its coefficient or check it is applied. Below: check the "
     "score function and the normaliser's epsilon, and that the loss is "
     "computed over the global batch.",
     "MoE: the normalised balancing loss stays >= 1.2, or below 0.9 "
     "(the router games it)",
     {},
     {.summary = "MoE balancing loss is off balance on run {{ $labels.run }}",
      .details = kMoeDetails},
     AlertScope::kLead,
     {K::kMoeRouterCollapse, K::kMoeDeadExpert, K::kMoeRouterZLossGrowth}},
    {K::kMoeRouterZLossGrowth, "MoeRouterZLossGrowth", v1::SEVERITY_WARNING,
     "The router's logits run away (z-loss, or max router logit, 2x its "
     "low of the last 500 steps): bf16 round-off in the router's softmax, "
     "then unstable routing. A router that sharpens slowly as it learns is "
     "not this.",
     "Add a router z-loss (coefficient 1e-3) and keep the router in fp32.",
     "MoE: the router z-loss doubles within 500 steps: add z-loss, "
     "keep the router in fp32",
     {},
     {.summary = "MoE router logits grow on run {{ $labels.run }}",
      .details = kMoeDetails},
     AlertScope::kLead, {}},
    {K::kMoeExpertBiasDrift, "MoeExpertBiasDrift", v1::SEVERITY_WARNING,
     "The aux-loss-free balancing bias drifts: its mean moves away from 0 "
     "(the update is not re-centred) or it flips sign report after report "
     "while the load does not even out (the update rate is too high).",
     "Re-centre the bias after each update (subtract its mean) and lower "
     "the bias update rate (1e-3).",
     "MoE, aux-free balancing: the expert bias drifts from 0 or flips "
     "sign report after report",
     {},
     {.summary = "MoE expert bias drifts on run {{ $labels.run }}",
      .details = kMoeDetails},
     AlertScope::kLead, {}},
    {K::kMoeTokensDropped, "MoeTokensDropped", v1::SEVERITY_WARNING,
     "More than 1% of the routed assignments go over their expert's capacity "
     "and are dropped (Switch: typically < 1%); those tokens skip the layer.",
     "Raise the capacity factor (1.25 for training, 2.0 for eval) or go "
     "dropless; if the load is uneven (MoeImbalanceHigh), balance it first.",
     "MoE: more than 1% of the routed assignments dropped past capacity",
     {},
     {.summary = "MoE drops tokens on run {{ $labels.run }}",
      .details = kMoeDetails},
     AlertScope::kLead, {K::kMoeRouterCollapse, K::kMoeImbalanceHigh}},
    {K::kMoeExpertParallelImbalance, "MoeExpertParallelImbalance",
     v1::SEVERITY_WARNING,
     "One expert-parallel rank's block of experts carries far more tokens "
     "than the mean rank's: that rank is the slowest every step (and the "
     "first out of memory).",
     "Balance the experts (see MoeImbalanceHigh), or place the hot experts "
     "on different EP ranks.",
     "MoE with ep_size > 1: one expert-parallel rank carries >= 1.5x "
     "the mean rank's load: names it",
     {},
     {.summary = "An expert-parallel rank is overloaded on run {{ $labels.run }}",
      .details = kMoeDetails},
     AlertScope::kLead, {K::kMoeRouterCollapse}},
    {K::kClosedLoopExhausted, "ClosedLoopExhausted", v1::SEVERITY_CRITICAL,
     "The closed loop rolled the run back closed_loop.max_rollbacks times and "
     "the same alert came back each time: the fault is not in the batches it "
     "skipped (the data's content, the model, or a learning rate too high for "
     "the recipe).",
     "Approve the proposed stop (or hold the run), then find the cause by "
     "hand: trainwatchctl directives --run R lists every rollback and why; "
     "look at the data at those steps and the last change to the recipe "
     "before relaunching.",
     "the closed loop's rollbacks ran out: a person must look",
     {},
     {.summary = "Closed loop exhausted on run {{ $labels.run }}",
      .details = "Details (the rollbacks, the proposed stop): trainwatchctl directives "
                 "--run {{ $labels.run }}."},
     AlertScope::kServer},
}};

// The table is in the enum's order, so that Spec() is an index.
constexpr bool InEnumOrder() {
  for (size_t i = 0; i < kSpecs.size(); ++i) {
    if (static_cast<size_t>(kSpecs[i].kind) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kSpecs must list the alerts in AlertKind's order");

}  // namespace

const AlertSpec& Spec(AlertKind kind) {
  return kSpecs[static_cast<size_t>(kind)];
}

const std::array<AlertSpec, kAlertKindCount>& AllAlertSpecs() { return kSpecs; }

std::optional<AlertKind> AlertKindByName(std::string_view name) {
  for (const AlertSpec& s : kSpecs) {
    if (s.name == name) return s.kind;
  }
  return std::nullopt;
}

}  // namespace trainwatch
