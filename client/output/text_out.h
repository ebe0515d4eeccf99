// Human-readable output of trainwatchctl: aligned tables and short numbers.
#ifndef TRAINWATCH_CLIENT_OUTPUT_TEXT_OUT_H_
#define TRAINWATCH_CLIENT_OUTPUT_TEXT_OUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/repeated_field.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch::cli {

// A table whose columns are as wide as their widest cell, for outputs small
// enough to hold (runs, alerts). Steps are printed with fixed widths instead,
// as they stream.
//
// Thread-compatible.
class Table {
 public:
  explicit Table(std::vector<std::string> header);
  void AddRow(std::vector<std::string> row);
  // Columns separated by two spaces; the last column is not padded.
  std::string Render() const;

 private:
  std::vector<std::vector<std::string>> rows_;  // rows_[0] is the header
};

// Six significant digits; "NaN", "Inf", "-Inf" for non-finite values.
std::string Num(double value);

// "-" for an absent optional value.
std::string OptNum(bool present, double value);

// A reference run as `baseline set --ref` takes it: "run@attempt"; and a
// list of them, ", "-separated ("" for none).
std::string BaselineRefText(const v1::BaselineRef& ref);
std::string BaselineRefs(const google::protobuf::RepeatedPtrField<v1::BaselineRef>& refs);

// At most `limit` ids, comma-separated, then "... (N more)".
std::string BatchIds(const google::protobuf::RepeatedField<int64_t>& ids,
                     int limit = 16);

// The header and one line of the `steps` table.
std::string StepTableHeader();
std::string StepTableRow(const v1::StepRecord& record, uint32_t rank,
                         uint32_t attempt);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLIENT_OUTPUT_TEXT_OUT_H_
