#include "cli/flags.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainwatch::cli {
namespace {

constexpr absl::string_view kUsagePayload = "trainwatchctl/usage";

const FlagSpec* FindSpec(std::span<const FlagSpec> specs,
                         absl::string_view name) {
  auto it = std::find_if(specs.begin(), specs.end(),
                         [&](const FlagSpec& s) { return s.name == name; });
  return it == specs.end() ? nullptr : &*it;
}

}  // namespace

absl::Status UsageError(absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kUsagePayload, absl::Cord());
  return status;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

absl::StatusOr<ParsedArgs> ParsedArgs::Parse(std::span<const std::string> args,
                                             std::span<const FlagSpec> specs) {
  ParsedArgs parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") {
      parsed.positional_.insert(parsed.positional_.end(), args.begin() + i + 1,
                                args.end());
      break;
    }
    // "-" alone is a positional argument (stdin), as for most tools.
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      parsed.positional_.emplace_back(arg);
      continue;
    }
    absl::string_view body = arg.substr(absl::StartsWith(arg, "--") ? 2 : 1);
    std::optional<absl::string_view> inline_value;
    if (size_t eq = body.find('='); eq != absl::string_view::npos) {
      inline_value = body.substr(eq + 1);
      body = body.substr(0, eq);
    }
    const FlagSpec* spec = FindSpec(specs, body);
    if (spec == nullptr) return UsageError(absl::StrCat("unknown flag ", arg));
    std::string value;
    if (!spec->takes_value) {
      if (inline_value.has_value()) {
        return UsageError(absl::StrCat("--", body, " takes no value"));
      }
    } else if (inline_value.has_value()) {
      value = std::string(*inline_value);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return UsageError(absl::StrCat("--", body, " needs a value"));
    }
    parsed.every_.emplace_back(std::string(body), value);
    parsed.values_[std::string(body)] = std::move(value);
  }
  return parsed;
}

std::vector<std::string> ParsedArgs::GetAll(absl::string_view name) const {
  std::vector<std::string> all;
  for (const auto& [flag, value] : every_) {
    if (flag == name) all.push_back(value);
  }
  return all;
}

bool ParsedArgs::Has(absl::string_view name) const {
  return values_.find(name) != values_.end();
}

std::optional<std::string> ParsedArgs::Get(absl::string_view name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

namespace {

template <typename T, typename ParseFn>
absl::StatusOr<std::optional<T>> GetTyped(const ParsedArgs& args,
                                          absl::string_view name,
                                          absl::string_view what,
                                          ParseFn parse) {
  std::optional<std::string> text = args.Get(name);
  if (!text.has_value()) return std::nullopt;
  T value;
  if (!parse(*text, &value)) {
    return UsageError(
        absl::StrCat("--", name, " wants ", what, ", got \"", *text, "\""));
  }
  return value;
}

}  // namespace

absl::StatusOr<std::optional<uint32_t>> ParsedArgs::GetUint32(
    absl::string_view name) const {
  return GetTyped<uint32_t>(
      *this, name, "a non-negative integer",
      [](absl::string_view s, uint32_t* v) { return absl::SimpleAtoi(s, v); });
}

absl::StatusOr<std::optional<uint64_t>> ParsedArgs::GetUint64(
    absl::string_view name) const {
  return GetTyped<uint64_t>(
      *this, name, "a non-negative integer",
      [](absl::string_view s, uint64_t* v) { return absl::SimpleAtoi(s, v); });
}

absl::StatusOr<std::optional<double>> ParsedArgs::GetDouble(
    absl::string_view name) const {
  return GetTyped<double>(
      *this, name, "a number",
      [](absl::string_view s, double* v) { return absl::SimpleAtod(s, v); });
}

}  // namespace trainwatch::cli
