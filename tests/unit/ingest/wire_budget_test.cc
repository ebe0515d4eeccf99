// The ReportRequest's cost judged on its bytes (server/ingest/wire_budget.h):
// what the parser would make of the wire, counted before the parse.
#include "ingest/wire_budget.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;

ValidationLimits SmallLimits() {
  ValidationLimits limits;
  limits.max_batch_records = 8;
  limits.max_message_entries = 64;
  return limits;
}

std::string BatchOf(int records, uint64_t seq) {
  v1::ReportRequest request;
  request.mutable_batch()->set_seq(seq);
  for (int i = 0; i < records; ++i) request.mutable_batch()->add_records()->set_step(i + 1);
  return request.SerializeAsString();
}

TEST(WireBudget, ABatchWithinItsRecordsPasses) {
  const WireBudget budget(SmallLimits());
  EXPECT_TRUE(budget.Check(BatchOf(8, 3)).ok());
}

TEST(WireBudget, ABatchOverItsRecordsIsRefusedWithItsSeq) {
  const WireBudget budget(SmallLimits());
  const absl::Status s = budget.Check(BatchOf(9, 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("batch seq 3 has 9 records; at most 8"));
}

// The parser merges a batch sent as several fields into one: two halves of
// 6 records each parse as one batch of 12 (found by wire_budget_fuzzer).
TEST(WireBudget, ABatchSentInPiecesIsCountedWhole) {
  const WireBudget budget(SmallLimits());
  const std::string wire = BatchOf(6, 3) + BatchOf(6, 4);
  v1::ReportRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  ASSERT_EQ(parsed.batch().records_size(), 12);
  const absl::Status s = budget.Check(wire);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("batch seq 4 has 12 records; at most 8"));
}

TEST(WireBudget, TooManyObjectsAreRefusedBeforeTheParse) {
  const WireBudget budget(SmallLimits());
  v1::ReportRequest request;
  auto* record = request.mutable_batch()->add_records();
  for (int i = 0; i < 65; ++i) (*record->mutable_layer_stats())["l" + std::to_string(i)];
  const absl::Status s = budget.Check(request.SerializeAsString());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("refused before parsing"));
}

}  // namespace
}  // namespace trainwatch
