#include "import/import_files.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "import/import_tensorboard.h"

namespace trainwatch::cli {

std::optional<ImportFormat> ParseImportFormat(absl::string_view name) {
  for (ImportFormat f : {ImportFormat::kAuto, ImportFormat::kTensorBoard,
                         ImportFormat::kHf, ImportFormat::kMegatron,
                         ImportFormat::kCsv}) {
    if (ImportFormatName(f) == name) return f;
  }
  return std::nullopt;
}

absl::string_view ImportFormatName(ImportFormat format) {
  switch (format) {
    case ImportFormat::kAuto:
      return "auto";
    case ImportFormat::kTensorBoard:
      return "tensorboard";
    case ImportFormat::kHf:
      return "hf";
    case ImportFormat::kMegatron:
      return "megatron";
    case ImportFormat::kCsv:
      return "csv";
  }
  return "?";
}

ImportFormat DetectFormat(absl::string_view path, absl::string_view bytes) {
  if (LooksLikeTfRecord(bytes) || absl::StrContains(path, "tfevents")) {
    return ImportFormat::kTensorBoard;
  }
  const absl::string_view text = absl::StripLeadingAsciiWhitespace(bytes);
  if (absl::StartsWith(text, "{")) return ImportFormat::kHf;
  const absl::string_view first = text.substr(0, text.find('\n'));
  if (absl::StrContains(first, ',')) {
    for (absl::string_view cell : absl::StrSplit(first, ',')) {
      std::string c = absl::AsciiStrToLower(absl::StripAsciiWhitespace(cell));
      absl::StripAsciiWhitespace(&c);
      if (c.size() >= 2 && c.front() == '"' && c.back() == '"') {
        c = c.substr(1, c.size() - 2);
      }
      if (c == "step" || c == "iteration" || c == "global_step" ||
          c == "_step" || c == "trainer/global_step" || c == "iter") {
        return ImportFormat::kCsv;
      }
    }
  }
  return ImportFormat::kMegatron;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  return out.str();
}

absl::Status ImportFile(const std::string& path, ImportFormat format,
                        const TagMap& map, LoggedRun* run) {
  if (format == ImportFormat::kTensorBoard) {
    return ImportTensorBoard(path, map, run);
  }
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (!bytes.ok()) return bytes.status();
  if (format == ImportFormat::kAuto) format = DetectFormat(path, *bytes);
  switch (format) {
    case ImportFormat::kTensorBoard:
      return ImportTensorBoard(path, map, run);
    case ImportFormat::kHf:
      return ParseHfTrainerState(*bytes, path, map, run);
    case ImportFormat::kCsv:
      return ParseCsvLog(*bytes, path, map, run);
    default:
      return ParseTrainingStdout(*bytes, path, map, run);
  }
}

}  // namespace trainwatch::cli
