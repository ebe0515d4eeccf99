// The data lifecycle's commands: `delete-run` and `backup` (docs/reliability.md,
// "Data lifecycle").
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "cli/fleet.h"

namespace trainwatch::cli {
namespace {

// A backup copies the whole database: as long as a big `steps` may take.
constexpr std::chrono::milliseconds kBackupDeadline{3'600'000};
constexpr std::chrono::milliseconds kDeleteDeadline{600'000};

bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

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
  if (global.servers.size() != 1) {
    return UsageError(
        "backup: give one --server: each server of a fleet holds its own database; "
        "back each up to its own file");
  }
  // Written next to the target and linked to its name once complete: a
  // FILE that exists is a whole backup. The partial file is ours alone:
  // created exclusively (a second backup to FILE, or a planted link, makes
  // this fail rather than share or follow it), mode 0600 (every tenant's
  // data).
  const std::string partial = *out + ".partial";
  struct stat existing {};
  if (lstat(out->c_str(), &existing) == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("backup: ", *out, " exists; give a new file (a backup never overwrites)"));
  }
  const int fd = open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat(
          "backup: ", partial, " exists: another backup to ", *out,
          " is running (or one was killed: remove ", partial, ")"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("backup: cannot create ", partial, ": ", std::strerror(errno)));
  }
  absl::Cleanup cleanup = [&] {
    close(fd);
    unlink(partial.c_str());  // after linking too: FILE is the backup's name now
  };
  auto context = NewContext(global, kBackupDeadline);
  v1::BackupRequest request;
  std::unique_ptr<grpc::ClientReader<v1::BackupChunk>> reader =
      NewStub(global)->Backup(context.get(), request);
  v1::BackupChunk chunk;
  uint64_t written = 0;
  uint64_t total = 0;
  bool write_ok = true;
  while (reader->Read(&chunk)) {
    if (write_ok) write_ok = WriteAll(fd, chunk.data());
    written += chunk.data().size();
    total = chunk.total_bytes();
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return RpcError("backup", "Backup", status);
  if (!write_ok || fsync(fd) != 0) {
    return absl::DataLossError(
        absl::StrCat("backup: could not write ", partial, ": ", std::strerror(errno)));
  }
  if (written != total) {
    return absl::DataLossError(
        absl::StrFormat("backup: received %d of %d bytes", written, total));
  }
  // link() never replaces: a FILE that appeared meanwhile stays as it was.
  if (link(partial.c_str(), out->c_str()) != 0) {
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat(
          "backup: ", *out, " appeared while the backup ran; kept it as it was"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("backup: cannot name the copy ", *out, ": ", std::strerror(errno)));
  }
  WriteStdout(absl::StrFormat(
      "backup: wrote %s (%d bytes), a consistent copy of the server's database; "
      "a server opens it as its --db\n",
      *out, written));
  return absl::OkStatus();
}

}  // namespace trainwatch::cli
