// Reads what a trainwatch-server stored straight from its SQLite file, as an
// operator would with sqlite3: the crash and outage tests check the file, not
// what the server says about it.
#ifndef TRAINWATCH_TESTS_INTEGRATION_STORED_DATA_H_
#define TRAINWATCH_TESTS_INTEGRATION_STORED_DATA_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::testing {

// (run_id, rank) of one trainer stream (all attempts together).
using RunRank = std::pair<std::string, uint32_t>;

// Every stored step record of every stream, in stored order (by first step
// of each chunk, then the non-lead ranks' digests not in a chunk yet). Opens the file read-write so that SQLite can recover the
// WAL of a server that was SIGKILLed; writes nothing itself. Fails the test
// on an SQLite error.
std::map<RunRank, std::vector<v1::StepRecord>> ReadStoredRecords(
    const std::string& db_path);

// Records stored per stream (the chunks' counts, without decoding them, and
// the non-lead ranks' digests not in a chunk yet).
std::map<RunRank, int64_t> CountStoredRecords(const std::string& db_path);

// Pairs of chunks of one stream that cover a step twice: 0 when every step
// is stored at most once.
int64_t CountOverlappingChunks(const std::string& db_path);

// The RunStart each stream sent, as stored (its latest attempt's).
std::map<RunRank, v1::RunStart> ReadStoredStarts(const std::string& db_path);

struct StoredAlert {
  std::string run_id;
  std::string alertname;
  uint64_t started_step = 0;
  std::string state;
};

// Every row of the alert history.
std::vector<StoredAlert> ReadStoredAlerts(const std::string& db_path);

// Every row of the spike list: (run_id, step).
std::vector<std::pair<std::string, uint64_t>> ReadStoredSpikes(
    const std::string& db_path);

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_INTEGRATION_STORED_DATA_H_
