#include "trainwatch/restart_plan.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainwatch/channel.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch {
namespace {

std::string Why(const v1::Spike& spike) {
  std::string why = absl::StrFormat(
      "gradient-norm spike at step %d (%.1fx the recent level). ", spike.step(),
      spike.ratio_to_ema());
  if (spike.has_restart_from_step()) {
    absl::StrAppend(&why, "Resume from ",
                    spike.restart_checkpoint().empty()
                        ? std::string("the checkpoint")
                        : absl::StrCat("checkpoint ", spike.restart_checkpoint()),
                    " (step ", spike.restart_from_step(),
                    ", the last one at least 100 steps before the spike)");
  } else {
    absl::StrAppend(&why,
                    "No checkpoint at least 100 steps before it was reported: "
                    "resume from the latest one before the spike");
  }
  if (spike.batch_ids().empty()) {
    absl::StrAppend(&why, "; no batch ids were recorded, so nothing to skip.");
  } else {
    absl::StrAppend(&why, " and skip batches ",
                    absl::StrJoin(spike.batch_ids(), ","), ".");
  }
  if (spike.outcome() == "recovered") {
    absl::StrAppend(&why, " A restart replayed these steps ",
                    spike.batches_skipped() ? "without the batches" : "with the batches",
                    " and the spike did not come back: recovered.");
  } else if (spike.outcome() == "recurred") {
    absl::StrAppend(
        &why, " A restart replayed these steps ",
        spike.batches_skipped()
            ? "without the batches and the spike came back: the cause is the "
              "optimizer state or the learning rate, not the data (restart "
              "earlier, lower the LR or beta2)."
            : "with the same batches and the spike came back: skip the batches.");
  }
  return why;
}

}  // namespace

std::optional<RestartPlan> PlanFromHealth(const v1::GetRunHealthResponse& health) {
  if (health.spikes().empty()) return std::nullopt;
  const v1::Spike& spike = *health.spikes().rbegin();  // oldest first
  RestartPlan plan;
  plan.run = health.run().run_id();
  plan.spike_step = spike.step();
  if (spike.has_restart_from_step()) {
    plan.restart_from_step = spike.restart_from_step();
  }
  plan.checkpoint = spike.restart_checkpoint();
  plan.skip_batch_ids.assign(spike.batch_ids().begin(), spike.batch_ids().end());
  plan.outcome = spike.outcome();
  plan.batches_skipped = spike.batches_skipped();
  plan.why = Why(spike);
  return plan;
}

absl::StatusOr<std::optional<RestartPlan>> FetchRestartPlan(
    const std::string& address, const ConnectionSecurity& security,
    const std::string& run, std::chrono::milliseconds timeout) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      NewChannelCredentials(security);
  if (!credentials.ok()) return credentials.status();
  auto stub = v1::TrainingHealth::NewStub(
      grpc::CreateChannel(address, *credentials));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  AddAuthToken(security, &context);
  v1::GetRunHealthRequest request;
  request.set_run_id(run);
  v1::GetRunHealthResponse response;
  const grpc::Status status = stub->GetRunHealth(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("GetRunHealth(", run, ") at ", address, ": ",
                                     status.error_message()));
  }
  return PlanFromHealth(response);
}

}  // namespace trainwatch
