// Store's read side: the queries behind the CLI and the query API (runs,
// steps, alerts, spikes, events), recovery at start-up and HostWatch. Each
// call opens its own read-only connection, so reads run on any thread,
// concurrently, and never wait for the writer (WAL); see store.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "store/codec/step_codec.h"
#include "store/ranks/rank_tail.h"
#include "store/store.h"
#include "trainwatch/v1/alert_names.h"

namespace trainwatch {
namespace {

// Fills a RunSummary from a `runs` row read by the columns of kRunColumns.
// The last column counts the run's firing alerts (alerts_firing, a partial
// index, keeps it to the few firing rows), so that a listing shows what
// `alerts --active` shows.
constexpr const char* kRunColumns =
    "run_id, start, attempt, started_ns, last_seen_ns, last_step, steps, "
    "state, (SELECT COUNT(*) FROM alerts a WHERE a.state = 'firing' AND "
    "a.run_key = runs.run_key)";

v1::RunSummary RunFromRow(const sqlite::Stmt& s) {
  v1::RunSummary run;
  v1::RunStart start;
  std::string_view blob = s.Blob(1);
  start.ParseFromArray(blob.data(), static_cast<int>(blob.size()));
  run.set_run_id(std::string(s.Text(0)));
  run.set_world_size(start.world_size() == 0 ? 1 : start.world_size());
  run.set_attempt(static_cast<uint32_t>(s.Int(2)));
  run.set_precision(start.precision());
  run.set_max_norm(start.max_norm());
  run.set_warmup_steps(start.warmup_steps());
  run.mutable_labels()->insert(start.labels().begin(), start.labels().end());
  run.set_started_unix_nanos(s.Int(3));
  run.set_last_seen_unix_nanos(s.Int(4));
  if (!s.IsNull(5)) run.set_last_step(static_cast<uint64_t>(s.Int(5)));
  run.set_steps(static_cast<uint64_t>(s.Int(6)));
  run.set_state(std::string(s.Text(7)));
  run.set_active_alerts(static_cast<uint32_t>(s.Int(8)));
  return run;
}

template <typename Repeated>
void UnpackIds(std::string_view blob, Repeated* out) {
  size_t n = blob.size() / sizeof(int64_t);
  out->Resize(static_cast<int>(n), 0);
  if (n > 0) std::memcpy(out->mutable_data(), blob.data(), n * sizeof(int64_t));
}
// The open digests of a run's non-lead ranks (store/ranks/rank_tail.h), in step
// order by (rank, attempt): rank_tail rows (writer.h) less what a chunk of
// the stream holds (a stream's chunks hold its digests up to their last
// step), with step in [from, to] (to 0: no bound).
using OpenDigests =
    std::map<std::pair<uint32_t, uint32_t>, std::vector<v1::StepRecord>>;

absl::StatusOr<OpenDigests> ReadOpenDigests(sqlite3* db, const std::string& run_id,
                                            std::optional<uint32_t> rank,
                                            uint64_t from, uint64_t to) {
  absl::StatusOr<sqlite::Stmt> run_key =
      sqlite::Stmt::Prepare(db, "SELECT run_key FROM runs WHERE run_id = ?1");
  if (!run_key.ok()) return run_key.status();
  run_key->Bind(1, run_id);
  absl::StatusOr<bool> row = run_key->Step();
  if (!row.ok()) return row.status();
  OpenDigests out;
  if (!*row) return out;
  absl::Status s = ForEachOpenDigest(
      db, run_key->Int(0), rank, [&](const OpenDigest& d) -> absl::Status {
        const uint64_t step = d.record->step();
        if (step >= from && (to == 0 || step <= to)) {
          out[{d.stream.rank, d.stream.attempt}].push_back(std::move(*d.record));
        }
        return absl::OkStatus();
      });
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("the open digests of run ", run_id, ": ",
                                               s.message()));
  }
  return out;
}

}  // namespace

