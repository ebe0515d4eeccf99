#include "store/schema.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "store/sqlite.h"

namespace trainwatch {
namespace {

// Version 1. Step numbers are stored as SQLite's signed 64-bit integers.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE runs (
  run_key      INTEGER PRIMARY KEY,
  run_id       TEXT NOT NULL UNIQUE,
  start        BLOB NOT NULL,      -- RunStart of the lead stream (serialized)
  lead_rank    INTEGER NOT NULL,   -- lowest rank seen; its latest attempt is the lead
  attempt      INTEGER NOT NULL,   -- latest attempt of the lead rank
  started_ns   INTEGER NOT NULL,
  last_seen_ns INTEGER NOT NULL,
  last_step    INTEGER,            -- highest step stored, any rank
  steps        INTEGER NOT NULL DEFAULT 0,  -- records stored, all ranks
  state        TEXT NOT NULL DEFAULT 'running'
);
CREATE TABLE streams (
  run_key    INTEGER NOT NULL REFERENCES runs(run_key),
  rank       INTEGER NOT NULL,
  attempt    INTEGER NOT NULL,
  start      BLOB NOT NULL,
  started_ns INTEGER NOT NULL,
  last_step  INTEGER,              -- exactly-once: highest step committed
  PRIMARY KEY (run_key, rank, attempt)
) WITHOUT ROWID;
CREATE TABLE step_chunks (
  run_key    INTEGER NOT NULL,
  rank       INTEGER NOT NULL,
  attempt    INTEGER NOT NULL,
  first_step INTEGER NOT NULL,
  last_step  INTEGER NOT NULL,
  n          INTEGER NOT NULL,
  records    BLOB NOT NULL,        -- serialized trainwatch.v1.StepBatch (records only)
  PRIMARY KEY (run_key, rank, attempt, first_step)
) WITHOUT ROWID;
CREATE TABLE events (
  run_key INTEGER NOT NULL,
  rank    INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  step    INTEGER NOT NULL,
  kind    INTEGER NOT NULL,
  detail  TEXT NOT NULL,
  time_ns INTEGER NOT NULL,
  PRIMARY KEY (run_key, rank, attempt, step, kind)
) WITHOUT ROWID;
)sql";

// Version 2: the alert history and the spike list of the health engine.
constexpr const char* kSchemaV2 = R"sql(
CREATE TABLE alerts (
  run_key       INTEGER NOT NULL,
  alertname     TEXT NOT NULL,
  started_step  INTEGER NOT NULL,
  severity      TEXT NOT NULL,
  state         TEXT NOT NULL,     -- firing | resolved
  resolved_step INTEGER,
  started_ns    INTEGER NOT NULL,
  resolved_ns   INTEGER,
  peak_value    REAL,
  summary       TEXT NOT NULL,
  description   TEXT NOT NULL,
  likely_cause  TEXT NOT NULL,
  fix           TEXT NOT NULL,
  batch_ids     BLOB NOT NULL,     -- packed little-endian int64s
  rank          INTEGER NOT NULL,
  PRIMARY KEY (run_key, alertname, started_step)
) WITHOUT ROWID;
CREATE INDEX alerts_firing ON alerts (state) WHERE state = 'firing';
CREATE TABLE spikes (
  run_key      INTEGER NOT NULL,
  step         INTEGER NOT NULL,
  grad_norm    REAL NOT NULL,
  ratio_to_ema REAL NOT NULL,
  sigmas       REAL NOT NULL,
  batch_ids    BLOB NOT NULL,
  PRIMARY KEY (run_key, step)
) WITHOUT ROWID;
)sql";

// Version 4: what goodput and the restart loop keep (docs/detectors.md): a
// spike's replay verdict, the host an alert names, and the incidents that
// implicate a host (HostSuspect remembers them across restarts).
constexpr const char* kSchemaV4 = R"sql(
ALTER TABLE spikes ADD COLUMN outcome TEXT NOT NULL DEFAULT '';
ALTER TABLE spikes ADD COLUMN batches_skipped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE alerts ADD COLUMN host TEXT NOT NULL DEFAULT '';
CREATE TABLE host_incidents (
  host      TEXT NOT NULL,
  time_ns   INTEGER NOT NULL,
  run_id    TEXT NOT NULL,
  alertname TEXT NOT NULL,
  PRIMARY KEY (host, time_ns, run_id, alertname)
) WITHOUT ROWID;
CREATE INDEX host_incidents_time ON host_incidents (time_ns);
)sql";

