// The versioned schema of the trainwatch database (PRAGMA user_version).
#ifndef TRAINWATCH_SERVER_STORE_SCHEMA_H_
#define TRAINWATCH_SERVER_STORE_SCHEMA_H_

#include <sqlite3.h>

#include "absl/status/status.h"

namespace trainwatch {

// Creates or upgrades the schema to the current version inside one
// transaction. FAILED_PRECONDITION for a database written by a newer server.
absl::Status MigrateSchema(sqlite3* db, int target_version);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_STORE_SCHEMA_H_
