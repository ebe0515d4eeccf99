// The read-only commands: runs, steps, health, alerts, spikes. Each is one
// query RPC rendered as a table or, with --json, as the JSON of json_out.h.
// With several --server addresses, `runs` and `alerts` ask every server and
// add a SERVER column (a "server" key in JSON); the others ask the run's.

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trainwatch/v1/alert_names.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/fleet.h"
#include "output/json_out.h"
#include "output/text_out.h"

namespace trainwatch::cli {
namespace {

constexpr std::chrono::milliseconds kUnaryDeadline{30'000};
// A whole history can be long: the deadline bounds a stalled server, not a
// big answer.
constexpr std::chrono::milliseconds kStreamDeadline{600'000};
// Output is written in chunks of about this size while a stream runs.
constexpr size_t kFlushBytes = 1 << 16;

std::string Labels(const google::protobuf::Map<std::string, std::string>& m) {
  if (m.empty()) return "-";
  std::map<std::string, std::string> sorted(m.begin(), m.end());
  return absl::StrJoin(sorted, ",", absl::PairFormatter("="));
}

// A run or an alert and the server that answered with it ("" for a single
// server, whose output has no SERVER column).
template <typename T>
struct FromServer {
  const T* item;
  std::string server;
};

std::string RenderRuns(const std::vector<FromServer<v1::RunSummary>>& runs,
                       bool fleet) {
  // The wire has the world size, not how many ranks reported.
  std::vector<std::string> header = {"RUN",       "WORLD",     "ATTEMPT",
                                     "PRECISION", "LAST STEP", "STEPS",
                                     "STATE",     "ALERTS"};
  if (fleet) header.push_back("SERVER");
  Table table(header);
  for (const auto& [run, server] : runs) {
    std::vector<std::string> row = {
        run->run_id(),
        absl::StrCat(run->world_size()),
        absl::StrCat(run->attempt()),
        std::string(PrecisionName(run->precision())),
        absl::StrCat(run->last_step()),
        absl::StrCat(run->steps()),
        run->state().empty() ? "-" : run->state(),
        absl::StrCat(run->active_alerts())};
    if (fleet) row.push_back(server);
    table.AddRow(row);
  }
  return table.Render();
}

std::string AlertSteps(const v1::Alert& alert) {
  if (alert.state() != v1::ALERT_STATE_RESOLVED) {
    return absl::StrCat(alert.started_step(), "-");
  }
  return absl::StrCat(alert.started_step(), "-", alert.resolved_step());
}

std::string RenderAlerts(const std::vector<FromServer<v1::Alert>>& alerts,
                         bool fleet) {
  std::vector<std::string> header = {"ALERTNAME", "SEVERITY", "STATE", "RUN",
                                     "RANK",      "STEPS",    "ONSET", "CAUSED BY",
                                     "PEAK",      "SUMMARY"};
  if (fleet) header.push_back("SERVER");
  Table table(header);
  for (const auto& [a, server] : alerts) {
    std::vector<std::string> row = {
        a->alertname(),        std::string(v1::SeverityName(a->severity())),
        std::string(v1::StateName(a->state())), a->run(),
        absl::StrCat(a->rank()), AlertSteps(*a),
        a->onset_step() > 0 ? absl::StrCat(a->onset_step()) : "-",
        a->caused_by().empty() ? "-" : "<- " + a->caused_by(),
        Num(a->peak_value()),  a->summary()};
    if (fleet) row.push_back(server);
    table.AddRow(row);
  }
  return table.Render();
}

std::string AlertsJson(const std::vector<FromServer<v1::Alert>>& alerts) {
  std::string out;
  JsonWriter w(&out);
  w.BeginArray();
  for (const auto& [a, server] : alerts) WriteAlert(w, *a, server);
  w.EndArray();
  out += '\n';
  return out;
}

// A forecast step, or "-" when none is ahead.
std::string Forecast(uint64_t step) {
  return step == 0 ? "-" : absl::StrCat(step);
}

// The baseline is the median of the first W post-warmup steps: until they
// are in, say how far along it is rather than print a median of 0.
std::string Baseline(const v1::GetRunHealthResponse& h) {
  const v1::WindowStats& win = h.window();
  if (win.baseline_grad_norm_median() > 0) {
    return Num(win.baseline_grad_norm_median());
  }
  if (win.steps() == 0 && h.run().state() == "finished") {
    return "- (the run finished and its windows were freed)";
  }
  if (win.window_size() > 0) {
    return absl::StrCat("not yet: ", win.steps(), " of ", win.window_size(),
                        " post-warmup steps");
  }
  return absl::StrCat("not yet: ", win.steps(), " post-warmup steps so far");
}

// What an imported run's labels say about how to read its numbers.
std::string ImportLines(const v1::RunSummary& run) {
  std::string out;
  const auto& labels = run.labels();
  if (auto it = labels.find("logged_every"); it != labels.end()) {
    absl::StrAppend(&out, "sampling       logged every ", it->second,
                    " steps: the windows hold logged points, so the clip "
                    "fraction is a sample of the logged steps\n");
  }
  if (labels.contains("loss_scaler")) {
    absl::StrAppend(&out,
                    "precision      fp16, GradScaler inferred (the log has no "
                    "loss scale): fp16 scale checks not run\n");
  }
  if (labels.contains("grad_norm")) {
    absl::StrAppend(&out,
                    "grad norm      not in the log: clipping, spikes and "
                    "drift not judged\n");
  }
  return out;
}

std::string RenderHealth(const v1::GetRunHealthResponse& h) {
  const v1::RunSummary& run = h.run();
  const v1::WindowStats& win = h.window();
  std::string out = absl::StrFormat(
      "run            %s (state %s, attempt %d, world size %d, %s)\n"
      "config         max_norm %s, warmup %d steps, labels %s\n"
      "history        %d records stored, last step %d\n"
      "window         %d post-warmup steps: grad norm p50 %s  p90 %s  p99 %s\n"
      "               clip fraction %s, skip fraction %s, baseline median %s\n"
      "forecast       max attention logit reaches the cap at step %s, log Z "
      "moves its threshold at step %s\n"
      "recommended    max_norm %s\n",
      run.run_id(), run.state().empty() ? "-" : run.state(), run.attempt(),
      run.world_size(), PrecisionName(run.precision()), Num(run.max_norm()),
      run.warmup_steps(), Labels(run.labels()), run.steps(), run.last_step(),
      win.steps(), Num(win.grad_norm_p50()), Num(win.grad_norm_p90()),
      Num(win.grad_norm_p99()), Num(win.clip_fraction()),
      Num(win.skip_fraction()), Baseline(h),
      Forecast(win.max_attn_logit_forecast_step()),
      Forecast(win.log_z_forecast_step()),
      OptNum(h.has_recommended_max_norm(), h.recommended_max_norm()));
  if (win.step_seconds_median() > 0) {
    absl::StrAppend(
        &out,
        absl::StrFormat("step time      median rank %.3f s, slowest %.3f s "
                        "(%.0f%% of each step waits for it)\n",
                        win.step_seconds_median(), win.step_seconds_max(),
                        100 * win.straggler_lost_fraction()));
    std::vector<std::string> slow;
    for (const v1::RankStepTime& r : h.slowest_ranks()) {
      slow.push_back(absl::StrFormat("%d%s %.2fx", r.rank(),
                                     r.host().empty() ? "" : "@" + r.host(),
                                     r.ratio_to_median()));
    }
    absl::StrAppend(&out, "slowest ranks  ", absl::StrJoin(slow, ", "), "\n");
  }
  if (win.data_wait_fraction() > 0) {
    absl::StrAppend(&out, absl::StrFormat("input wait     %.0f%% of the lead "
                                          "rank's step time\n",
                                          100 * win.data_wait_fraction()));
  }
  if (h.has_goodput() && h.goodput().wall_seconds() > 0) {
    const v1::Goodput& g = h.goodput();
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "goodput        %.1f%% of %.0f s wall time; lost: %d skipped steps "
            "(%.0f s), %d rewound steps (%.0f s), %.0f s silent\n",
            100 * g.ratio(), g.wall_seconds(), g.skipped_steps(),
            g.skipped_seconds(), g.rewound_steps(), g.rewound_seconds(),
            g.silent_seconds()));
  }
  out += ImportLines(run);
  if (h.active_alerts().empty()) return out + "active alerts  none\n";
  std::vector<FromServer<v1::Alert>> alerts;
  for (const v1::Alert& a : h.active_alerts()) alerts.push_back({&a, ""});
  return absl::StrCat(out, "active alerts\n", RenderAlerts(alerts, false));
}

// "27.4x": a spike's norm over the EMA's geometric mean.
std::string Ratio(double ratio) {
  if (!std::isfinite(ratio)) return Num(ratio) + "x";
  return absl::StrFormat("%.1fx", ratio);
}

std::string Sigmas(double sigmas) {
  if (!std::isfinite(sigmas)) return Num(sigmas);
  return absl::StrFormat("%.1f", sigmas);
}

// Every id, unabridged: the plan is what an operator copies.
std::string SkipBatches(const v1::Spike& spike) {
  if (spike.batch_ids().empty()) return "no batch ids were recorded to skip";
  return absl::StrCat("skip batches ", absl::StrJoin(spike.batch_ids(), ","));
}

// One line: where to resume after the spike and which batches to skip.
std::string PlanLine(const v1::Spike& spike) {
  if (!spike.has_restart_from_step()) {
    return absl::StrCat(
        "restart plan for step ", spike.step(),
        ": no checkpoint at least 100 steps before it; restart from the start "
        "or the nearest earlier checkpoint you have, and ",
        SkipBatches(spike), "\n");
  }
  std::string checkpoint =
      spike.restart_checkpoint().empty()
          ? "the checkpoint"
          : absl::StrCat("checkpoint ", spike.restart_checkpoint());
  return absl::StrCat("restart plan for step ", spike.step(), ": resume from ",
                      checkpoint, " (step ", spike.restart_from_step(),
                      ") and ", SkipBatches(spike), "\n");
}

// "recovered (batches skipped)", "recurred (same batches)", or "-" before a
// new attempt replayed the spike's steps.
std::string Outcome(const v1::Spike& s) {
  if (s.outcome().empty()) return "-";
  return absl::StrCat(s.outcome(), s.batches_skipped() ? " (batches skipped)"
                                                       : " (same batches)");
}

std::string RenderHardBatches(const v1::GetRunHealthResponse& h) {
  Table table({"STEP", "HIGH_STEPS", "PEAK", "LEVEL", "BATCH_IDS"});
  for (const v1::HardBatch& b : h.hard_batches()) {
    table.AddRow({absl::StrCat(b.step()), absl::StrCat(b.high_steps(), " of 5"),
                  b.peak_is_ratio() ? Ratio(b.peak()) : absl::StrCat("+", Num(b.peak())),
                  Num(b.level()), BatchIds(b.batch_ids())});
  }
  return table.Render();
}

std::string RenderSpikes(const v1::GetRunHealthResponse& h) {
  Table table({"STEP", "GRAD_NORM", "RATIO", "SIGMAS", "BATCH_IDS",
               "RESTART_FROM", "CHECKPOINT", "OUTCOME"});
  std::string plans;
  for (const v1::Spike& s : h.spikes()) {
    const bool plan = s.has_restart_from_step();
    table.AddRow({absl::StrCat(s.step()), Num(s.grad_norm()),
                  Ratio(s.ratio_to_ema()), Sigmas(s.sigmas()),
                  BatchIds(s.batch_ids()),
                  plan ? absl::StrCat(s.restart_from_step()) : "-",
                  plan && !s.restart_checkpoint().empty()
                      ? s.restart_checkpoint()
                      : "-",
                  Outcome(s)});
    plans += PlanLine(s);
  }
  return table.Render() + plans;
}

// GetRunHealth, shared by `health` and `spikes`.
absl::StatusOr<v1::GetRunHealthResponse> GetRunHealth(
    const GlobalOptions& global, absl::string_view command,
    std::string run_id) {
  absl::StatusOr<GlobalOptions> aimed = ForRun(global, command, run_id);
  if (!aimed.ok()) return aimed.status();
  v1::GetRunHealthRequest request;
  request.set_run_id(std::move(run_id));
  v1::GetRunHealthResponse response;
  auto context = NewContext(*aimed, kUnaryDeadline);
  grpc::Status status =
      NewStub(*aimed)->GetRunHealth(context.get(), request, &response);
  if (!status.ok()) return RpcError(command, "GetRunHealth", status);
  return response;
}

// ListAlerts, for `alerts`.
absl::StatusOr<v1::ListAlertsResponse> ListAlerts(const GlobalOptions& global,
                                                  absl::string_view command,
                                                  std::string run_id,
                                                  bool active_only) {
  v1::ListAlertsRequest request;
  request.set_run_id(std::move(run_id));
  request.set_active_only(active_only);
  v1::ListAlertsResponse response;
  auto context = NewContext(global, kUnaryDeadline);
  grpc::Status status =
      NewStub(global)->ListAlerts(context.get(), request, &response);
  if (!status.ok()) return RpcError(command, "ListAlerts", status);
  return response;
}

}  // namespace

absl::Status RunRuns(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  std::function<absl::StatusOr<v1::ListRunsResponse>(const GlobalOptions&)>
      list = [](const GlobalOptions& one)
      -> absl::StatusOr<v1::ListRunsResponse> {
    v1::ListRunsResponse response;
    auto context = NewContext(one, kUnaryDeadline);
    grpc::Status status = NewStub(one)->ListRuns(
        context.get(), v1::ListRunsRequest(), &response);
    if (!status.ok()) return RpcError("runs", "ListRuns", status);
    return response;
  };
  const std::vector<ServerAnswer<v1::ListRunsResponse>> answers =
      FanOut(global, list);
  const bool fleet = answers.size() > 1;
  if (!fleet && !answers[0].answer.ok()) return answers[0].answer.status();
  std::vector<FromServer<v1::RunSummary>> runs;
  for (const ServerAnswer<v1::ListRunsResponse>& a : answers) {
    if (!a.answer.ok()) continue;
    for (const v1::RunSummary& run : a.answer->runs()) {
      runs.push_back({&run, fleet ? a.server : ""});
    }
  }
  if (fleet) {
    std::stable_sort(runs.begin(), runs.end(),
                     [](const auto& x, const auto& y) {
                       return x.item->run_id() < y.item->run_id();
                     });
  }
  if (!args.Has("json")) {
    WriteStdout(RenderRuns(runs, fleet));
  } else {
    std::string out;
    JsonWriter w(&out);
    w.BeginArray();
    for (const auto& [run, server] : runs) WriteRun(w, *run, server);
    w.EndArray();
    WriteStdout(out + "\n");
  }
  return ReportUnanswered("runs", answers);
}

absl::Status RunSteps(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  absl::StatusOr<std::string> run = RequiredFlag(args, "run");
  if (!run.ok()) return run.status();
  absl::StatusOr<GlobalOptions> aimed = ForRun(global, "steps", *run);
  if (!aimed.ok()) return aimed.status();
  v1::QueryStepsRequest request;
  request.set_run_id(*run);
  absl::StatusOr<std::optional<uint64_t>> from = args.GetUint64("from");
  if (!from.ok()) return from.status();
  absl::StatusOr<std::optional<uint64_t>> to = args.GetUint64("to");
  if (!to.ok()) return to.status();
  absl::StatusOr<std::optional<uint32_t>> rank = args.GetUint32("rank");
  if (!rank.ok()) return rank.status();
  request.set_from_step(from->value_or(0));
  request.set_to_step(to->value_or(0));  // 0: no upper bound
  if (request.to_step() != 0 && request.from_step() > request.to_step()) {
    return UsageError("--from is after --to");
  }
  if (rank->has_value()) request.set_rank(**rank);

  const bool json = args.Has("json");
  auto context = NewContext(*aimed, kStreamDeadline);
  auto stub = NewStub(*aimed);
  std::unique_ptr<grpc::ClientReader<v1::StepRecords>> reader =
      stub->QuerySteps(context.get(), request);
  // Printed as it arrives: a history can be millions of records.
  std::string out = json ? "[" : StepTableHeader();
  bool first = true;
  v1::StepRecords chunk;
  while (reader->Read(&chunk)) {
    for (const v1::StepRecords::Item& item : chunk.items()) {
      if (json) {
        out += first ? "\n" : ",\n";
        JsonWriter w(&out);
        WriteStep(w, item.record(), item.rank(), item.attempt());
      } else {
        out += StepTableRow(item.record(), item.rank(), item.attempt());
      }
      first = false;
    }
    if (out.size() >= kFlushBytes) {
      WriteStdout(out);
      out.clear();
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    // What was printed stays unterminated: a truncated array must not parse
    // as a complete answer.
    WriteStdout(out);
    return RpcError("steps", "QuerySteps", status);
  }
  if (json) out += first ? "]\n" : "\n]\n";
  WriteStdout(out);
  return absl::OkStatus();
}

absl::Status RunHealth(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  absl::StatusOr<std::string> run = RequiredFlag(args, "run");
  if (!run.ok()) return run.status();
  absl::StatusOr<v1::GetRunHealthResponse> response =
      GetRunHealth(global, "health", *run);
  if (!response.ok()) return response.status();
  if (!args.Has("json")) {
    WriteStdout(RenderHealth(*response));
    return absl::OkStatus();
  }
  std::string out;
  JsonWriter w(&out);
  WriteHealth(w, *response);
  WriteStdout(out + "\n");
  return absl::OkStatus();
}

absl::Status RunAlerts(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  const std::string run = args.Get("run").value_or("");
  const bool active = args.Has("active");
  std::function<absl::StatusOr<v1::ListAlertsResponse>(const GlobalOptions&)>
      list = [&run, active](const GlobalOptions& one) {
        GlobalOptions aimed = one;
        aimed.run = run;  // a proxy routes a run's alerts to its server
        return ListAlerts(aimed, "alerts", run, active);
      };
  // Every server, even for one run: after the fleet changed, a run's older
  // alerts stay on the server that held it then.
  const std::vector<ServerAnswer<v1::ListAlertsResponse>> answers =
      FanOut(global, list);
  const bool fleet = answers.size() > 1;
  if (!fleet && !answers[0].answer.ok()) return answers[0].answer.status();
  std::vector<FromServer<v1::Alert>> alerts;
  for (const ServerAnswer<v1::ListAlertsResponse>& a : answers) {
    if (!a.answer.ok()) continue;
    for (const v1::Alert& alert : a.answer->alerts()) {
      alerts.push_back({&alert, fleet ? a.server : ""});
    }
  }
  WriteStdout(args.Has("json") ? AlertsJson(alerts)
                               : RenderAlerts(alerts, fleet));
  return ReportUnanswered("alerts", answers);
}

absl::Status RunSpikes(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  absl::StatusOr<std::string> run = RequiredFlag(args, "run");
  if (!run.ok()) return run.status();
  absl::StatusOr<v1::GetRunHealthResponse> response =
      GetRunHealth(global, "spikes", *run);
  if (!response.ok()) return response.status();
  const bool hard = args.Has("hard-batches");
  if (!args.Has("json")) {
    if (hard) {
      WriteStdout(RenderHardBatches(*response));
    } else {
      // Spikes first; the hard batches (nobody needs to act) counted after.
      std::string out = RenderSpikes(*response);
      if (response->hard_batches_size() > 0) {
        absl::StrAppend(&out, "\n", response->hard_batches_size(),
                        " hard batches (1-2 high losses of 5, not spikes): "
                        "trainwatchctl spikes --run ", *run, " --hard-batches\n");
      }
      WriteStdout(out);
    }
    return absl::OkStatus();
  }
  std::string out;
  JsonWriter w(&out);
  w.BeginArray();
  if (hard) {
    for (const v1::HardBatch& b : response->hard_batches()) WriteHardBatch(w, b);
  } else {
    for (const v1::Spike& spike : response->spikes()) WriteSpike(w, spike);
  }
  w.EndArray();
  WriteStdout(out + "\n");
  return absl::OkStatus();
}

absl::Status RunPlan(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  absl::StatusOr<std::string> run = RequiredFlag(args, "run");
  if (!run.ok()) return run.status();
  absl::StatusOr<v1::GetRunHealthResponse> response =
      GetRunHealth(global, "plan", *run);
  if (!response.ok()) return response.status();
  const std::optional<RestartPlan> plan = PlanFromHealth(*response);
  if (args.Has("json")) {
    // null: no spike, nothing to restart for.
    std::string out;
    if (plan.has_value()) {
      JsonWriter w(&out);
      WritePlan(w, *plan);
    } else {
      out = "null";
    }
    WriteStdout(out + "\n");
    return absl::OkStatus();
  }
  if (!plan.has_value()) {
    WriteStdout(absl::StrCat("run ", *run, " has no spike: nothing to restart for\n"));
    return absl::OkStatus();
  }
  WriteStdout(absl::StrFormat(
      "spike          step %d%s\n"
      "resume from    %s\n"
      "skip batches   %s\n"
      "why            %s\n",
      plan->spike_step,
      plan->outcome.empty() ? "" : absl::StrCat(" (", plan->outcome, ")"),
      plan->restart_from_step.has_value()
          ? absl::StrCat(plan->checkpoint.empty() ? "-" : plan->checkpoint,
                         " (step ", *plan->restart_from_step, ")")
          : std::string("- (no checkpoint at least 100 steps before the spike)"),
      plan->skip_batch_ids.empty() ? std::string("-")
                                   : absl::StrJoin(plan->skip_batch_ids, ","),
      plan->why));
  return absl::OkStatus();
}

}  // namespace trainwatch::cli
