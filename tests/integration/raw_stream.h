// A Report stream driven with the generated stub, for the integration
// tests that send what a well-behaved client never would.
#ifndef TRAINWATCH_TESTS_INTEGRATION_RAW_STREAM_H_
#define TRAINWATCH_TESTS_INTEGRATION_RAW_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch::testing {

// A reader thread takes the acks as they come (as the real client does), so keepalive pings are
// answered while the test thread waits.
class RawStream {
 public:
  explicit RawStream(const std::string& address)
      : stub_(v1::TrainingHealth::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
    ctx_.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(180));
    stream_ = stub_->Report(&ctx_);
    reader_ = std::thread([this] {
      v1::ReportResponse resp;
      while (stream_->Read(&resp)) {
        std::lock_guard<std::mutex> lock(mu_);
        acked_ = std::max(acked_, resp.acked_seq());
        rejected_ += resp.rejected_records();
        if (reason_.empty()) reason_ = resp.rejected_reason();
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      cv_.notify_all();
    });
  }
  ~RawStream() {
    if (reader_.joinable()) {
      ctx_.TryCancel();
      reader_.join();
    }
  }

  bool Send(const v1::ReportRequest& r) { return stream_->Write(r); }

  // True once an ack covers `seq`; false if the stream ended first.
  bool WaitAck(uint64_t seq) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(60),
                 [&] { return acked_ >= seq || ended_; });
    return acked_ >= seq;
  }

  uint64_t acked() {
    std::lock_guard<std::mutex> lock(mu_);
    return acked_;
  }

  // Records the responses said were refused alone, and the first reason.
  uint64_t rejected() {
    std::lock_guard<std::mutex> lock(mu_);
    return rejected_;
  }
  std::string reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }

  // Closes our side, takes the remaining acks and returns the final status.
  grpc::Status Finish() {
    stream_->WritesDone();
    reader_.join();
    return stream_->Finish();
  }

 private:
  std::unique_ptr<v1::TrainingHealth::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::ReportRequest, v1::ReportResponse>>
      stream_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t acked_ = 0;
  bool ended_ = false;
  uint64_t rejected_ = 0;
  std::string reason_;
};

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_INTEGRATION_RAW_STREAM_H_
