// trainwatch-loadgen --ranks N: one run of N ranks, one Report stream a rank
// (as N trainer processes would open) or, with --ranks-per-stream K, one a
// K ranks (a host stream, as a host's local rank 0 opens), every rank's record every step at
// --step-seconds (1 by default), one rank slowed by --slow-factor from
// --slow-from on. The streams are gRPC callback reactors spread over a few
// channels, so 16,384 ranks need neither 16,384 threads nor connections.
// At the end it reads the run's alerts back and says whether RankStraggler
// named the slowed rank and its host, and how many steps after the slowdown;
// with --server-pid, the server's peak RSS (VmHWM) too.
#include "ranks.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace trainwatch::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

// One rank's stream: writes one at a time in order, reads acks.
class RankStream final
    : public grpc::ClientBidiReactor<v1::ReportRequest, v1::ReportResponse> {
 public:
  RankStream(v1::TrainingHealth::Stub* stub, v1::ReportRequest start) {
    stub->async()->Report(&ctx_, this);
    StartRead(&response_);
    Send(std::move(start));
    StartCall();
  }

  void Send(v1::ReportRequest request) {
    std::lock_guard lock(mu_);
    if (writing_) {
      queue_.push_back(std::move(request));
      return;
    }
    writing_ = true;
    current_ = std::move(request);
    StartWrite(&current_);
  }

  // After the last Send: half-closes once everything is written.
  void Close() {
    std::lock_guard lock(mu_);
    closing_ = true;
    if (!writing_ && !closed_) {
      closed_ = true;
      StartWritesDone();
    }
  }

  // Waits until the server acked `seq` (or the stream ended); false on timeout.
  bool AwaitAck(uint64_t seq, Clock::time_point deadline) {
    std::unique_lock lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return acked_ >= seq || done_; }) &&
           acked_ >= seq;
  }

  void AwaitDone() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }

  grpc::Status status() const {
    std::lock_guard lock(mu_);
    return status_;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    if (!ok) {
      writing_ = false;
      queue_.clear();
      return;
    }
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      StartWrite(&current_);
      return;
    }
    writing_ = false;
    if (closing_ && !closed_) {
      closed_ = true;
      StartWritesDone();
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      std::lock_guard lock(mu_);
      acked_ = std::max(acked_, response_.acked_seq());
    }
    cv_.notify_all();
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      std::lock_guard lock(mu_);
      status_ = status;
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  grpc::ClientContext ctx_;
  v1::ReportResponse response_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  v1::ReportRequest current_;
  std::deque<v1::ReportRequest> queue_;
  bool writing_ = false, closing_ = false, closed_ = false, done_ = false;
  uint64_t acked_ = 0;
  grpc::Status status_;
};

std::string Host(uint32_t rank, uint32_t per_host) {
  return "node-" + std::to_string(rank / per_host);
}

// Peak resident set of a process, in KiB (0 when unreadable).
long PeakRssKib(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return 0;
}

// CPU seconds (user + system) a process has used so far (0 when unreadable).
double CpuSeconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; fields >> f; ++i) {  // field 3 is the state
    if (i == 14) utime = std::stoull(f);
    if (i == 15) {
      stime = std::stoull(f);
      break;
    }
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

std::shared_ptr<grpc::Channel> NewChannel(const std::string& server) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args);
  channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return channel;
}