// Version 5: an alert's change-point estimate and the alert it is a
// consequence of (docs/detectors.md). After 4 so that a database already at 4
// gets them too.
constexpr const char* kSchemaV5 = R"sql(
ALTER TABLE alerts ADD COLUMN onset_step INTEGER NOT NULL DEFAULT 0;
ALTER TABLE alerts ADD COLUMN caused_by TEXT NOT NULL DEFAULT '';
)sql";

// Version 6: step_chunks as a rowid table, with its primary key as a separate
// index. WITHOUT ROWID kept each chunk (~80 KB for 1,024 records) inside the
// primary key's b-tree, and SQLite compares a key with a cell whose payload
// overflows by reading the whole cell: with many runs writing, the inserts'
// key comparisons copied chunks (~6% of the server's CPU at 16 runs; 15-20%
// more records a second without them, docs/performance.md). Copies the
// chunks of an existing database once.
constexpr const char* kSchemaV6 = R"sql(
CREATE TABLE step_chunks_v6 (
  run_key    INTEGER NOT NULL,
  rank       INTEGER NOT NULL,
  attempt    INTEGER NOT NULL,
  first_step INTEGER NOT NULL,
  last_step  INTEGER NOT NULL,
  n          INTEGER NOT NULL,
  records    BLOB NOT NULL,        -- serialized trainwatch.v1.StepBatch (records only)
  PRIMARY KEY (run_key, rank, attempt, first_step)
);
INSERT INTO step_chunks_v6 (run_key, rank, attempt, first_step, last_step, n, records)
  SELECT run_key, rank, attempt, first_step, last_step, n, records FROM step_chunks;
DROP TABLE step_chunks;
ALTER TABLE step_chunks_v6 RENAME TO step_chunks;
)sql";

// Version 7: step_chunks.records may hold the columnar encoding of
// store/codec/step_codec.h (its first byte, 0x07, never starts a serialized
// StepBatch); chunks written before keep their StepBatch and read as they are,
// so nothing is rewritten: a migration that re-encoded every chunk would hold
// the write lock and need the file's size again in the WAL for as long as it
// takes, for a one-time saving on old runs. The version tells a server of
// version 6, which cannot read the new chunks, to refuse the file.

// Version 8: the digests of non-lead ranks (store/ranks/rank_digest.h) not yet
// in a chunk. A trainer at a step a second sends a record a batch, so a row a
// record would cost ~100 bytes and a b-tree cell each, and merging a stream's
// rows later would touch a page per row (its rows lie among every other
// rank's). Instead each transaction appends one row per run holding that
// run's new digests, every stream's; the writer keeps each stream's open
// digests in memory and writes them as one chunk once it has a group, and
// a row is deleted once every digest in it is in a chunk. A server restart
// reads the open digests back from these rows.
constexpr const char* kSchemaV8 = R"sql(
CREATE TABLE IF NOT EXISTS rank_tail (
  seq     INTEGER PRIMARY KEY,   -- in commit order
  run_key INTEGER NOT NULL,
  records BLOB NOT NULL          -- rank_digest.h EncodeRankTail
);
)sql";

// Version 9: a chunk with MoE routing counts may hold format 2 of
// store/codec/step_codec.h (first byte 0x0f: the counts coded after the
// residues); chunks of format 1 read as they are, so nothing is rewritten.
// The version tells a server of version 8, which cannot read those chunks,
// to refuse the file.

