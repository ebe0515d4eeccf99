#include "health/alert_catalog.h"

namespace trainwatch {
namespace {

using K = AlertKind;

constexpr std::array<AlertSpec, kAlertKindCount> kSpecs = {{
    {K::kClipFractionHigh, "ClipFractionHigh", v1::SEVERITY_WARNING,
     "The clip threshold is acting as a lower learning rate: gradients are "
     "larger than the threshold on many steps (LR too high, bad data, or a "
     "threshold set below the run's typical norm).",
     "Fix the learning rate or the data upstream rather than leaning on "
     "clipping; set max_norm from trainwatch_recommended_clip_threshold (98th "
     "percentile of pre-clip norms).",
     AlertScope::kLead, {K::kLossDivergence, K::kLossSpike, K::kLossScaleCollapse, K::kNonFiniteUpdate}},
    {K::kGradNormSpike, "GradNormSpike", v1::SEVERITY_INFO,
     "An isolated gradient spike: usually a bad or unusual batch, or an "
     "out-of-date Adam second moment meeting a large gradient. Clipping "
     "usually absorbs it: when the loss does not move, nothing needs doing.",
     "If loss also jumped (LossSpike), restart from the last checkpoint ~100 "
     "steps before the spike and skip the batches listed (trainwatchctl "
     "spikes --run R).",
     AlertScope::kLead, {K::kLossSpike, K::kLossDivergence}},
    {K::kGradNormDrift, "GradNormDrift", v1::SEVERITY_WARNING,
     "The typical gradient norm has grown steadily since the start of "
     "training: rising sharpness, a learning rate too high for this phase, or "
     "growing weights.",
     "Lower the learning rate or add warmup/decay; check weight decay and "
     "data mixture changes around the step it started.",
     AlertScope::kLead, {K::kLossDivergence, K::kLossSpike, K::kLossScaleCollapse, K::kNonFiniteUpdate}},
    {K::kLossScaleCollapse, "LossScaleCollapse", v1::SEVERITY_CRITICAL,
     "The fp16 loss scale falls step after step: gradients overflow on every "
     "step, which usually means the run is diverging.",
     "Restart from an earlier checkpoint with a lower learning rate, or move "
     "to bf16."},
    {K::kSkipRateHigh, "SkipRateHigh", v1::SEVERITY_WARNING,
     "Many optimizer steps are skipped for inf/NaN gradients: the fp16 range "
     "is exceeded often (activations or gradients too large).",
     "Lower the learning rate, check for overflow-prone layers, or use bf16.",
     AlertScope::kLead, {K::kLossScaleCollapse}},
    {K::kScalerStuck, "ScalerStuck", v1::SEVERITY_CRITICAL,
     "Steps are skipped but the loss scale never drops: scaler.update() is "
     "only called on clean steps, so the scaler cannot recover.",
     "Call scaler.update() after every scaler.step(), including skipped ones."},
    {K::kNonFiniteUpdate, "NonFiniteUpdate", v1::SEVERITY_CRITICAL,
     "A NaN or Inf gradient norm or loss on a step that was applied: the "
     "weights may now be corrupted.",
     "Stop and restart from the last good checkpoint; make sure inf/NaN "
     "steps are skipped (GradScaler, or a check before optimizer.step()).",
     AlertScope::kLead, {K::kLossScaleCollapse}, /*implicates_host=*/true},
    {K::kClipBeforeUnscale, "ClipBeforeUnscale", v1::SEVERITY_CRITICAL,
     "Clipping runs on the scaled fp16 gradients: the norm tracks the loss "
     "scale and every step is clipped, so the effective learning rate is tiny.",
     "Call scaler.unscale_(optimizer) before clip_grad_norm_."},
    {K::kPostClipNormReported, "PostClipNormReported", v1::SEVERITY_WARNING,
     "The reported norm is the post-clip norm (it never exceeds max_norm and "
     "piles up at exactly max_norm), so clipping and spikes are invisible.",
     "Report the value returned by clip_grad_norm_ (the pre-clip norm)."},
    {K::kAttentionLogitGrowth, "AttentionLogitGrowth", v1::SEVERITY_WARNING,
     "Attention logits are growing (query/key norms blow up), a known path to "
     "loss spikes and divergence in large models.",
     "Add qk-layernorm or logit soft-capping (QK-clip), or lower the learning "
     "rate."},
    {K::kLogZDrift, "LogZDrift", v1::SEVERITY_WARNING,
     "The output softmax normalizer log Z is drifting: output logits grow or "
     "shrink without bound.",
     "Add a z-loss (e.g. 1e-4 * log Z^2) and check weight decay on the output "
     "layer."},
    {K::kRankNormMismatch, "RankNormMismatch", v1::SEVERITY_CRITICAL,
     "Ranks report different gradient norms or clip coefficients for one "
     "step: clipping uses each shard's local norm (per-shard clipping).",
     "Compute the norm over all ranks before clipping (clip_grad_norm_ on the "
     "FSDP/DDP module, or all-reduce the squared norm).",
     AlertScope::kAcrossRanks},
    {K::kShardNormMismatch, "ShardNormMismatch", v1::SEVERITY_CRITICAL,
     "The shards' squared sums do not add up to the reported norm: squares "
     "not reduced across a group, or replicated parameters counted more than "
     "once.",
     "Reduce squared norms over the right process groups and count "
     "replicated (tensor-parallel-duplicated) parameters once.",
     AlertScope::kAcrossRanks},
    {K::kFp16WithoutScaler, "Fp16WithoutScaler", v1::SEVERITY_WARNING,
     "An fp16 run without dynamic loss scaling: small gradients flush to "
     "zero and large ones overflow.",
     "Use torch.cuda.amp.GradScaler (or bf16), and report its scale."},
    {K::kAdamStaleSecondMoment, "AdamStaleSecondMoment", v1::SEVERITY_WARNING,
     "A layer's g/sqrt(v) is far above 1: its Adam second moment is out of "
     "date, and a loss spike tends to follow within a few steps.",
     "Lower beta2 (e.g. 0.95), or clip the update (update clipping).",
     AlertScope::kLead, {K::kLossSpike, K::kGradNormSpike}},
    {K::kLayerUpdateStall, "LayerUpdateStall", v1::SEVERITY_WARNING,
     "Updates vanish: a layer's gradient RMS is near Adam's eps, or the "
     "whole model's updates collapsed far below where they started (an LR "
     "schedule gone to ~0 mid-run, gradients that died); the description "
     "says which.",
     "Near eps: use a smaller eps (e.g. 1e-15 for large models). Collapsed "
     "with the LR: check the schedule's length, decay and min_lr against the "
     "run's steps. Collapsed without it: look for frozen or dead layers and a "
     "loss that stopped moving."},
    {K::kLossSpike, "LossSpike", v1::SEVERITY_INFO,
     "The loss jumped far above its recent level for a few steps: the PaLM / "
     "BLOOM kind of loss spike (hard or bad batches meeting an out-of-date "
     "Adam second moment, or an LR too high for this phase). Most recover "
     "by themselves; one that does not becomes a LossDivergence.",
     "Nothing while the loss comes back. Note the batches listed "
     "(trainwatchctl spikes --run R); if spikes recur, lower the LR or "
     "beta2 (0.95), add warmup or qk-layernorm.",
     AlertScope::kLead, {}, /*implicates_host=*/true},
    {K::kRunSilent, "RunSilent", v1::SEVERITY_WARNING,
     "No step arrived for a while from a run that has not finished: the job "
     "hung, crashed, or lost its connection to trainwatch.",
     "Check the job's processes and logs; if it crashed, restart from the "
     "last checkpoint.",
     AlertScope::kClock},
    {K::kRankStraggler, "RankStraggler", v1::SEVERITY_WARNING,
     "One rank's steps take longer than the others' and every rank waits for "
     "it: a throttled or failing GPU, a slow host (CPU contention, a noisy "
     "neighbour), a degraded network link, or an uneven data shard.",
     "Look at the named host (nvidia-smi clocks and temperature, dmesg, "
     "DCGM diagnostics); drain it and restart the run without it if it stays "
     "slow.",
     AlertScope::kAcrossRanks, {K::kMoeExpertParallelImbalance},
     /*implicates_host=*/true},
    {K::kInputPipelineStall, "InputPipelineStall", v1::SEVERITY_WARNING,
     "The training loop waits for its input pipeline: too few loader "
     "workers, slow storage or network reads, heavy preprocessing on the "
     "critical path.",
     "Add DataLoader workers and prefetching (prefetch_factor, "
     "pin_memory), cache or pre-tokenize the data, move preprocessing off "
     "the training process."},
    {K::kHostSuspect, "HostSuspect", v1::SEVERITY_WARNING,
     "A lemon machine: a GPU with failing memory or silent data corruption, "
     "a throttled or mis-seated card, a bad NIC: different runs fail on it in "
     "the same ways.",
     "Drain the host from the scheduler, run the vendor diagnostics (DCGM "
     "level 3, memory tests), and restart the affected runs elsewhere from "
     "their last checkpoints.",
     AlertScope::kServer},
    {K::kFp8Overflow, "Fp8Overflow", v1::SEVERITY_WARNING,
     "FP8 values saturate at the format's max: the tensor's scale lags its "
     "amax (a delayed-scaling history too long for how fast the amax grows, "
     "or a margin too small), so its largest values are clipped in the cast.",
     "Raise the margin (each +1 halves the scale: 2x headroom) or shorten "
     "amax_history_len when the amax moves fast; keep the tensor in bf16 if "
     "it keeps saturating.",
     AlertScope::kLead, {K::kFp8ScaleMismatch, K::kFp8AmaxDesync}},
    {K::kFp8Underflow, "Fp8Underflow", v1::SEVERITY_WARNING,
     "Most of an FP8 tensor's values flush to zero in the cast: its scale is "
     "too small for its bulk (a margin too large, an old outlier held in "
     "the amax history, or outliers that outgrew the bulk).",
     "Lower the margin or shorten the amax history; if one outlier feature "
     "dominates the amax (Fp8AmaxGrowth), fix the outliers (Smooth-SwiGLU, a "
     "lower LR) or use finer-grained (block) scaling.",
     AlertScope::kLead, {K::kFp8AmaxGrowth, K::kFp8ScaleMismatch}},
    {K::kFp8ScaleMismatch, "Fp8ScaleMismatch", v1::SEVERITY_CRITICAL,
     "FP8 scales disagree with what the recipe implies from the amax "
     "(fmt_max / max(amax history) / 2^margin): the wrong format maximum, "
     "e.g. E4M3's 448 used for E4M3_FNUZ (240) on ROCm or the reverse, or a "
     "scale computed by other code than the recipe says.",
     "Use the format maximum of the FP8 type the casts really use (E4M3 448, "
     "E4M3_FNUZ 240, E5M2 and E5M2_FNUZ 57344); check the Transformer "
     "Engine build matches the hardware."},
    {K::kFp8AmaxDesync, "Fp8AmaxDesync", v1::SEVERITY_CRITICAL,
     "Ranks of one amax reduction group report different amax or scale for "
     "one FP8 tensor at one step: the amax is reduced over the wrong process "
     "group (or not at all), so tensor-parallel shards cast with different "
     "scales. Runs like this diverge.",
     "Reduce the amax over the tensor-parallel group (Transformer Engine: "
     "fp8_group / amax_reduction_group, Megatron's tp group), then restart "
     "from a checkpoint before the desync.",
     AlertScope::kAcrossRanks},
    {K::kFp8AmaxGrowth, "Fp8AmaxGrowth", v1::SEVERITY_WARNING,
     "An FP8 tensor's amax grows steadily and is forecast to reach 100x its "
     "early level: outliers outgrowing the tensor's bulk (as with SwiGLU "
     "weight alignment late in long runs). Per-tensor scaling follows the "
     "outliers, and the bulk will underflow.",
     "Smooth-SwiGLU or another outlier fix, a lower learning rate or more "
     "weight decay; or keep the tensor in bf16, or use block scaling."},
    {K::kSpikeHazard, "SpikeHazard", v1::SEVERITY_WARNING,
     "A loss spike is likely within the next few steps: a layer's Adam second "
     "moment is out of date for its gradient (RMS of g^2/v) or its update "
     "jumped far above its own level, the precursor of loss spikes in "
     "small-scale proxies and large runs.",
     "Watch the next steps' loss; if it spikes, restart from the last "
     "checkpoint and skip the batches (trainwatchctl spikes). If hazards "
     "recur: lower beta2 (0.95), add warmup or lower the LR, add "
     "qk-layernorm, or clip updates."},
    {K::kLossDivergence, "LossDivergence", v1::SEVERITY_CRITICAL,
     "The loss left its level and did not come back: a spike whose loss "
     "stayed up, or a slow rise to twice the run's best level (a learning "
     "rate too high for this phase, an optimizer state gone bad, or bad "
     "data); the steps since are wasted.",
     "Restart from the last checkpoint before the onset (trainwatchctl plan "
     "--run R), skip the spike's batches if it had any, and lower the LR "
     "(or beta2); if it diverges again without those batches, the LR or the "
     "optimizer state is the cause, not the data.",
     // An MoE router gone wrong is the root of a loss that follows it; a
     // spike under way, of one without.
     AlertScope::kLead, {K::kMoeRouterCollapse, K::kMoeRouterZLossGrowth, K::kLossSpike}},
    {K::kMoeRouterCollapse, "MoeRouterCollapse", v1::SEVERITY_CRITICAL,
     "An MoE layer's router sends (almost) every token to the same few "
     "experts: the rest stop learning and the layer is a dense one of their "
     "size. The load-balancing loss is off or too weak, an aux-free bias is "
     "disabled, or an LR spike pushed the router into a corner.",
     "Restart from a checkpoint before the onset with the balancing on (aux "
     "loss coefficient 1e-2, or the aux-free bias with its update on) and a "
     "lower LR for the router; check the router's init (small, not zero).",
     AlertScope::kLead, {}},
    {K::kMoeDeadExpert, "MoeDeadExpert", v1::SEVERITY_WARNING,
     "An expert gets no token in the global batch for a long stretch: its "
     "router logit fell behind the others' and it no longer learns (a "
     "collapse's precursor).",
     "Check the balancing (aux loss coefficient, aux-free bias update); "
     "re-initialise the dead expert's router row or restart from a "
     "checkpoint before it died.",
     AlertScope::kLead, {K::kMoeRouterCollapse}},
    {K::kMoeImbalanceHigh, "MoeImbalanceHigh", v1::SEVERITY_WARNING,
     "An MoE layer's load is uneven: its hottest expert takes twice the mean "
     "or more, sustained. The hot expert's rank runs slower and its memory "
     "grows (tokens over capacity are dropped).",
     "Raise the load-balancing loss coefficient (or the aux-free bias "
     "update rate); if the data is one domain, some skew is expected.",
     AlertScope::kLead, {K::kMoeRouterCollapse}},
    {K::kMoeAuxLossOffBalance, "MoeAuxLossOffBalance", v1::SEVERITY_WARNING,
     "The normalised load-balancing loss stays away from 1.0 (balance): "
     "above it, the balancing is losing to the router; below 0.9, the router "
     "games the loss (sigmoid scores under too large a normaliser epsilon).",
     "Above: raise its coefficient or check it is applied. Below: check the "
     "score function and the normaliser's epsilon, and that the loss is "
     "computed over the global batch.",
     AlertScope::kLead,
     {K::kMoeRouterCollapse, K::kMoeDeadExpert, K::kMoeRouterZLossGrowth}},
    {K::kMoeRouterZLossGrowth, "MoeRouterZLossGrowth", v1::SEVERITY_WARNING,
     "The router's logits keep growing (z-loss or max router logit 2x its "
     "baseline): bf16 round-off in the router's softmax, then unstable "
     "routing.",
     "Add a router z-loss (coefficient 1e-3) and keep the router in fp32.",
     AlertScope::kLead, {}},
    {K::kMoeExpertBiasDrift, "MoeExpertBiasDrift", v1::SEVERITY_WARNING,
     "The aux-loss-free balancing bias drifts: its mean moves away from 0 "
     "(the update is not re-centred) or it flips sign report after report "
     "while the load does not even out (the update rate is too high).",
     "Re-centre the bias after each update (subtract its mean) and lower "
     "the bias update rate (1e-3).",
     AlertScope::kLead, {}},
    {K::kMoeTokensDropped, "MoeTokensDropped", v1::SEVERITY_WARNING,
     "More than 1% of the routed assignments go over their expert's capacity "
     "and are dropped (Switch: typically < 1%); those tokens skip the layer.",
     "Raise the capacity factor (1.25 for training, 2.0 for eval) or go "
     "dropless; if the load is uneven (MoeImbalanceHigh), balance it first.",
     AlertScope::kLead, {K::kMoeRouterCollapse, K::kMoeImbalanceHigh}},
    {K::kMoeExpertParallelImbalance, "MoeExpertParallelImbalance",
     v1::SEVERITY_WARNING,
     "One expert-parallel rank's block of experts carries far more tokens "
     "than the mean rank's: that rank is the slowest every step (and the "
     "first out of memory).",
     "Balance the experts (see MoeImbalanceHigh), or place the hot experts "
     "on different EP ranks.",
     AlertScope::kLead, {K::kMoeRouterCollapse}},
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
