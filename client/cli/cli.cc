#include "cli/cli.h"

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "cli/commands.h"
#include "cli/flags.h"

namespace trainwatch::cli {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr absl::string_view kUsage =
    R"(usage: trainwatchctl [--server ADDR[,ADDR...]] [--timeout SECONDS] COMMAND [ARGS]

Commands:
  replay FILE.jsonl [--run R] [--rank N] [--world-size N] [--attempt N]
         [--precision fp32|bf16|fp16] [--max-norm X] [--warmup-steps N]
      Stream a JSONL step log (FILE "-" is stdin) to the server; flags
      override its run_start line. Exits 0 once every record is acknowledged.
  runs [--json]
      List the runs the server knows.
  steps --run R [--from N] [--to N] [--rank N] [--json]
      Print stored steps of a run (--to 0, the default, means no upper bound).
  health --run R [--json]
      Window statistics, active alerts and the recommended max_norm of a run.
  alerts [--run R] [--active] [--json]
      Alert history, of one run or all; --active: only those firing.
  spikes --run R [--hard-batches] [--json]
      Spikes of a run (gradient norm and loss): steps, batch ids, restart
      plans and, once a new attempt replayed them, recovered or recurred.
      --hard-batches: the loss's hard batches instead (1-2 high losses of
      5, then back: not spikes), with their batch ids.
  plan --run R [--json]
      The restart plan of the run's latest spike (checkpoint, its step, the
      batch ids to skip, why), for a launcher or a data loader to act on.
  import FILE... --run R [--format auto|tensorboard|hf|megatron|csv]
         [--max-norm X] [--precision P] [--warmup-steps N] [--map TAG=field]
      Replay a past run from its own logs (TensorBoard event files, a
      trainer_state.json, Megatron/DeepSpeed/GPT-NeoX stdout, CSV); prints
      what it inferred (warmup, max_norm, scaler, skips). Nothing is sent if
      a file is bad.
  report --run R --out FILE.html
      Write a self-contained HTML report of a run: verdict, charts with the
      alerts marked, spikes and restart plans.
  delete-run R
      Delete a run with its records, alerts and spikes (a token with write
      scope for it; none of its trainers may be streaming). Its series
      leave /metrics.
  backup --out FILE
      Write a consistent copy of the server's database to FILE (taken while
      ingest goes on); a server opens it as its --db (docs/reliability.md).
  directives --run R [--json]
      The run's closed-loop directives: id, state, the alert each answers,
      the step every rank applies it at, who approved it (docs/closed-loop.md).
  approve ID [--note TEXT], reject ID [--note TEXT]
      Decide a PROPOSED directive (a token with write scope for its run);
      deciding again changes nothing.
  hold --run R --for DUR, release --run R
      Nothing of the run is approved by policy for DUR (90s, 30m, 2h);
      release ends the hold.
  baseline set --run R --ref RUN[@ATTEMPT] [--ref ...], baseline show --run R,
  baseline clear --run R   [--json]
      The reference runs R is judged against (BaselineDeviation); without
      any, attempt N is compared with attempt N-1 (docs/baselines.md).
  compare --run R [--ref RUN@ATTEMPT ...] [--metric loss|grad_norm|log_z|
          max_attn_logit] [--axis tokens|step] [--json]
      R's 20-step bins against its baselines' band (x, value, ref median,
      lo, hi, z) and the step it left the band.

Options (before or after the command):
  --server ADDR      server address (default 127.0.0.1:50051): a server or a
                     fleet's proxy. A fleet's servers as a list A,B,C: runs
                     and alerts ask them all (one that does not answer is
                     named, exit 1); the other commands find the run's server
  --timeout SECONDS  deadline of a query (default 30; steps 600), or how long
                     replay waits for acknowledgements (default 120)
  --token-file FILE  bearer token for a server with --auth-token-file (the
                     first word in FILE); default: $TRAINWATCH_TOKEN, if set
  --tls              connect with TLS, trusting the system's root CAs
  --tls-ca FILE      connect with TLS, trusting these PEM root certificates
  --tls-cert FILE, --tls-key FILE
                     PEM client certificate and key, for a server that
                     requires them (--tls-client-ca); imply TLS
  --help             print this text

--json prints a JSON array (health: an object; plan: an object, or null
without a spike). Exit status: 0 success,
1 failure (server, file or data error; a refused call prints its status,
e.g. UNAUTHENTICATED or PERMISSION_DENIED), 2 usage error.
)";

using CommandFn = absl::Status (*)(const GlobalOptions&, const ParsedArgs&);

