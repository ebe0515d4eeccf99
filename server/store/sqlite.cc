#include "store/sqlite.h"

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainwatch::sqlite {
namespace {

constexpr const char* kResultCodeUrl = "trainwatch/sqlite-result-code";

absl::Status WithCode(absl::Status status, int rc) {
  status.SetPayload(kResultCodeUrl, absl::Cord(absl::StrCat(rc)));
  return status;
}

}  // namespace

absl::Status Error(sqlite3* db, int rc, std::string_view what) {
  std::string msg = absl::StrCat(std::string(what), ": ", sqlite3_errstr(rc));
  if (db != nullptr && sqlite3_errcode(db) == rc &&
      std::string_view(sqlite3_errmsg(db)) != sqlite3_errstr(rc)) {
    absl::StrAppend(&msg, " (", sqlite3_errmsg(db), ")");
  }
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
    case SQLITE_IOERR:
      return WithCode(absl::UnavailableError(msg), rc);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return WithCode(absl::DataLossError(msg), rc);
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return WithCode(absl::FailedPreconditionError(msg), rc);
    default:
      return WithCode(absl::InternalError(msg), rc);
  }
}

int ResultCode(const absl::Status& status) {
  auto payload = status.GetPayload(kResultCodeUrl);
  int rc = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &rc)) {
    return 0;
  }
  return rc;
}

bool IsTransient(int rc) {
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
    case SQLITE_NOMEM:
    case SQLITE_PROTOCOL:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<DbPtr> Open(const std::string& path, int flags,
                           const char* vfs) {
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw, flags | SQLITE_OPEN_URI, vfs);
  DbPtr db(raw);
  if (rc != SQLITE_OK) {
    return Error(raw, rc, absl::StrCat("opening ", path));
  }
  sqlite3_extended_result_codes(raw, 1);
  return db;
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string what = absl::StrCat("executing \"", std::string(std::string_view(sql).substr(0, 60)), "\"");
    if (err != nullptr) sqlite3_free(err);
    return Error(db, rc, what);
  }
  return absl::OkStatus();
}

absl::StatusOr<Stmt> Stmt::Prepare(sqlite3* db, std::string_view sql) {
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()),
                              SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
  if (rc != SQLITE_OK) {
    return Error(db, rc, absl::StrCat("preparing \"", std::string(sql.substr(0, 60)), "\""));
  }
  Stmt s;
  s.s_.reset(raw);
  return s;
}

absl::StatusOr<bool> Stmt::Step() {
  int rc = sqlite3_step(s_.get());
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return Error(sqlite3_db_handle(s_.get()), rc, "executing a statement");
}

absl::Status Stmt::Run() {
  absl::StatusOr<bool> r = Step();
  Reset();
  return r.status();
}

std::string_view Stmt::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(s_.get(), col);
  return p == nullptr ? std::string_view()
                      : std::string_view(reinterpret_cast<const char*>(p),
                                         sqlite3_column_bytes(s_.get(), col));
}

std::string_view Stmt::Blob(int col) const {
  const void* p = sqlite3_column_blob(s_.get(), col);
  return p == nullptr ? std::string_view()
                      : std::string_view(static_cast<const char*>(p),
                                         sqlite3_column_bytes(s_.get(), col));
}

}  // namespace trainwatch::sqlite
