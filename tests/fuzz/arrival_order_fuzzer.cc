// A run's verdict is a function of its records (docs/architecture.md,
// "Arrival order"), fuzzed: the input is an arrival order, a list of (rank,
// batch size) pairs saying which rank sends how many of its next records as
// one batch, for a 3-rank run with a loss spike, per-shard clipping, a
// double-counted shard and a straggler (tests/common/arrival_order.h). The
// records go through the real RunPipeline; the alerts must equal those of
// the reference order (every rank at once, one record each in turn).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "arrival_order.h"

namespace trainwatch::arrival {
namespace {

RunShape Shape() {
  RunShape s;
  s.world = 3;
  s.steps = 1400;
  s.spike_step = 1200;
  s.mismatch_from = 300;
  s.mismatch_to = 450;
  s.shard_from = 800;
  s.shard_to = 900;
  s.slow_from = 700;
  return s;
}

struct Reference {
  HealthConfig config;
  RankedRun run = MakeRun(Shape());
  Verdict verdict;
  Reference() {
    config.window_steps = 400;
    verdict = Replay(run, RoundRobin(run, 1), config);
  }
};

const Reference& Ref() {
  static const Reference* ref = new Reference();
  return *ref;
}

}  // namespace
}  // namespace trainwatch::arrival

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainwatch::arrival;
  const Reference& ref = Ref();
  // Two bytes a batch, read in order (the seeds in corpus/arrival_order
  // are written that way): the rank, and the batch size (mostly small,
  // sometimes a good part of a rank at once).
  Schedule schedule;
  for (size_t i = 0; i + 1 < size && schedule.size() < 4096; i += 2) {
    const uint32_t rank = data[i] % ref.run.shape.world;
    const uint8_t b = data[i + 1];
    const uint32_t count = b < 200 ? 1u + b : 64u * (b - 199u);
    schedule.push_back({rank, count});
  }
  const Verdict v = Replay(ref.run, schedule, ref.config);
  if (v.lines != ref.verdict.lines || v.lead_window_slots != ref.verdict.lead_window_slots) {
    std::fprintf(stderr, "arrival order changed the verdict\nreference:\n");
    for (const std::string& l : ref.verdict.lines) std::fprintf(stderr, "  %s\n", l.c_str());
    std::fprintf(stderr, "this order:\n");
    for (const std::string& l : v.lines) std::fprintf(stderr, "  %s\n", l.c_str());
    std::abort();
  }
  return 0;
}
