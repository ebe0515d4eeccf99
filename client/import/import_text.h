// The line parsers behind ParseTrainingStdout (import_files.h), one per log
// format, exposed for tests.
#ifndef TRAINWATCH_CLIENT_IMPORT_IMPORT_TEXT_H_
#define TRAINWATCH_CLIENT_IMPORT_IMPORT_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "import/import_log.h"

namespace trainwatch::cli {

// What the line parsers of one stdout file share: the tag map, the run they
// fill, and what earlier lines left for later ones. Thread-compatible.
struct StdoutParse {
  const TagMap& map;
  LoggedRun* run;
  uint64_t step_lines = 0;      // lines that gave a step
  uint64_t overflow_lines = 0;  // DeepSpeed overflow lines
  // Overflow lines since the last iteration line, and the scale the last one
  // reduced to: they belong to the next iteration line's step.
  uint32_t pending_overflows = 0;
  std::optional<double> pending_scale;
};

// Each parser returns whether `line` is of its format (and then has read
// it), or an error that starts with `where` ("FILE:LINE").
//
// DeepSpeed: "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss
// scale: 65536, reducing to 32768" (and "Overflow detected. ..."): counted
// for the next iteration line.
absl::StatusOr<bool> ParseOverflowLine(const std::string& line,
                                       absl::string_view where,
                                       StdoutParse* parse);
// llm.c's own log file (-o): "s:100 trl:3.2164 lr:0.0006 norm:0.31".
absl::StatusOr<bool> ParseLlmcLogLine(const std::string& line,
                                      absl::string_view where,
                                      StdoutParse* parse);
// Megatron-LM, Megatron-DeepSpeed, GPT-NeoX "iteration 100/ 500000 | key:
// value | ..." and llm.c stdout "step 1/19073 | train loss 3.21 | ...".
absl::StatusOr<bool> ParseIterationLine(const std::string& line,
                                        absl::string_view where,
                                        StdoutParse* parse);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_IMPORT_IMPORT_TEXT_H_