struct Command {
  absl::string_view name;
  CommandFn run;
  // The command's own flags; kGlobalFlags are accepted as well.
  std::vector<FlagSpec> flags;
};

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"replay",
       RunReplay,
       {{"run"},
        {"rank"},
        {"world-size"},
        {"attempt"},
        {"precision"},
        {"max-norm"},
        {"warmup-steps"}}},
      {"runs", RunRuns, {{"json", false}}},
      {"steps",
       RunSteps,
       {{"run"}, {"from"}, {"to"}, {"rank"}, {"json", false}}},
      {"health", RunHealth, {{"run"}, {"json", false}}},
      {"alerts", RunAlerts, {{"run"}, {"active", false}, {"json", false}}},
      {"spikes", RunSpikes, {{"run"}, {"hard-batches", false}, {"json", false}}},
      {"plan", RunPlan, {{"run"}, {"json", false}}},
      {"import",
       RunImport,
       {{"run"},
        {"format"},
        {"max-norm"},
        {"precision"},
        {"warmup-steps"},
        {"map"}}},
      {"report", RunReport, {{"run"}, {"out"}}},
      {"delete-run", RunDeleteRun, {}},
      {"backup", RunBackup, {{"out"}}},
      {"directives", RunDirectives, {{"run"}, {"json", false}}},
      {"approve", RunApprove, {{"note"}}},
      {"reject", RunReject, {{"note"}}},
      {"hold", RunHold, {{"run"}, {"for"}}},
      {"release", RunRelease, {{"run"}}},
      {"baseline", RunBaseline, {{"run"}, {"ref"}, {"json", false}}},
      {"compare", RunCompare, {{"run"}, {"ref"}, {"metric"}, {"axis"}, {"json", false}}},
  };
  return *commands;
}

int UsageFailure(absl::string_view message) {
  std::fprintf(stderr, "trainwatchctl: %.*s\n",
               static_cast<int>(message.size()), message.data());
  std::fprintf(stderr, "Run 'trainwatchctl --help' for usage.\n");
  return kExitUsage;
}

int PrintUsage() {
  std::fwrite(kUsage.data(), 1, kUsage.size(), stdout);
  return kExitOk;
}

}  // namespace

// Global flags come before the command; the first other word is the command.
int RunCli(std::vector<std::string> argv) {
  size_t command_at = 0;
  while (command_at < argv.size() && argv[command_at].starts_with("-") &&
         argv[command_at] != "-") {
    absl::string_view flag = argv[command_at];
    flag.remove_prefix(absl::StartsWith(flag, "--") ? 2 : 1);
    bool takes_value = false;  // unknown flags are refused by Parse below
    for (const FlagSpec& spec : kGlobalFlags) {
      if (spec.name == flag) takes_value = spec.takes_value;
    }
    command_at += takes_value ? 2 : 1;
  }
  const size_t globals_end = std::min(command_at, argv.size());
  absl::StatusOr<ParsedArgs> globals =
      ParsedArgs::Parse(std::span(argv).first(globals_end), kGlobalFlags);
  if (!globals.ok()) return UsageFailure(globals.status().message());
  if (globals->Has("help") || globals->Has("h")) return PrintUsage();
  if (command_at >= argv.size()) return UsageFailure("no command given");

  const std::string& name = argv[command_at];
  const Command* command = nullptr;
  for (const Command& c : Commands()) {
    if (c.name == name) command = &c;
  }
  if (command == nullptr) {
    return UsageFailure("unknown command \"" + name + "\"");
  }
  std::vector<FlagSpec> specs = command->flags;
  specs.insert(specs.end(), std::begin(kGlobalFlags), std::end(kGlobalFlags));
  absl::StatusOr<ParsedArgs> args =
      ParsedArgs::Parse(std::span(argv).subspan(command_at + 1), specs);
  if (!args.ok()) {
    return UsageFailure(name + ": " + std::string(args.status().message()));
  }
  if (args->Has("help") || args->Has("h")) return PrintUsage();

  GlobalOptions global;
  absl::Status status = ApplyGlobalFlags(*globals, &global);
  if (status.ok()) status = ApplyGlobalFlags(*args, &global);
  if (status.ok()) status = ResolveSecurity(&global);
  if (status.ok()) status = command->run(global, *args);
  std::fflush(stdout);
  if (status.ok()) return kExitOk;
  if (IsUsageError(status)) {
    return UsageFailure(name + ": " + std::string(status.message()));
  }
  std::fprintf(stderr, "trainwatchctl: %.*s\n",
               static_cast<int>(status.message().size()),
               status.message().data());
  return kExitFailure;
}

}  // namespace trainwatch::cli
