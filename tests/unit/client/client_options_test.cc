#include "trainwatch/client.h"

#include <cmath>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trainwatch {
namespace {

using ::testing::HasSubstr;

void ExpectInvalid(const ClientOptions& options, const std::string& why) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_FALSE(client.ok()) << why;
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << why;
}

TEST(ClientOptions, CreateRejectsBadOptions) {
  ClientOptions good;
  good.run_id = "ok.run_1:a/b-c";
  // Nothing is recorded, so the client never needs the server.
  good.address = "127.0.0.1:1";

  ClientOptions options = good;
  options.run_id = "";
  ExpectInvalid(options, "empty run_id");
  options.run_id = "has space";
  ExpectInvalid(options, "space in run_id");
  options.run_id = "semi;colon";
  ExpectInvalid(options, "; in run_id");
  options.run_id = std::string(129, 'a');
  ExpectInvalid(options, "129-char run_id");

  options = good;
  options.rank = 2;
  options.world_size = 2;
  ExpectInvalid(options, "rank == world_size");
  options.world_size = 0;
  options.rank = 0;
  ExpectInvalid(options, "world_size 0");

  options = good;
  options.max_norm = -1.0;
  ExpectInvalid(options, "negative max_norm");
  options.max_norm = std::nan("");
  ExpectInvalid(options, "NaN max_norm");
  options.max_norm = HUGE_VAL;
  ExpectInvalid(options, "infinite max_norm");

  options = good;
  options.capacity = 0;
  ExpectInvalid(options, "capacity 0");
  options = good;
  options.max_batch_records = 0;
  ExpectInvalid(options, "max_batch_records 0");

  options = good;
  options.run_id = "bad run";
  EXPECT_THAT(std::string(Client::Create(options).status().message()),
              HasSubstr("run_id"));

  options = good;
  options.run_id = std::string(128, 'a');
  options.rank = 3;
  options.world_size = 4;
  EXPECT_TRUE(Client::Create(options).ok());
}

TEST(ClientOptions, ParsePrecision) {
  EXPECT_EQ(ParsePrecision("fp16"), Precision::kFp16);
  EXPECT_EQ(ParsePrecision("FP16"), Precision::kFp16);
  EXPECT_EQ(ParsePrecision("float16"), Precision::kFp16);
  EXPECT_EQ(ParsePrecision("bf16"), Precision::kBf16);
  EXPECT_EQ(ParsePrecision("BFloat16"), Precision::kBf16);
  EXPECT_EQ(ParsePrecision("fp32"), Precision::kFp32);
  EXPECT_EQ(ParsePrecision("float32"), Precision::kFp32);
  EXPECT_EQ(ParsePrecision("fp8"), std::nullopt);
  EXPECT_EQ(ParsePrecision(""), std::nullopt);
}

}  // namespace
}  // namespace trainwatch