absl::StatusOr<Store::ReadQuery> Store::Query(std::string_view sql) const {
  absl::StatusOr<sqlite::DbPtr> db =
      sqlite::Open(uri_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, Vfs());
  if (!db.ok()) return db.status();
  sqlite3_busy_timeout(db->get(),
                       static_cast<int>(options_.busy_timeout.count()));
  absl::StatusOr<sqlite::Stmt> stmt = sqlite::Stmt::Prepare(db->get(), sql);
  if (!stmt.ok()) return stmt.status();
  return ReadQuery{.db = std::move(*db), .stmt = std::move(*stmt)};
}

absl::StatusOr<std::vector<v1::RunSummary>> Store::ListRuns() const {
  absl::StatusOr<ReadQuery> q = Query(absl::StrCat(
      "SELECT ", kRunColumns, " FROM runs ORDER BY started_ns DESC, run_key DESC"));
  if (!q.ok()) return q.status();
  std::vector<v1::RunSummary> runs;
  absl::Status s = q->stmt.ForEachRow(
      [&](const sqlite::Stmt& row) { runs.push_back(RunFromRow(row)); });
  if (!s.ok()) return s;
  return runs;
}

absl::StatusOr<v1::RunSummary> Store::GetRun(const std::string& run_id) const {
  absl::StatusOr<ReadQuery> q =
      Query(absl::StrCat("SELECT ", kRunColumns, " FROM runs WHERE run_id = ?1"));
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, run_id);
  absl::StatusOr<bool> row = q->stmt.Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("no run \"", run_id, "\""));
  return RunFromRow(q->stmt);
}

absl::StatusOr<v1::RunStart> Store::GetLeadStart(
    const std::string& run_id) const {
  absl::StatusOr<ReadQuery> q = Query("SELECT start FROM runs WHERE run_id = ?1");
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, run_id);
  absl::StatusOr<bool> row = q->stmt.Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(absl::StrCat("no run \"", run_id, "\""));
  v1::RunStart start;
  std::string_view blob = q->stmt.Blob(0);
  if (!start.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) {
    return absl::DataLossError(absl::StrCat("the RunStart of ", run_id, " does not parse"));
  }
  return start;
}