// Version 10: the closed loop's record (docs/closed-loop.md): every directive
// the server proposed for a run, and every transition of each (who moved it,
// when, why), kept until the run is deleted; and the loss's hard batches
// (1-2 high losses of 5), listed apart from the spikes; and each run's
// hold on the policy (a person's veto must outlive a restart) (a hard batch and a
// gradient spike share a step often).
constexpr const char* kSchemaV10 = R"sql(
CREATE TABLE IF NOT EXISTS hard_batches (
  run_key       INTEGER NOT NULL,
  step          INTEGER NOT NULL,
  high_steps    INTEGER NOT NULL,
  peak          REAL NOT NULL,
  level         REAL NOT NULL,
  peak_is_ratio INTEGER NOT NULL,
  batch_ids     BLOB NOT NULL,
  PRIMARY KEY (run_key, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS directive_holds (
  run_id   TEXT PRIMARY KEY,     -- a hold may come before the run starts
  until_ns INTEGER NOT NULL,     -- 0: released
  who      TEXT NOT NULL,
  set_ns   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS directives (
  run_key   INTEGER NOT NULL,
  seq       INTEGER NOT NULL,
  id        TEXT NOT NULL,
  state     TEXT NOT NULL,
  directive BLOB NOT NULL,       -- serialized DirectiveRecord, without transitions
  PRIMARY KEY (run_key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS directive_transitions (
  run_key INTEGER NOT NULL,
  seq     INTEGER NOT NULL,      -- the directive's
  n       INTEGER NOT NULL,      -- 0, 1, ... in the order they happened
  id      TEXT NOT NULL,
  state   TEXT NOT NULL,
  who     TEXT NOT NULL,
  time_ns INTEGER NOT NULL,
  why     TEXT NOT NULL,
  PRIMARY KEY (run_key, seq, n)
) WITHOUT ROWID;
)sql";

// Version 11: each run's reference runs as `trainwatchctl baseline set`
// named them (docs/baselines.md), by run id: they may be set before the run
// starts, and go with the run when it is deleted.
constexpr const char* kSchemaV11 = R"sql(
CREATE TABLE IF NOT EXISTS baselines (
  run_id      TEXT NOT NULL,
  n           INTEGER NOT NULL,  -- 0, 1, ... in the order given
  ref_run     TEXT NOT NULL,
  ref_attempt INTEGER NOT NULL,
  PRIMARY KEY (run_id, n)
) WITHOUT ROWID;
)sql";

// Version 12: chunks are written with kStepChunkFloat32 in their format byte
// (0x17, 0x1f; store/codec/step_codec.h): a clip_coef column may be predicted
// by clip_grad_norm_'s float32 formula, as trainwatch.torch's records have
// it. Chunks without the flag read as they are, so nothing is rewritten.
// The version tells a server of version 11, which cannot read those chunks,
// to refuse the file.

absl::StatusOr<int> UserVersion(sqlite3* db) {
  absl::StatusOr<sqlite::Stmt> s = sqlite::Stmt::Prepare(db, "PRAGMA user_version");
  if (!s.ok()) return s.status();
  absl::StatusOr<bool> row = s->Step();
  if (!row.ok()) return row.status();
  return *row ? static_cast<int>(s->Int(0)) : 0;
}

}  // namespace

absl::Status MigrateSchema(sqlite3* db, int target_version) {
  if (absl::Status s = sqlite::Exec(db, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<int> version = UserVersion(db);
    if (!version.ok()) return version.status();
    if (*version > target_version) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the database has schema version ", *version,
          ", newer than this server's ", target_version,
          "; use a newer trainwatch-server or another --db"));
    }
    if (*version < 1) {
      if (absl::Status s = sqlite::Exec(db, kSchemaV1); !s.ok()) return s;
    }
    if (*version < 2 && target_version >= 2) {
      if (absl::Status s = sqlite::Exec(db, kSchemaV2); !s.ok()) return s;
    }
    if (*version < 4 && target_version >= 4) {
      if (absl::Status s = sqlite::Exec(db, kSchemaV4); !s.ok()) return s;
    }
    if (*version < 5 && target_version >= 5) {
      if (absl::Status s = sqlite::Exec(db, kSchemaV5); !s.ok()) return s;
    }
    if (*version < 6 && target_version >= 6) {
      if (*version >= 1) {  // an existing file: say why this start is slow
        std::fprintf(stderr,
                     "trainwatch-server: converting the database from schema "
                     "version %d to 6 (copies every stored chunk once)\n",
                     *version);
      }
      if (absl::Status s = sqlite::Exec(db, kSchemaV6); !s.ok()) return s;
    }
    if (*version < 8 && target_version >= 8) {
      if (absl::Status s = sqlite::Exec(db, kSchemaV8); !s.ok()) return s;
    }
    if (*version < 10 && target_version >= 10) {
      if (absl::Status s = sqlite::Exec(db, kSchemaV10); !s.ok()) return s;
    }
    if (*version < 11 && target_version >= 11) {
      if (absl::Status s = sqlite::Exec(db, kSchemaV11); !s.ok()) return s;
    }
    return sqlite::Exec(
        db, absl::StrCat("PRAGMA user_version = ", target_version).c_str());
  }();
  if (!status.ok()) {
    sqlite::Exec(db, "ROLLBACK").IgnoreError();
    return status;
  }
  return sqlite::Exec(db, "COMMIT");
}

}  // namespace trainwatch
