#include "common/validate.h"

#include <string_view>

#include "absl/strings/str_cat.h"

namespace trainwatch {
namespace {

constexpr size_t kMaxRunIdChars = 128;

bool IsRunIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
         c == '/' || c == '-';
}

}  // namespace

size_t Utf8Chars(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // not a continuation byte
  return n;
}

absl::Status ValidateRunId(std::string_view run_id) {
  if (run_id.empty()) {
    return absl::InvalidArgumentError("run_id is empty");
  }
  if (run_id.size() > kMaxRunIdChars) {
    return absl::InvalidArgumentError(absl::StrCat(
        "run_id is ", run_id.size(), " characters; at most ", kMaxRunIdChars));
  }
  for (size_t i = 0; i < run_id.size(); ++i) {
    if (!IsRunIdChar(run_id[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "run_id has character 0x",
          absl::Hex(static_cast<unsigned char>(run_id[i]), absl::kZeroPad2),
          " at position ", i, "; allowed: [A-Za-z0-9._:/-]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace trainwatch
