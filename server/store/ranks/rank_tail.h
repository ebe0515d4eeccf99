// Reading the non-lead ranks' open digests (writer.h, schema.cc version 8):
// the digests in rank_tail rows that no chunk of their stream holds yet. A
// stream's digests go into chunks in step order, so its chunks hold every
// digest up to their last step and a digest above it is open. The writer
// reads them back at a start or after a rolled-back transaction, QuerySteps
// to return them after a stream's chunks: both walk them here.
#ifndef TRAINWATCH_SERVER_STORE_RANKS_RANK_TAIL_H_
#define TRAINWATCH_SERVER_STORE_RANKS_RANK_TAIL_H_

#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "store/ranks/rank_digest.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

struct OpenDigest {
  int64_t seq = 0;      // its rank_tail row
  int64_t run_key = 0;
  RankTailEntry stream;
  v1::StepRecord* record = nullptr;  // the callback may move from it
};

// Calls `open` on each open digest of run `run_key` (nullopt: every run) and
// of rank `rank` (nullopt: every rank), in rank_tail order (a stream's in
// step order). DATA_LOSS naming the row for one that does not decode; an
// error `open` returns stops the walk and is returned.
absl::Status ForEachOpenDigest(sqlite3* db, std::optional<int64_t> run_key,
                               std::optional<uint32_t> rank,
                               const std::function<absl::Status(const OpenDigest&)>& open);

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_STORE_RANKS_RANK_TAIL_H_
