// The writer side of Store: the write connection, its prepared statements and
// the per-stream exactly-once state. Created by Store::Open, then used by the
// store's writer thread only.
#ifndef TRAINWATCH_SERVER_STORE_WRITER_H_
#define TRAINWATCH_SERVER_STORE_WRITER_H_

#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/ranks/rank_digest.h"
#include "store/sqlite.h"
#include "store/store.h"

namespace trainwatch {

// Not thread-safe: owned by the writer thread.
class StoreWriter {
 public:
  // Takes what it needs of `options` (what is kept of non-lead ranks).
  static absl::StatusOr<std::unique_ptr<StoreWriter>> Create(
      sqlite::DbPtr db, const StoreOptions& options);

  // Applies `ops` in one transaction, fills one result per op and returns
  // the transaction's status. When the transaction fails every result
  // carries the error and the exactly-once state is as it was before, so
  // the same ops can be retried.
  absl::Status Apply(const std::vector<WriteOp>& ops,
                     std::vector<WriteResult>& results);

  // Compaction. A batch of few records makes a chunk of few records, and
  // each chunk costs its own column headers (~140 bytes) and SQLite cell
  // (~0.4 KB of a page): a trainer at one step a second sends a record a
  // batch, a replay batches of a few hundred. So, when the writer has
  // nothing queued, it merges runs of a stream's consecutive chunks that
  // hold a small one into chunks of up to kCompactRecords records, in a
  // transaction of its own (readers see the chunks before or after).
  // A record is merged about once. A stream's last chunks wait for more;
  // those of streams written before a restart stay as they are.
  // Bytes bound both too: a chunk of MoE reports (~11 KB a record at 48
  // layers x 128 experts) of a few records is not small, and merging it
  // would decode and code its counts again for headers that are under 1% of
  // it (the writer's coding was a third of the server's CPU on such runs);
  // a merged chunk stays small enough to decode for a query of one step.
  static constexpr size_t kSmallChunk = 512;       // records; fewer is small
  static constexpr size_t kSmallChunkBytes = 64 << 10;  // and a smaller blob
  static constexpr size_t kCompactRecords = 2048;  // records in a merged chunk
  static constexpr size_t kCompactBytes = 1 << 20;  // its parts' blobs, at most
  static bool IsSmallChunk(size_t records, size_t bytes) {
    return records < kSmallChunk && bytes < kSmallChunkBytes;
  }
  // A non-lead rank's digests (store/ranks/rank_digest.h) are not written as
  // chunks of their batches: each transaction appends the run's new digests
  // as one rank_tail row, the writer holds each stream's open digests in
  // memory, and writes them as one chunk of kRankCompactRecords (schema.cc,
  // version 8). A stream's digests older than kMaxDigestAge go into a chunk
  // of their own, however few, and so do a finished stream's.
  static constexpr size_t kRankCompactRecords = 128;
  static constexpr absl::Duration kMaxDigestAge = absl::Minutes(10);
  static constexpr size_t kCompactScanRows = 256;  // chunks read at a time
  bool WantsCompaction() const { return !ready_.empty(); }
  // Streams with a complete group of small chunks, waiting for a merge.
  size_t CompactionBacklog() const { return ready_.size(); }
  // Merges chunks of one stream that has enough; adds the records it
  // rewrote to *merged. Its error is the transaction's (rolled back; that
  // stream is not tried again).
  absl::Status CompactOne(size_t* merged = nullptr);

 private:
  struct StreamState {
    int64_t run_key = 0;
    std::optional<int64_t> last_step;
    bool dirty = false;
    // Retention: no chunk of this stream ends below this step.
    int64_t kept_from = 0;
  };
  // The records of a stream's chunks from from_step on, its first small
  // chunk not yet merged.
  struct SmallChunks {
    int64_t run_key = 0;
    int64_t from_step = 0;
    size_t records = 0;
    size_t bytes = 0;     // their blobs'
    bool queued = false;  // in ready_
  };
  struct RunProgress {
    int64_t max_step = -1;
    int64_t added = 0;
    int64_t last_seen_ns = 0;
  };

