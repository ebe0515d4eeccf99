// NonFiniteUpdate (docs/detectors.md), for every precision: a NaN or Inf
// gradient norm or loss on a step that was applied.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "health/detectors/internal.h"

namespace trainwatch {
namespace {

// Catches a NaN/Inf gradient or loss that reached the weights: the step was
// applied, not skipped. One event per such step; skipped inf steps are normal
// fp16 behaviour and stay silent.
class NonFiniteUpdate final : public Detector {
 public:
  void OnStep(const StepContext& ctx, AlertSink& sink) override {
    const v1::StepRecord& r = ctx.record;
    const bool bad_norm = !std::isfinite(r.grad_norm());
    const bool bad_loss = r.has_loss() && !std::isfinite(r.loss());
    if (r.skipped() || (!bad_norm && !bad_loss)) return;
    const std::vector<int64_t> batch_ids(r.batch_ids().begin(),
                                         r.batch_ids().end());
    sink.Event(AlertKind::kNonFiniteUpdate, r.step(), 1.0, batch_ids, [&] {
      std::string loss = r.has_loss() ? absl::StrFormat("%g", r.loss()) : "-";
      return AlertText{
          .summary = "Non-finite update applied",
          .description =
          absl::StrFormat("step %d was applied (not skipped) with grad_norm "
                          "%g and loss %s",
                          r.step(), r.grad_norm(), loss),
          // What the lead rank computed: its machine (HostSuspect).
          .host = ctx.run.host};
    });
  }
};

}  // namespace

std::unique_ptr<Detector> MakeNonFiniteUpdate(const HealthConfig&) {
  return std::make_unique<NonFiniteUpdate>();
}

}  // namespace trainwatch
