// trainwatch-loadgen --ranks N (ranks.cc): one run of N ranks at a step a
// second, one rank slowed; reports whether RankStraggler named it. With
// --ranks-per-stream K, a stream carries K ranks (a host's, as its local
// rank 0 sends them).
#ifndef TRAINWATCH_TOOLS_LOADGEN_RANKS_H_
#define TRAINWATCH_TOOLS_LOADGEN_RANKS_H_

#include <cstdint>
#include <memory>
#include <string>

namespace grpc {
class Channel;
}

namespace trainwatch::loadgen {

// A channel of its own (its own TCP connection), for the streams of both
// modes. Connected before it is used (up to 10 s): a stream's RPC on a
// channel whose first connect failed transiently (once in a while on
// loopback under load, "failed to connect to all addresses") fails at once,
// where gRPC's own reconnect, which this waits for, would have succeeded. A
// server that is not there still fails the streams, after the wait.
std::shared_ptr<grpc::Channel> NewChannel(const std::string& server);

struct RanksOptions {
  std::string server;
  std::string run;              // "" = ranks-N
  uint32_t ranks = 0;
  uint64_t steps = 120;
  double step_seconds = 1.0;    // one step a second, as a large run
  uint32_t slow_rank = 0;       // >= ranks: none
  double slow_factor = 1.0;     // its step time x this from slow_from on
  uint64_t slow_from = 30;
  uint32_t ranks_per_host = 8;  // host = node-(rank / ranks_per_host)
  // Ranks a Report stream carries (a host stream: RunStart.local_ranks, sent
  // by its first rank); 1 = a stream a rank. Divides ranks_per_host.
  uint32_t ranks_per_stream = 1;
  int channels = 16;            // HTTP/2 connections the streams share
  int server_pid = 0;           // > 0: report the server's peak RSS
  bool json = false;
};

// Exit status: 0 when every record was acknowledged and, with a slowed
// rank, RankStraggler named it and its host.
int RunRanks(const RanksOptions& options);

}  // namespace trainwatch::loadgen

#endif  // TRAINWATCH_TOOLS_LOADGEN_RANKS_H_