  StoreWriter(sqlite::DbPtr db, const StoreOptions& options)
      : db_(std::move(db)),
        digest_ranks_(options.rank_records == StoreOptions::RankRecords::kDigest),
        rank_retention_steps_(options.rank_retention_steps) {}
  absl::Status Prepare();
  // One op inside the open transaction; FAILED_PRECONDITION (without an
  // SQLite code) fails that op alone.
  absl::Status ApplyOne(const WriteOp& op, WriteResult& result);
  absl::Status ApplyStart(const WriteOp& op, WriteResult& result);
  absl::Status ApplyBatch(const WriteOp& op, WriteResult& result);
  // A stream of a rank above its run's lead.
  bool IsRankStream(const StreamKey& key, int64_t run_key) const;
  // The open digests of a non-lead stream, in step order.
  struct RankBuffer {
    int64_t run_key = 0;
    int64_t oldest_seq = 0;  // the rank_tail row of digests.front()
    int64_t oldest_ns = 0;   // when it was received
    std::vector<RankDigest> digests;
  };
  // What the open transaction appends to rank_tail for one run.
  struct OpenTail {
    int64_t seq = 0;
    std::vector<RankTailEntry> streams;
    google::protobuf::RepeatedPtrField<v1::StepRecord> records;
  };
  // ApplyBatch's path for a non-lead stream when digests are kept.
  absl::Status AddDigests(const WriteOp& op, StreamState& st,
                          const google::protobuf::RepeatedPtrField<v1::StepRecord>& records);
  // Writes the stream's open digests as one chunk.
  absl::Status FlushDigests(const StreamKey& key, RankBuffer& buf, StreamState& st);
  // Reads the open digests back from rank_tail (at the first digest after a
  // start or a rolled-back transaction).
  absl::Status EnsureTailsLoaded();
  // At the end of a transaction: appends its rank_tail rows, flushes streams
  // whose digests are too old, deletes the rows nothing open is in.
  absl::Status EndTails(int64_t now_ns);
  // Deletes what retention no longer keeps of a non-lead stream.
  absl::Status Prune(const StreamKey& key, StreamState& st);
  absl::Status ApplyEvent(const WriteOp& op);
  absl::Status ApplyAlert(const WriteOp& op);
  absl::Status ApplySpike(const WriteOp& op);
  absl::Status ApplyHardBatch(const WriteOp& op);
  absl::Status ApplyHold(const WriteOp& op);
  absl::Status ApplyBaselines(const WriteOp& op);
  absl::Status ApplySpikeOutcome(const WriteOp& op);
  absl::Status ApplyHostIncident(const WriteOp& op);
  absl::Status ApplyDeleteRun(const WriteOp& op, WriteResult& result);
  absl::Status ApplyDirective(const WriteOp& op);
  // After a commit that deleted a run: the caches forget it.
  void AfterDelete();
  // Empties the caches of what is committed; they reload lazily.
  void ForgetCaches();
  // The stream's state, FAILED_PRECONDITION if its RunStart is not stored.
  absl::StatusOr<StreamState*> StartedStream(const StreamKey& key);
  // The run's key, FAILED_PRECONDITION if no RunStart of it is stored.
  absl::StatusOr<int64_t> StartedRun(const std::string& run_id);
  absl::StatusOr<int64_t> EnsureRun(const WriteOp& op);
  // The run's key, or nullopt for a run never started.
  absl::StatusOr<std::optional<int64_t>> LookupRun(const std::string& run_id);
  absl::StatusOr<StreamState*> LoadStream(const StreamKey& key,
                                          std::optional<int64_t> run_key);

  sqlite::DbPtr db_;
  const bool digest_ranks_;
  const uint64_t rank_retention_steps_;
  sqlite::Stmt select_run_, insert_run_, update_run_start_, set_run_state_,
      update_run_progress_, select_stream_, insert_stream_, update_stream_,
      insert_chunk_, insert_event_, upsert_alert_, insert_spike_,
      insert_hard_batch_, update_spike_outcome_, insert_host_incident_, select_chunks_from_,
      delete_chunk_, delete_chunks_before_, insert_tail_, delete_tails_before_,
      upsert_directive_, insert_directive_transition_, upsert_hold_;
  // Caches of what is committed; cleared when a transaction fails.
  absl::flat_hash_map<std::string, int64_t> run_keys_;
  // The lowest rank stored of each run (by run key): its lead.
  absl::flat_hash_map<int64_t, uint32_t> lead_ranks_;
  // node_hash_map: StreamState pointers stay valid while the map grows.
  absl::node_hash_map<StreamKey, StreamState> streams_;
  // Streams whose last_step changed in the open transaction.
  std::vector<std::pair<const StreamKey*, StreamState*>> dirty_;
  // What the open transaction added to each run (by run key).
  absl::flat_hash_map<int64_t, RunProgress> progress_;
  // ApplyBatch's scratch: the indices of the op's records that are new.
  std::vector<size_t> picked_;
  // FlushDigests' scratch.
  google::protobuf::RepeatedPtrField<v1::StepRecord> digests_;
  // Non-lead streams' open digests (node_hash_map: keys stay put for
  // oldest_), those with any by the rank_tail row of their oldest, and the
  // rows the open transaction appends (by run key).
  bool tails_loaded_ = false;
  absl::node_hash_map<StreamKey, RankBuffer> rank_buffers_;
  std::set<std::pair<int64_t, const StreamKey*>> oldest_;
  absl::flat_hash_map<int64_t, OpenTail> open_tails_;
  int64_t next_tail_seq_ = 1;
  int64_t tail_deleted_below_ = 0;
  // Compaction: streams with small chunks, and those with enough to merge.
  absl::flat_hash_map<StreamKey, SmallChunks> small_;
  std::deque<StreamKey> ready_;
  bool deleted_run_ = false;  // the open transaction deleted a run
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_STORE_WRITER_H_