absl::Status Store::ReadSteps(
    const std::string& run_id, uint64_t from_step, uint64_t to_step,
    std::optional<uint32_t> rank, size_t chunk_records,
    const std::function<bool(v1::StepRecords&)>& sink) const {
  absl::StatusOr<ReadQuery> q = Query(
      "SELECT c.rank, c.attempt, c.records FROM step_chunks c "
      "JOIN runs r ON r.run_key = c.run_key WHERE r.run_id = ?1 "
      "AND (?2 < 0 OR c.rank = ?2) AND c.last_step >= ?3 AND c.first_step <= ?4 "
      "ORDER BY c.rank, c.attempt, c.first_step");
  if (!q.ok()) return q.status();
  // One read transaction, so the records form one consistent snapshot.
  if (absl::Status s = sqlite::Exec(q->db.get(), "BEGIN"); !s.ok()) return s;
  sqlite::Stmt& s = q->stmt;
  const int64_t from = static_cast<int64_t>(std::min<uint64_t>(from_step, INT64_MAX));
  const int64_t to = to_step == 0 ? INT64_MAX
                                  : static_cast<int64_t>(std::min<uint64_t>(to_step, INT64_MAX));
  s.Bind(1, run_id).Bind(2, rank.has_value() ? int64_t{*rank} : int64_t{-1})
      .Bind(3, from).Bind(4, to);
  // The digests of other ranks not yet in a chunk (writer.h), by stream;
  // each goes out after its stream's chunks.
  absl::StatusOr<OpenDigests> open = ReadOpenDigests(q->db.get(), run_id, rank, from_step, to_step);
  if (!open.ok()) return open.status();
  auto next_open = open->begin();
  v1::StepRecords out;
  bool stopped = false;
  auto add = [&](uint32_t r, uint32_t attempt, v1::StepRecord& rec) {
    v1::StepRecords::Item* item = out.add_items();
    item->set_rank(r);
    item->set_attempt(attempt);
    item->mutable_record()->Swap(&rec);
    if (static_cast<size_t>(out.items_size()) >= chunk_records) {
      stopped = !sink(out);
      out.Clear();
    }
  };
  // The open digests of the streams ordered before `key` (nullopt: all).
  auto add_open_before = [&](std::optional<std::pair<uint32_t, uint32_t>> key) {
    for (; !stopped && next_open != open->end() && (!key || next_open->first < *key);
         ++next_open) {
      for (v1::StepRecord& rec : next_open->second) {
        if (stopped) break;
        add(next_open->first.first, next_open->first.second, rec);
      }
    }
  };
  google::protobuf::RepeatedPtrField<v1::StepRecord> chunk;
  size_t rows = open->size();
  while (!stopped) {
    absl::StatusOr<bool> row = s.Step();
    if (!row.ok()) return row.status();
    if (!*row) break;
    ++rows;
    uint32_t r = static_cast<uint32_t>(s.Int(0));
    uint32_t attempt = static_cast<uint32_t>(s.Int(1));
    add_open_before(std::pair{r, attempt});
    if (absl::Status d = DecodeStepChunk(s.Blob(2), &chunk); !d.ok()) {
      return absl::DataLossError(absl::StrCat("a stored chunk of run ", run_id,
                                              " (rank ", r, ", attempt ",
                                              attempt, "): ", d.message()));
    }
    for (v1::StepRecord& rec : chunk) {
      if (stopped) break;
      if (rec.step() < from_step || (to_step != 0 && rec.step() > to_step)) {
        continue;
      }
      add(r, attempt, rec);
    }
  }
  add_open_before(std::nullopt);
  if (stopped) return absl::OkStatus();
  if (out.items_size() > 0) sink(out);
  if (rows == 0) {
    // Tell an unknown run from a known run with nothing in range.
    absl::StatusOr<v1::RunSummary> run = GetRun(run_id);
    if (!run.ok()) return run.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Alert>> Store::ListAlerts(
    const std::string& run_id, bool active_only) const {
  absl::StatusOr<ReadQuery> q = Query(
      "SELECT r.run_id, a.alertname, a.severity, a.state, a.started_step, "
      "a.resolved_step, a.started_ns, a.resolved_ns, a.peak_value, a.summary, "
      "a.description, a.likely_cause, a.fix, a.batch_ids, a.rank, a.host, "
      "a.onset_step, a.caused_by FROM alerts a "
      "JOIN runs r ON r.run_key = a.run_key WHERE (?1 = '' OR r.run_id = ?1) "
      "AND (?2 = 0 OR a.state = 'firing') "
      "ORDER BY a.started_ns DESC, a.started_step DESC");
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, run_id).Bind(2, int64_t{active_only ? 1 : 0});
  std::vector<v1::Alert> alerts;
  absl::Status status = q->stmt.ForEachRow([&](const sqlite::Stmt& s) {
    v1::Alert& a = alerts.emplace_back();
    a.set_run(std::string(s.Text(0)));
    a.set_alertname(std::string(s.Text(1)));
    a.set_severity(v1::SeverityByName(s.Text(2)).value_or(v1::SEVERITY_UNSPECIFIED));
    a.set_state(v1::StateByName(s.Text(3)).value_or(v1::ALERT_STATE_UNSPECIFIED));
    a.set_started_step(static_cast<uint64_t>(s.Int(4)));
    if (!s.IsNull(5)) a.set_resolved_step(static_cast<uint64_t>(s.Int(5)));
    a.set_started_unix_nanos(s.Int(6));
    if (!s.IsNull(7)) a.set_resolved_unix_nanos(s.Int(7));
    a.set_peak_value(s.IsNull(8) ? std::nan("") : s.Double(8));
    a.set_summary(std::string(s.Text(9)));
    a.set_description(std::string(s.Text(10)));
    a.set_likely_cause(std::string(s.Text(11)));
    a.set_fix(std::string(s.Text(12)));
    UnpackIds(s.Blob(13), a.mutable_batch_ids());
    a.set_rank(static_cast<uint32_t>(s.Int(14)));
    a.set_host(std::string(s.Text(15)));
    a.set_onset_step(static_cast<uint64_t>(s.Int(16)));
    a.set_caused_by(std::string(s.Text(17)));
  });
  if (!status.ok()) return status;
  if (alerts.empty() && !run_id.empty()) {
    absl::StatusOr<v1::RunSummary> run = GetRun(run_id);
    if (!run.ok()) return run.status();
  }
  return alerts;
}

absl::StatusOr<std::vector<v1::Spike>> Store::ListSpikes(
    const std::string& run_id) const {
  absl::StatusOr<ReadQuery> q = Query(
      "SELECT s.step, s.grad_norm, s.ratio_to_ema, s.sigmas, s.batch_ids, "
      "s.outcome, s.batches_skipped "
      "FROM spikes s JOIN runs r ON r.run_key = s.run_key WHERE r.run_id = ?1 "
      "ORDER BY s.step");
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, run_id);
  std::vector<v1::Spike> spikes;
  absl::Status status = q->stmt.ForEachRow([&](const sqlite::Stmt& s) {
    v1::Spike& sp = spikes.emplace_back();
    sp.set_step(static_cast<uint64_t>(s.Int(0)));
    sp.set_grad_norm(s.Double(1));
    sp.set_ratio_to_ema(s.Double(2));
    sp.set_sigmas(s.Double(3));
    UnpackIds(s.Blob(4), sp.mutable_batch_ids());
    sp.set_outcome(std::string(s.Text(5)));
    sp.set_batches_skipped(s.Int(6) != 0);
  });
  if (!status.ok()) return status;
  return spikes;
}

