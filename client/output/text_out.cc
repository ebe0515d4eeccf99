#include "output/text_out.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainwatch::cli {

Table::Table(std::vector<std::string> header) {
  rows_.push_back(std::move(header));
}

void Table::AddRow(std::vector<std::string> row) {
  rows_.push_back(std::move(row));
}

std::string Table::Render() const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (row.size() > width.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  }
  std::string out;
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size(); ++i) {
      out += row[i];
      if (i + 1 < row.size()) out.append(width[i] - row[i].size() + 2, ' ');
    }
    out += '\n';
  }
  return out;
}

std::string Num(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Inf" : "-Inf";
  return absl::StrFormat("%.6g", value);
}

std::string OptNum(bool present, double value) {
  return present ? Num(value) : "-";
}

std::string BaselineRefText(const v1::BaselineRef& ref) {
  return absl::StrCat(ref.run(), "@", ref.attempt());
}

std::string BaselineRefs(const google::protobuf::RepeatedPtrField<v1::BaselineRef>& refs) {
  std::string out;
  for (const v1::BaselineRef& r : refs) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", BaselineRefText(r));
  }
  return out;
}

std::string BatchIds(const google::protobuf::RepeatedField<int64_t>& ids,
                     int limit) {
  if (ids.empty()) return "-";
  std::string out;
  for (int i = 0; i < ids.size() && i < limit; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ",", ids[i]);
  }
  if (ids.size() > limit) {
    absl::StrAppend(&out, " ... (", ids.size() - limit, " more)");
  }
  return out;
}

namespace {

// Fixed widths, as the steps table streams and cannot measure its cells.
std::string StepLine(absl::string_view rank, absl::string_view attempt,
                     absl::string_view step, absl::string_view grad_norm,
                     absl::string_view clipped, absl::string_view clip_coef,
                     absl::string_view loss_scale, absl::string_view skipped,
                     absl::string_view loss, absl::string_view lr) {
  return absl::StrFormat(
      "%-4s  %-7s  %10s  %12s  %-7s  %9s  %10s  %-7s  %12s  %10s\n", rank,
      attempt, step, grad_norm, clipped, clip_coef, loss_scale, skipped, loss,
      lr);
}

}  // namespace

std::string StepTableHeader() {
  return StepLine("RANK", "ATTEMPT", "STEP", "GRAD_NORM", "CLIPPED",
                  "CLIP_COEF", "LOSS_SCALE", "SKIPPED", "LOSS", "LR");
}

std::string StepTableRow(const v1::StepRecord& r, uint32_t rank,
                         uint32_t attempt) {
  const std::string clipped =
      r.has_clipped() ? (r.clipped() ? "yes" : "no") : "-";
  return StepLine(
      absl::StrCat(rank), absl::StrCat(attempt), absl::StrCat(r.step()),
      Num(r.grad_norm()), clipped, OptNum(r.has_clip_coef(), r.clip_coef()),
      OptNum(r.has_loss_scale(), r.loss_scale()), r.skipped() ? "yes" : "no",
      OptNum(r.has_loss(), r.loss()), OptNum(r.has_lr(), r.lr()));
}

}  // namespace trainwatch::cli
