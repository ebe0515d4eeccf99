// The log formats `trainwatchctl import` reads, and how a file's format is
// recognised (docs/import-and-report.md).
#ifndef TRAINWATCH_CLIENT_IMPORT_IMPORT_FILES_H_
#define TRAINWATCH_CLIENT_IMPORT_IMPORT_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "import/import_log.h"

namespace trainwatch::cli {

enum class ImportFormat { kAuto, kTensorBoard, kHf, kMegatron, kCsv };

// "auto", "tensorboard", "hf", "megatron", "csv".
std::optional<ImportFormat> ParseImportFormat(absl::string_view name);
absl::string_view ImportFormatName(ImportFormat format);

// The format of a file from its first bytes: a TFRecord header, a JSON
// object, a CSV header with a step column, else stdout lines.
ImportFormat DetectFormat(absl::string_view path, absl::string_view bytes);

absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// Reads one file into `run`; `format` kAuto detects it. Errors name the file
// and the line (or record offset).
absl::Status ImportFile(const std::string& path, ImportFormat format,
                        const TagMap& map, LoggedRun* run);

// The parsers, on a file's text; `name` is how errors refer to it.
//
// Hugging Face trainer_state.json: log_history entries with a step; eval
// entries and the final summary entry are ignored.
absl::Status ParseHfTrainerState(absl::string_view text, absl::string_view name,
                                 const TagMap& map, LoggedRun* run);
// Megatron-LM / Megatron-DeepSpeed / GPT-NeoX / llm.c stdout: "iteration N/
// M | key: value | ..." lines and DeepSpeed overflow lines; the rest of the
// output is ignored.
absl::Status ParseTrainingStdout(absl::string_view text,
                                 absl::string_view name, const TagMap& map,
                                 LoggedRun* run);
// CSV with a header row and a step column; other columns by the tag table.
absl::Status ParseCsvLog(absl::string_view text, absl::string_view name,
                         const TagMap& map, LoggedRun* run);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_IMPORT_IMPORT_FILES_H_