absl::StatusOr<std::vector<HoldRow>> Store::ListHolds() const {
  absl::StatusOr<ReadQuery> q = Query(
      "SELECT run_id, until_ns, who, set_ns FROM directive_holds WHERE until_ns != 0 "
      "ORDER BY run_id");
  if (!q.ok()) return q.status();
  std::vector<HoldRow> out;
  absl::Status status = q->stmt.ForEachRow([&](const sqlite::Stmt& s) {
    out.push_back(HoldRow{std::string(s.Text(0)), s.Int(1), std::string(s.Text(2)), s.Int(3)});
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::vector<v1::HardBatch>> Store::ListHardBatches(
    const std::string& run_id, size_t limit) const {
  absl::StatusOr<ReadQuery> q = Query(
      "SELECT h.step, h.high_steps, h.peak, h.level, h.peak_is_ratio, h.batch_ids "
      "FROM hard_batches h JOIN runs r ON r.run_key = h.run_key WHERE r.run_id = ?1 "
      "ORDER BY h.step DESC LIMIT ?2");
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, run_id).Bind(2, static_cast<int64_t>(limit));
  std::vector<v1::HardBatch> out;
  absl::Status status = q->stmt.ForEachRow([&](const sqlite::Stmt& s) {
    v1::HardBatch& h = out.emplace_back();
    h.set_step(static_cast<uint64_t>(s.Int(0)));
    h.set_high_steps(static_cast<uint32_t>(s.Int(1)));
    h.set_peak(s.Double(2));
    h.set_level(s.Double(3));
    h.set_peak_is_ratio(s.Int(4) != 0);
    UnpackIds(s.Blob(5), h.mutable_batch_ids());
  });
  if (!status.ok()) return status;
  std::reverse(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::vector<HostIncidentRow>> Store::ListHostIncidents(
    int64_t since_unix_nanos) const {
  absl::StatusOr<ReadQuery> q = Query(
      "SELECT host, alertname, run_id, time_ns FROM host_incidents "
      "WHERE time_ns >= ?1 ORDER BY time_ns");
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, since_unix_nanos);
  std::vector<HostIncidentRow> rows;
  absl::Status status = q->stmt.ForEachRow([&](const sqlite::Stmt& s) {
    rows.push_back(HostIncidentRow{.host = std::string(s.Text(0)),
                                   .alertname = std::string(s.Text(1)),
                                   .run_id = std::string(s.Text(2)),
                                   .unix_nanos = s.Int(3)});
  });
  if (!status.ok()) return status;
  return rows;
}

absl::StatusOr<std::vector<v1::RunEvent>> Store::ListEvents(
    const std::string& run_id) const {
  absl::StatusOr<ReadQuery> q = Query(
      "SELECT e.step, e.kind, e.detail, e.time_ns FROM events e JOIN runs r "
      "ON r.run_key = e.run_key WHERE r.run_id = ?1 ORDER BY e.step, e.time_ns");
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, run_id);
  std::vector<v1::RunEvent> events;
  absl::Status status = q->stmt.ForEachRow([&](const sqlite::Stmt& s) {
    v1::RunEvent& e = events.emplace_back();
    e.set_step(static_cast<uint64_t>(s.Int(0)));
    e.set_kind(static_cast<v1::EventKind>(s.Int(1)));
    e.set_detail(std::string(s.Text(2)));
    e.set_time_unix_nanos(s.Int(3));
  });
  if (!status.ok()) return status;
  return events;
}

absl::StatusOr<std::vector<v1::DirectiveRecord>> Store::ListDirectives(
    const std::string& run_id) const {
  absl::StatusOr<ReadQuery> q = Query(
      "SELECT r.run_id, d.directive, d.run_key, d.seq FROM directives d JOIN runs r "
      "ON r.run_key = d.run_key WHERE ?1 = '' OR r.run_id = ?1 ORDER BY d.run_key, d.seq");
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, run_id);
  std::vector<v1::DirectiveRecord> out;
  absl::flat_hash_map<std::pair<int64_t, int64_t>, size_t> index;
  absl::Status status = q->stmt.ForEachRow([&](const sqlite::Stmt& s) {
    v1::DirectiveRecord& d = out.emplace_back();
    const std::string_view blob = s.Blob(1);
    if (!d.ParseFromArray(blob.data(), static_cast<int>(blob.size()))) d.Clear();
    d.set_run_id(std::string(s.Text(0)));
    index[{s.Int(2), s.Int(3)}] = out.size() - 1;
  });
  if (!status.ok()) return status;
  absl::StatusOr<ReadQuery> t = Query(
      "SELECT t.run_key, t.seq, t.state, t.who, t.time_ns, t.why FROM directive_transitions t "
      "JOIN runs r ON r.run_key = t.run_key WHERE ?1 = '' OR r.run_id = ?1 "
      "ORDER BY t.run_key, t.seq, t.n");
  if (!t.ok()) return t.status();
  t->stmt.Bind(1, run_id);
  status = t->stmt.ForEachRow([&](const sqlite::Stmt& s) {
    auto it = index.find(std::make_pair(s.Int(0), s.Int(1)));
    if (it == index.end()) return;
    v1::DirectiveTransition* tr = out[it->second].add_transitions();
    tr->set_state(std::string(s.Text(2)));
    tr->set_who(std::string(s.Text(3)));
    tr->set_unix_nanos(s.Int(4));
    tr->set_why(std::string(s.Text(5)));
  });
  if (!status.ok()) return status;
  return out;
}

absl::Status Store::Backup(const std::string& path) const {
  absl::StatusOr<ReadQuery> q = Query("VACUUM INTO ?1");
  if (!q.ok()) return q.status();
  q->stmt.Bind(1, path);
  if (absl::Status s = q->stmt.Run(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("backup to ", path, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace trainwatch