int RunRanks(const RanksOptions& o) {
  const std::string run = o.run.empty() ? "ranks-" + std::to_string(o.ranks) : o.run;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::TrainingHealth::Stub>> stubs;
  for (int c = 0; c < o.channels; ++c) {
    channels.push_back(NewChannel(o.server));
    stubs.push_back(v1::TrainingHealth::NewStub(channels.back()));
  }
  const Clock::time_point t0 = Clock::now();
  // Stream i carries ranks [i * per, (i + 1) * per).
  const uint32_t per = std::max(1u, o.ranks_per_stream);
  const uint32_t n_streams = (o.ranks + per - 1) / per;
  std::vector<std::unique_ptr<RankStream>> streams;
  streams.reserve(n_streams);
  for (uint32_t i = 0; i < n_streams; ++i) {
    const uint32_t rank = i * per;
    v1::ReportRequest start;
    v1::RunStart* s = start.mutable_start();
    s->set_run_id(run);
    s->set_rank(rank);
    s->set_world_size(o.ranks);
    s->set_precision(v1::BF16);
    s->set_max_norm(1.0);
    s->set_host(Host(rank, o.ranks_per_host));
    if (per > 1) {
      for (uint32_t r = rank; r < std::min(o.ranks, rank + per); ++r) s->add_local_ranks(r);
    }
    (*s->mutable_labels())["source"] = "loadgen";
    streams.push_back(std::make_unique<RankStream>(
        stubs[i % stubs.size()].get(), std::move(start)));
  }
  std::printf("opened %u streams (%u ranks each) over %d channels in %.1f s\n", n_streams,
              per, o.channels,
              std::chrono::duration<double>(Clock::now() - t0).count());

  const double cpu_before = o.server_pid > 0 ? CpuSeconds(o.server_pid) : 0;
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> norm(std::log(0.5), 0.2);
  std::normal_distribution<double> jitter(0.0, 0.02);
  const Clock::time_point begin = Clock::now();
  const auto period = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(o.step_seconds));
  for (uint64_t step = 0; step < o.steps; ++step) {
    std::this_thread::sleep_until(begin + period * step);
    const double g = norm(rng);
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    for (uint32_t i = 0; i < n_streams; ++i) {
      v1::ReportRequest req;
      v1::StepBatch* batch = req.mutable_batch();
      batch->set_seq(step + 1);
      for (uint32_t rank = i * per; rank < std::min(o.ranks, (i + 1) * per); ++rank) {
        v1::StepRecord* r = batch->add_records();
        r->set_step(step);
        if (per > 1) r->set_rank(rank);
        // The global norm, as every rank of a data-parallel run reports it,
        // and this rank's share of its squares.
        r->set_grad_norm(g);
        r->set_clipped(g > 1.0);
        r->set_clip_coef(std::min(1.0, 1.0 / (g + 1e-6)));
        r->set_shard_sq_sum(g * g / o.ranks);
        r->set_loss(2.5);
        r->set_lr(3e-4);
        r->set_time_unix_nanos(now);
        double t = 1.0 + jitter(rng);
        if (rank == o.slow_rank && step >= o.slow_from) t *= o.slow_factor;
        r->set_step_time_s(t);
        r->set_data_wait_s(0.01);
      }
      streams[i]->Send(std::move(req));
    }
    if ((step + 1) % 10 == 0) {
      std::printf("step %llu sent to %u ranks%s\n",
                  static_cast<unsigned long long>(step + 1), o.ranks,
                  o.server_pid > 0
                      ? (", server peak RSS " +
                         std::to_string(PeakRssKib(o.server_pid) / 1024) + " MiB")
                            .c_str()
                      : "");
      std::fflush(stdout);
    }
  }
  // Every record acknowledged (committed), then the streams end.
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(120);
  uint32_t unacked = 0;
  for (auto& s : streams) unacked += !s->AwaitAck(o.steps, deadline);
  for (auto& s : streams) s->Close();
  uint32_t failed = 0;
  for (auto& s : streams) {
    s->AwaitDone();
    failed += !s->status().ok();
  }
  const long rss_kib = o.server_pid > 0 ? PeakRssKib(o.server_pid) : 0;
  const double records = static_cast<double>(o.ranks) * static_cast<double>(o.steps);
  const double cpu_us_per_record =
      o.server_pid > 0 ? (CpuSeconds(o.server_pid) - cpu_before) * 1e6 / records : 0;

  // What the server made of it.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListAlertsRequest request;
  request.set_run_id(run);
  v1::ListAlertsResponse alerts;
  const grpc::Status listed = stubs[0]->ListAlerts(&ctx, request, &alerts);
  const v1::Alert* straggler = nullptr;
  for (const v1::Alert& a : alerts.alerts()) {
    if (a.alertname() == "RankStraggler" &&
        (straggler == nullptr || a.started_step() < straggler->started_step())) {
      straggler = &a;
    }
  }
  std::printf("run %s: %u ranks x %llu steps, %u streams unacked, %u failed\n",
              run.c_str(), o.ranks, static_cast<unsigned long long>(o.steps),
              unacked, failed);
  if (!listed.ok()) {
    std::printf("ListAlerts failed: %s\n", listed.error_message().c_str());
  } else if (straggler == nullptr) {
    std::printf("RankStraggler: not raised\n");
  } else {
    std::printf("RankStraggler: rank %u on %s at step %llu (%lld steps after the "
                "slowdown at %llu): %s\n",
                straggler->rank(), straggler->host().c_str(),
                static_cast<unsigned long long>(straggler->started_step()),
                static_cast<long long>(straggler->started_step()) -
                    static_cast<long long>(o.slow_from),
                static_cast<unsigned long long>(o.slow_from),
                straggler->description().c_str());
  }
  if (rss_kib > 0) {
    std::printf("server peak RSS: %.1f MiB (%.1f KiB a rank); server CPU %.2f us a rank-record\n",
                rss_kib / 1024.0, rss_kib / static_cast<double>(o.ranks),
                cpu_us_per_record);
  }
  const bool named = straggler != nullptr && straggler->rank() == o.slow_rank &&
                     straggler->host() == Host(o.slow_rank, o.ranks_per_host);
  if (o.json) {
    std::printf(
        "{\"ranks\":%u,\"steps\":%llu,\"unacked\":%u,\"failed\":%u,"
        "\"straggler_named\":%s,\"straggler_rank\":%d,\"straggler_host\":\"%s\","
        "\"delay_steps\":%lld,\"server_peak_rss_mib\":%.1f,"
        "\"server_cpu_us_per_record\":%.2f}\n",
        o.ranks, static_cast<unsigned long long>(o.steps), unacked, failed,
        named ? "true" : "false",
        straggler != nullptr ? static_cast<int>(straggler->rank()) : -1,
        straggler != nullptr ? straggler->host().c_str() : "",
        straggler != nullptr ? static_cast<long long>(straggler->started_step()) -
                                   static_cast<long long>(o.slow_from)
                             : -1LL,
        rss_kib / 1024.0, cpu_us_per_record);
  }
  const bool want_straggler = o.slow_factor > 1.0 && o.slow_rank < o.ranks;
  return unacked == 0 && failed == 0 && listed.ok() && (!want_straggler || named) ? 0 : 1;
}

}  // namespace trainwatch::loadgen
