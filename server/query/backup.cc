// Query::Backup: an online copy of the database, staged in the operator's
// --backup-dir (never the system's temp directory, which a read-only root
// filesystem does not have) and streamed to the caller.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "query/query.h"
#include "store/sqlite.h"

namespace trainwatch {
namespace {

// Staging files: "<prefix><pid>-<n>", so a restart knows its own leftovers.
constexpr char kStagingPrefix[] = ".trainwatch-backup-";

std::string Errno(int err) { return std::strerror(err); }

}  // namespace

absl::StatusOr<int> Query::RemoveStaleBackups() const {
  DIR* dir = opendir(backup_dir_.c_str());
  if (dir == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backup-dir ", backup_dir_, " cannot be read: ", Errno(errno)));
  }
  absl::Cleanup close_dir = [dir] { closedir(dir); };
  int removed = 0;
  while (const dirent* e = readdir(dir)) {
    if (!absl::StartsWith(e->d_name, kStagingPrefix)) continue;
    // unlinkat does not follow a link: a planted one is removed, not its target.
    if (unlinkat(dirfd(dir), e->d_name, 0) == 0) ++removed;
  }
  return removed;
}

absl::Status Query::Backup(
    const std::function<bool(const v1::BackupChunk&)>& sink) const {
  if (backups_running_.fetch_add(1) >= kMaxConcurrentBackups) {
    backups_running_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        "backup: ", kMaxConcurrentBackups,
        " backups are running already (each holds a copy of the database); "
        "retry when one ends"));
  }
  absl::Cleanup done = [this] { backups_running_.fetch_sub(1); };
  static std::atomic<uint64_t> serial{0};
  const std::string path = absl::StrCat(backup_dir_, "/", kStagingPrefix, getpid(), "-",
                                        serial.fetch_add(1));
  // Ours alone: created here (never an existing file or a link's target),
  // readable by the server's user only (it holds every tenant's data).
  const int created = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                           0600);
  if (created < 0) {
    const int err = errno;
    const std::string why = absl::StrCat("backup: cannot create a staging file in ",
                                         backup_dir_, " (--backup-dir): ", Errno(err));
    return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(why)
                                          : absl::FailedPreconditionError(why);
  }
  close(created);
  absl::Cleanup remove = [&path] { unlink(path.c_str()); };
  if (absl::Status s = store_->Backup(path); !s.ok()) {
    if ((sqlite::ResultCode(s) & 0xff) == SQLITE_FULL) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "backup: ", backup_dir_, " (--backup-dir) has no room for a copy of the database: ",
          s.message()));
    }
    return s;
  }
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("backup: reopening ", path, ": ", Errno(errno)));
  absl::Cleanup close_fd = [fd] { close(fd); };
  // Unlinked while open: the space is given back when the stream ends,
  // however it ends.
  std::move(remove).Invoke();
  struct stat st {};
  if (fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat("backup: ", Errno(errno)));
  v1::BackupChunk chunk;
  chunk.set_total_bytes(static_cast<uint64_t>(st.st_size));
  std::string buffer(kBackupChunkBytes, '\0');
  for (;;) {
    const ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat("backup: reading the copy: ", Errno(errno)));
    if (n == 0) break;
    chunk.set_data(buffer.data(), static_cast<size_t>(n));
    if (!sink(chunk)) return absl::CancelledError("backup: the client went away");
  }
  return absl::OkStatus();
}

}  // namespace trainwatch
