// Thin RAII over the SQLite C API: a connection, a prepared statement that
// finalizes itself, and errors as absl::Status with SQLite's message.
// Not thread-safe: each object belongs to one thread at a time.
#ifndef TRAINWATCH_SERVER_STORE_SQLITE_H_
#define TRAINWATCH_SERVER_STORE_SQLITE_H_

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trainwatch::sqlite {

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
struct StmtFinalizer {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using DbPtr = std::unique_ptr<sqlite3, DbCloser>;

// Maps a SQLite result code to a status; `what` says what was being done.
// The status carries `rc` (see ResultCode).
absl::Status Error(sqlite3* db, int rc, std::string_view what);

// The (extended) SQLite result code a status from Error() carries; 0 for a
// status that did not come from SQLite.
int ResultCode(const absl::Status& status);

// Whether `rc` is a fault of the environment that can clear by itself, so a
// transaction that failed with it is worth retrying unchanged: the disk full,
// an I/O error, the database locked by another connection past the busy
// timeout, a file that cannot be opened or is read-only for now, no memory.
// Not: constraint violations, corruption, misuse, SQL errors.
bool IsTransient(int rc);

// `vfs`: the name of a registered SQLite VFS; nullptr for the default.
absl::StatusOr<DbPtr> Open(const std::string& path, int flags,
                           const char* vfs = nullptr);

// Runs one or more statements that return no rows.
absl::Status Exec(sqlite3* db, const char* sql);

class Stmt {
 public:
  Stmt() = default;
  static absl::StatusOr<Stmt> Prepare(sqlite3* db, std::string_view sql);

  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_.get(), i, v);
    return *this;
  }
  Stmt& Bind(int i, double v) {
    sqlite3_bind_double(s_.get(), i, v);
    return *this;
  }
  Stmt& Bind(int i, std::string_view v) {
    sqlite3_bind_text(s_.get(), i, v.data(), static_cast<int>(v.size()),
                      SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindBlob(int i, std::string_view v) {
    sqlite3_bind_blob(s_.get(), i, v.data(), static_cast<int>(v.size()),
                      SQLITE_TRANSIENT);
    return *this;
  }
  // Without SQLite's copy (a step chunk of MoE reports is ~180 KB): `v`
  // must outlive this statement's next Run(), which clears the bindings.
  Stmt& BindBlobUntilRun(int i, std::string_view v) {
    sqlite3_bind_blob(s_.get(), i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
    return *this;
  }

  // SQLITE_ROW -> true, SQLITE_DONE -> false, else an error.
  absl::StatusOr<bool> Step();
  // Steps through every row, calling `row(stmt)` on each; an error stops it.
  template <typename F>
  absl::Status ForEachRow(F&& row) {
    while (true) {
      absl::StatusOr<bool> more = Step();
      if (!more.ok()) return more.status();
      if (!*more) return absl::OkStatus();
      row(std::as_const(*this));
    }
  }
  // Steps a statement that returns no rows, then resets it for reuse.
  absl::Status Run();
  void Reset() {
    sqlite3_reset(s_.get());
    sqlite3_clear_bindings(s_.get());
  }

  int64_t Int(int col) const { return sqlite3_column_int64(s_.get(), col); }
  double Double(int col) const { return sqlite3_column_double(s_.get(), col); }
  std::string_view Text(int col) const;
  std::string_view Blob(int col) const;
  bool IsNull(int col) const {
    return sqlite3_column_type(s_.get(), col) == SQLITE_NULL;
  }

 private:
  std::unique_ptr<sqlite3_stmt, StmtFinalizer> s_;
};

}  // namespace trainwatch::sqlite

#endif  // TRAINWATCH_SERVER_STORE_SQLITE_H_
