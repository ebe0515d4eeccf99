// The data lifecycle's commands: `delete-run` and `backup` (docs/reliability.md,
// "Data lifecycle").
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "cli/fleet.h"

namespace trainwatch::cli {
namespace {

// A backup copies the whole database: as long as a big `steps` may take.
constexpr std::chrono::milliseconds kBackupDeadline{3'600'000};
constexpr std::chrono::milliseconds kDeleteDeadline{600'000};

}  // namespace

absl::Status RunDeleteRun(const GlobalOptions& global, const ParsedArgs& args) {
  if (args.positional().size() != 1) {
    return absl::InvalidArgumentError("delete-run: give one run id: delete-run RUN");
  }
  const std::string run_id = args.positional()[0];
  absl::StatusOr<GlobalOptions> aimed = ForRun(global, "delete-run", run_id);
  if (!aimed.ok()) return aimed.status();
  v1::DeleteRunRequest request;
  request.set_run_id(run_id);
  v1::DeleteRunResponse response;
  auto context = NewContext(*aimed, kDeleteDeadline);
  grpc::Status status = NewStub(*aimed)->DeleteRun(context.get(), request, &response);
  if (!status.ok()) return RpcError("delete-run", "DeleteRun", status);
  WriteStdout(absl::StrFormat("deleted run %s: %d step records, %d alerts\n", run_id,
                              response.records(), response.alerts()));
  return absl::OkStatus();
}

absl::Status RunBackup(const GlobalOptions& global, const ParsedArgs& args) {
  if (absl::Status s = NoArguments(args); !s.ok()) return s;
  absl::StatusOr<std::string> out = RequiredFlag(args, "out");
  if (!out.ok()) return out.status();
  if (std::filesystem::exists(*out)) {
    return absl::AlreadyExistsError(
        absl::StrCat("backup: ", *out, " exists; give a new file (a backup never overwrites)"));
  }
  // Written next to the target and renamed once complete: a FILE that
  // exists is a whole backup.
  const std::string partial = *out + ".partial";
  std::ofstream file(partial, std::ios::binary | std::ios::trunc);
  if (!file) return absl::InvalidArgumentError(absl::StrCat("backup: cannot write ", partial));
  auto context = NewContext(global, kBackupDeadline);
  v1::BackupRequest request;
  std::unique_ptr<grpc::ClientReader<v1::BackupChunk>> reader =
      NewStub(global)->Backup(context.get(), request);
  v1::BackupChunk chunk;
  uint64_t written = 0;
  uint64_t total = 0;
  while (reader->Read(&chunk)) {
    file.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    written += chunk.data().size();
    total = chunk.total_bytes();
  }
  grpc::Status status = reader->Finish();
  file.close();
  if (!status.ok() || !file || written != total) {
    std::filesystem::remove(partial);
    if (!status.ok()) return RpcError("backup", "Backup", status);
    return absl::DataLossError(absl::StrFormat(
        "backup: received %d of %d bytes, or could not write %s", written, total, partial));
  }
  std::filesystem::rename(partial, *out);
  WriteStdout(absl::StrFormat(
      "backup: wrote %s (%d bytes), a consistent copy of the server's database; "
      "a server opens it as its --db\n",
      *out, written));
  return absl::OkStatus();
}

}  // namespace trainwatch::cli
