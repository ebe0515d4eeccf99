// trainwatch-loadgen: drives a running trainwatch-server with N concurrent raw
// gRPC Report streams (the generated stub, not the Client, so the generator
// is cheap) and measures what the server sustains end to end.
//
//   trainwatch-loadgen --server HOST:PORT --streams N --runs M --batch B
//                      --seconds S [--inflight K] [--metrics URL]
//                      [--alert-probes P] [--rate R] [--run-header] [--json]
//   trainwatch-loadgen --server HOST:PORT --populate-runs M [--records-per-run R]
//                      [--streams N] [--batch B]
//   trainwatch-loadgen --server HOST:PORT --ranks N [--steps S] [--slow-rank K
//                      --slow-factor F] [--step-seconds T] [--server-pid PID]
//
// Stream i reports run i % M as rank i / M (world_size = ceil(N / M)); each
// sends pre-built StepBatches of B records with increasing steps and seq,
// keeping up to K batches unacknowledged (a reader thread per stream reads
// the acks). Reported:
//  - records/s: records acknowledged (committed) during the S seconds;
//  - ack latency p50/p99: from writing a batch to reading the ack covering
//    its seq;
//  - with --metrics, alert latency p50/p99: while the load runs, P probe runs
//    (one stream each) send 200 ordinary steps, then one step with a norm
//    100x the others; the latency is from writing that step to /metrics
//    showing trainwatch_alert_active{alertname="GradNormSpike",run=...} 1
//    (polled as fast as /metrics answers). The probes share this process's
//    gRPC client with the load: at 64 streams its queue can hold a probe's
//    step for hundreds of ms before sending it, so perf_table.sh runs them
//    from a second, light trainwatch-loadgen, as a trainer of its own.
// --rate R caps the offered load at R records/s in all (each stream paces
// its batches to R / N records/s), e.g. for a soak at half the peak.
// --run-header sends x-trainwatch-run: RUN on every stream, as trainwatch's
// clients do, so that the load can go through a fleet's proxy (docs/fleet.md).
// --moe LxE puts an MoE report of L layers x E experts on every record (the
// RunStart says top-8 of E): 1M tokens a global batch, each layer with a
// persistent skew over its experts and each count moving 3% from step to
// step, for what a large MoE's report costs the server (docs/performance.md).
// With --json the last line of stdout is one JSON object.
//
// --ranks N instead streams one run of N ranks, a stream a rank, every rank's
// record every --step-seconds, and checks that RankStraggler names the rank
// slowed by --slow-factor (ranks.cc).
//
// --populate-runs M instead makes M runs active (for memory per run and
// /metrics size): N workers each open one stream per run in turn, send R
// records (default 1,200: a full window after no warmup), wait for the acks
// and close the stream without finishing the run.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ranks.h"
#include "trainwatch/v1/trainwatch.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = trainwatch::v1;
using trainwatch::loadgen::NewChannel;

struct Options {
  std::string server;
  std::string metrics;
  int streams = 16;
  int runs = 16;
  int batch = 1024;
  double seconds = 10;
  int inflight = 8;
  int alert_probes = 20;
  bool json = false;
  double rate = 0;  // records/s over all streams; 0 = as fast as acked
  int populate_runs = 0;
  int records_per_run = 1200;
  bool run_header = false;  // x-trainwatch-run on every stream
  int moe_layers = 0;       // --moe LxE: an MoE report on every record
  int moe_experts = 0;
  trainwatch::loadgen::RanksOptions ranks;  // --ranks N: ranks.cc
};

// The routing metadata of a fleet's proxy, when --run-header asks for it.
void AddRunHeader(const Options& o, const std::string& run,
                  grpc::ClientContext* ctx) {
  if (o.run_header) ctx->AddMetadata("x-trainwatch-run", run);
}

const char kUsage[] =
    "usage: trainwatch-loadgen --server HOST:PORT [--streams N] [--runs M]\n"
    "         [--batch B] [--seconds S] [--inflight K] [--metrics URL]\n"
    "         [--alert-probes P] [--rate R] [--run-header] [--moe LxE] [--json]\n"
    "       trainwatch-loadgen --server HOST:PORT --populate-runs M\n"
    "         [--records-per-run R] [--streams N] [--batch B]\n"
    "       trainwatch-loadgen --server HOST:PORT --ranks N [--steps S]\n"
    "         [--slow-rank K --slow-factor F [--slow-from STEP]]\n"
    "         [--step-seconds T] [--ranks-per-host H] [--ranks-per-stream K]\n"
    "         [--channels C]\n"
    "         [--server-pid PID] [--json]\n";

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", a.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--server") o->server = value();
    else if (a == "--metrics") o->metrics = value();
    else if (a == "--streams") o->streams = atoi(value());
    else if (a == "--runs") o->runs = atoi(value());
    else if (a == "--batch") o->batch = atoi(value());
    else if (a == "--seconds") o->seconds = atof(value());
    else if (a == "--inflight") o->inflight = atoi(value());
    else if (a == "--alert-probes") o->alert_probes = atoi(value());
    else if (a == "--json") o->json = true;
    else if (a == "--run-header") o->run_header = true;
    else if (a == "--moe") {
      if (sscanf(value(), "%dx%d", &o->moe_layers, &o->moe_experts) != 2 ||
          o->moe_layers < 1 || o->moe_experts < 1) {
        fprintf(stderr, "--moe takes LAYERSxEXPERTS, e.g. 48x128\n");
        return false;
      }
    }
    else if (a == "--rate") o->rate = atof(value());
    else if (a == "--populate-runs") o->populate_runs = atoi(value());
    else if (a == "--records-per-run") o->records_per_run = atoi(value());
    else if (a == "--ranks") o->ranks.ranks = static_cast<uint32_t>(atol(value()));
    else if (a == "--steps") o->ranks.steps = strtoull(value(), nullptr, 10);
    else if (a == "--slow-rank") o->ranks.slow_rank = static_cast<uint32_t>(atol(value()));
    else if (a == "--slow-factor") o->ranks.slow_factor = atof(value());
    else if (a == "--slow-from") o->ranks.slow_from = strtoull(value(), nullptr, 10);
    else if (a == "--step-seconds") o->ranks.step_seconds = atof(value());
    else if (a == "--ranks-per-host") o->ranks.ranks_per_host = static_cast<uint32_t>(atol(value()));
    else if (a == "--channels") o->ranks.channels = atoi(value());
    else if (a == "--ranks-per-stream") o->ranks.ranks_per_stream = static_cast<uint32_t>(atol(value()));
    else if (a == "--server-pid") o->ranks.server_pid = atoi(value());
    else if (a == "--help" || a == "-h") { fputs(kUsage, stdout); exit(0); }
    else { fprintf(stderr, "unknown flag %s\n%s", a.c_str(), kUsage); return false; }
  }
  if (o->server.empty() || o->streams < 1 || o->runs < 1 || o->batch < 1 ||
      o->seconds <= 0 || o->inflight < 1 || o->populate_runs < 0 ||
      o->records_per_run < 1) {
    fputs(kUsage, stderr);
    return false;
  }
  o->runs = std::min(o->runs, o->streams);
  o->ranks.server = o->server;
  o->ranks.json = o->json;
  if (o->ranks.ranks > 0 &&
      (o->ranks.steps < 1 || o->ranks.step_seconds < 0 || o->ranks.channels < 1 ||
       o->ranks.ranks_per_host < 1 || o->ranks.ranks_per_stream < 1 ||
       o->ranks.ranks_per_host % o->ranks.ranks_per_stream != 0)) {
    fputs(kUsage, stderr);
    return false;
  }
  return true;
}

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, i == 0 ? 0 : i - 1)];
}


// An MoE report on each record of `batch` (--moe).
void AddMoe(v1::StepBatch* batch, int layers, int experts, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> skew(0.0, 0.25);
  std::normal_distribution<double> noise(0.0, 0.03);
  std::vector<double> share(static_cast<size_t>(layers) * experts);
  for (double& s : share) s = skew(rng);
  const double mean = 1'048'576.0 * 8 / experts;
  for (v1::StepRecord& r : *batch->mutable_records()) {
    for (int l = 0; l < layers; ++l) {
      v1::MoeLayerStats* layer = r.mutable_moe()->add_layers();
      layer->set_layer(std::to_string(l));
      for (int e = 0; e < experts; ++e) {
        layer->add_tokens_per_expert(static_cast<uint64_t>(std::max(
            0.0, std::round(mean * share[static_cast<size_t>(l) * experts + e] *
                            (1 + noise(rng))))));
      }
      layer->set_aux_loss(1.0 + 0.01 * noise(rng));
      layer->set_z_loss(2.0 + 0.01 * noise(rng));
    }
  }
}

// `n` records of an ordinary bf16 run: lognormal norms around 0.5 (max_norm
// 1: ~1% clipped), attention logit, log Z, loss, lr.
void FillBatch(v1::StepBatch* batch, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> norm(std::log(0.5), 0.3);
  std::normal_distribution<double> noise(0.0, 1.0);
  batch->clear_records();
  for (int i = 0; i < n; ++i) {
    v1::StepRecord* r = batch->add_records();
    const double g = norm(rng);
    r->set_grad_norm(g);
    r->set_clipped(g > 1.0);
    r->set_clip_coef(std::min(1.0, 1.0 / (g + 1e-6)));
    r->set_max_attn_logit(30.0 + 0.5 * noise(rng));
    r->set_log_z(2.0 + 0.05 * noise(rng));
    r->set_loss(2.5 + 0.01 * noise(rng));
    r->set_lr(3e-4);
  }
}

int64_t NowUnixNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

v1::ReportRequest Start(const std::string& run, uint32_t rank, uint32_t world,
                        int moe_experts = 0) {
  v1::ReportRequest req;
  v1::RunStart* s = req.mutable_start();
  if (moe_experts > 0) {
    s->mutable_moe()->set_num_experts(static_cast<uint32_t>(moe_experts));
    s->mutable_moe()->set_top_k(8);
  }
  s->set_run_id(run);
  s->set_rank(rank);
  s->set_world_size(world);
  s->set_precision(v1::BF16);
  s->set_max_norm(1.0);
  (*s->mutable_labels())["source"] = "loadgen";
  return req;
}

// One load stream: a writer (the thread running Run()) and a reader thread.
class LoadStream {
 public:
  LoadStream(const Options& o, std::string run, uint32_t rank, uint32_t world,
             uint64_t seed, std::atomic<uint64_t>* acked_records)
      : o_(o), run_(std::move(run)), rank_(rank), world_(world), seed_(seed),
        acked_records_(acked_records),
        sent_at_(static_cast<size_t>(o.inflight) + 1) {}

  void Run(const std::atomic<bool>& stop) {
    auto stub = v1::TrainingHealth::NewStub(NewChannel(o_.server));
    grpc::ClientContext ctx;
    AddRunHeader(o_, run_, &ctx);
    auto rw = stub->Report(&ctx);
    if (!rw->Write(Start(run_, rank_, world_, o_.moe_experts))) {
      Fail(rw->Finish());
      return;
    }
    std::thread reader([&] { ReadAcks(rw.get()); });
    v1::ReportRequest req;
    v1::StepBatch* batch = req.mutable_batch();
    FillBatch(batch, o_.batch, seed_);
    if (o_.moe_layers > 0) AddMoe(batch, o_.moe_layers, o_.moe_experts, seed_);
    uint64_t step = 0;
    uint64_t seq = 0;
    // With --rate: batch k is due at start + k * interval.
    const Clock::time_point paced_from = Clock::now();
    const double interval_s =
        o_.rate > 0 ? o_.batch * o_.streams / o_.rate : 0.0;
    while (!stop.load(std::memory_order_relaxed)) {
      if (interval_s > 0) {
        std::this_thread::sleep_until(
            paced_from + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(interval_s * seq)));
      }
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] {
          return seq - acked_seq_ < static_cast<uint64_t>(o_.inflight) || reader_done_;
        });
        if (reader_done_) break;
      }
      ++seq;
      batch->set_seq(seq);
      const int64_t now = NowUnixNanos();
      for (v1::StepRecord& r : *batch->mutable_records()) {
        r.set_step(step++);
        r.set_time_unix_nanos(now);
      }
      {
        std::lock_guard lock(mu_);
        sent_at_[seq % sent_at_.size()] = Clock::now();
      }
      if (!rw->Write(req)) break;
    }
    // Wait (briefly) for the acks of what was written, then end the stream.
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(10),
                   [&] { return acked_seq_ >= seq || reader_done_; });
    }
    rw->WritesDone();
    reader.join();
    const grpc::Status status = rw->Finish();
    if (!status.ok()) Fail(status);
  }

  std::vector<double> latencies_ms() const {
    std::lock_guard lock(mu_);
    return latencies_ms_;
  }
  bool failed() const {
    std::lock_guard lock(mu_);
    return failed_;
  }

 private:
  void ReadAcks(grpc::ClientReaderWriter<v1::ReportRequest, v1::ReportResponse>* rw) {
    v1::ReportResponse resp;
    while (rw->Read(&resp)) {
      const Clock::time_point now = Clock::now();
      std::lock_guard lock(mu_);
      const uint64_t acked = resp.acked_seq();
      for (uint64_t s = acked_seq_ + 1; s <= acked; ++s) {
        latencies_ms_.push_back(Ms(now - sent_at_[s % sent_at_.size()]));
      }
      if (acked > acked_seq_) {
        acked_records_->fetch_add((acked - acked_seq_) * static_cast<uint64_t>(o_.batch),
                                  std::memory_order_relaxed);
        acked_seq_ = acked;
      }
      cv_.notify_all();
    }
    std::lock_guard lock(mu_);
    reader_done_ = true;
    cv_.notify_all();
  }

  void Fail(const grpc::Status& status) {
    fprintf(stderr, "stream %s rank %u: %d %s\n", run_.c_str(), rank_,
            static_cast<int>(status.error_code()), status.error_message().c_str());
    std::lock_guard lock(mu_);
    failed_ = true;
  }

  const Options& o_;
  const std::string run_;
  const uint32_t rank_;
  const uint32_t world_;
  const uint64_t seed_;
  std::atomic<uint64_t>* acked_records_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t acked_seq_ = 0;
  bool reader_done_ = false;
  bool failed_ = false;
  std::vector<Clock::time_point> sent_at_;  // by seq % size
  std::vector<double> latencies_ms_;
};

// GET over plain HTTP/1.0; the body, or "" on failure.
std::string HttpGet(const std::string& url) {
  const std::string prefix = "http://";
  if (url.rfind(prefix, 0) != 0) return "";
  const std::string rest = url.substr(prefix.size());
  const size_t slash = rest.find('/');
  const std::string hostport = rest.substr(0, slash);
  const std::string path = slash == std::string::npos ? "/" : rest.substr(slash);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) return "";
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(atoi(hostport.c_str() + colon + 1)));
  std::string host = hostport.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + hostport + "\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  std::string resp;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  return body == std::string::npos ? "" : resp.substr(body + 4);
}

// The value of trainwatch_alert_active for (alertname, run); NaN if absent.
double AlertActive(const std::string& text, const std::string& alertname,
                   const std::string& run) {
  const std::string a = "alertname=\"" + alertname + "\"";
  const std::string r = "run=\"" + run + "\"";
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("trainwatch_alert_active{", 0) != 0) continue;
    if (line.find(a) == std::string::npos || line.find(r) == std::string::npos) continue;
    const size_t sp = line.rfind(' ');
    return sp == std::string::npos ? NAN : strtod(line.c_str() + sp + 1, nullptr);
  }
  return NAN;
}

// One alert probe: a fresh run, 200 ordinary steps, then a 100x spike; the
// milliseconds from writing the spike to /metrics showing the alert, or a
// negative value on failure.
double AlertProbe(const Options& o, const std::string& run) {
  auto stub = v1::TrainingHealth::NewStub(NewChannel(o.server));
  grpc::ClientContext ctx;
  AddRunHeader(o, run, &ctx);
  auto rw = stub->Report(&ctx);
  v1::ReportResponse resp;
  v1::ReportRequest req;
  FillBatch(req.mutable_batch(), 200, std::hash<std::string>()(run));
  req.mutable_batch()->set_seq(1);
  uint64_t step = 0;
  const int64_t now = NowUnixNanos();
  for (v1::StepRecord& r : *req.mutable_batch()->mutable_records()) {
    r.set_step(step++);
    r.set_time_unix_nanos(now);
  }
  if (!rw->Write(Start(run, 0, 1)) || !rw->Write(req) || !rw->Read(&resp) ||
      resp.acked_seq() < 1) {
    rw->WritesDone();
    rw->Finish();
    return -1;
  }
  v1::ReportRequest spike;
  spike.mutable_batch()->set_seq(2);
  v1::StepRecord* r = spike.mutable_batch()->add_records();
  r->set_step(step);
  r->set_grad_norm(50.0);  // 100x the median norm of 0.5
  r->set_clipped(true);
  r->set_clip_coef(1.0 / 50.0);
  r->set_time_unix_nanos(NowUnixNanos());
  const Clock::time_point t0 = Clock::now();
  double latency = -1;
  if (rw->Write(spike)) {
    const Clock::time_point deadline = t0 + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      if (AlertActive(HttpGet(o.metrics), "GradNormSpike", run) >= 1.0) {
        latency = Ms(Clock::now() - t0);
        break;
      }
    }
    rw->Read(&resp);
  }
  rw->WritesDone();
  rw->Finish();
  return latency;
}

// One run made active: a stream sends `records` steps of run `run`, waits for
// every ack and ends without RUN_FINISHED. False on any error.
bool PopulateRun(const Options& o, const std::string& run, v1::TrainingHealth::Stub* stub) {
  grpc::ClientContext ctx;
  AddRunHeader(o, run, &ctx);
  auto rw = stub->Report(&ctx);
  bool ok = rw->Write(Start(run, 0, 1));
  v1::ReportRequest req;
  uint64_t seq = 0, step = 0;
  const int64_t now = NowUnixNanos();
  for (int left = o.records_per_run; ok && left > 0;) {
    const int n = std::min(left, o.batch);
    FillBatch(req.mutable_batch(), n, std::hash<std::string>()(run) + seq);
    req.mutable_batch()->set_seq(++seq);
    for (v1::StepRecord& r : *req.mutable_batch()->mutable_records()) {
      r.set_step(step++);
      r.set_time_unix_nanos(now);
    }
    ok = rw->Write(req);
    left -= n;
  }
  rw->WritesDone();
  v1::ReportResponse resp;
  uint64_t acked = 0;
  while (acked < seq && rw->Read(&resp)) acked = resp.acked_seq();
  const grpc::Status status = rw->Finish();
  if (!ok || acked < seq) {
    fprintf(stderr, "populating %s: %d %s\n", run.c_str(),
            static_cast<int>(status.error_code()), status.error_message().c_str());
    return false;
  }
  return true;
}

int Populate(const Options& o, const std::string& prefix) {
  std::atomic<int> next{0}, failed{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < o.streams; ++w) {
    workers.emplace_back([&] {
      auto stub = v1::TrainingHealth::NewStub(NewChannel(o.server));
      for (int i = next++; i < o.populate_runs; i = next++) {
        if (!PopulateRun(o, prefix + "-run" + std::to_string(i), stub.get())) ++failed;
      }
    });
  }
  for (std::thread& t : workers) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  printf("populated %d runs of %d records in %.1f s (%d failed)\n", o.populate_runs,
         o.records_per_run, elapsed, failed.load());
  if (o.json) {
    printf("{\"runs\": %d, \"records_per_run\": %d, \"seconds\": %.3f, "
           "\"errors\": %d}\n",
           o.populate_runs, o.records_per_run, elapsed, failed.load());
  }
  return failed > 0 ? 1 : 0;
}

std::string Fmt(double v) {
  char buf[64];
  snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 2;
  const std::string prefix = "lg" + std::to_string(getpid()) + "-" +
                             std::to_string(NowUnixNanos() % 1'000'000'000);
  if (o.populate_runs > 0) return Populate(o, prefix);
  if (o.ranks.ranks > 0) return trainwatch::loadgen::RunRanks(o.ranks);
  const uint32_t world = static_cast<uint32_t>((o.streams + o.runs - 1) / o.runs);

  std::atomic<uint64_t> acked_records{0};
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<LoadStream>> streams;
  for (int i = 0; i < o.streams; ++i) {
    streams.push_back(std::make_unique<LoadStream>(
        o, prefix + "-run" + std::to_string(i % o.runs),
        static_cast<uint32_t>(i / o.runs), world, static_cast<uint64_t>(i) + 1,
        &acked_records));
  }
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (auto& s : streams) threads.emplace_back([&s, &stop] { s->Run(stop); });

  // Alert probes, under load, after the streams are up.
  std::vector<double> alert_ms;
  int alert_failures = 0;
  std::thread prober;
  if (!o.metrics.empty() && o.alert_probes > 0) {
    prober = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(
          static_cast<int>(std::min(500.0, o.seconds * 250.0))));
      for (int k = 0; k < o.alert_probes; ++k) {
        const double ms = AlertProbe(o, prefix + "-alert" + std::to_string(k));
        if (ms < 0) ++alert_failures;
        else alert_ms.push_back(ms);
      }
    });
  }

  std::this_thread::sleep_until(
      start + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(o.seconds)));
  const uint64_t records = acked_records.load();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  if (prober.joinable()) prober.join();  // the load runs on until the probes end
  stop = true;
  for (std::thread& t : threads) t.join();

  std::vector<double> ack_ms;
  int errors = alert_failures;
  for (auto& s : streams) {
    std::vector<double> l = s->latencies_ms();
    ack_ms.insert(ack_ms.end(), l.begin(), l.end());
    if (s->failed()) ++errors;
  }
  const double rate = static_cast<double>(records) / elapsed;
  printf("streams %d, runs %d, batch %d, inflight %d, %.1f s: %llu records acked, "
         "%.0f records/s\n",
         o.streams, o.runs, o.batch, o.inflight, elapsed,
         static_cast<unsigned long long>(records), rate);
  printf("ack latency: p50 %.2f ms, p99 %.2f ms (%zu batches)\n",
         Percentile(ack_ms, 0.5), Percentile(ack_ms, 0.99), ack_ms.size());
  if (!o.metrics.empty()) {
    printf("alert latency: p50 %.2f ms, p99 %.2f ms, max %.2f ms (%zu probes, %d failed)\n",
           Percentile(alert_ms, 0.5), Percentile(alert_ms, 0.99),
           Percentile(alert_ms, 1.0), alert_ms.size(), alert_failures);
  }
  if (errors > 0) fprintf(stderr, "%d errors\n", errors);
  if (o.json) {
    printf("{\"streams\": %d, \"runs\": %d, \"batch\": %d, \"seconds\": %s, "
           "\"records_acked\": %llu, \"records_per_s\": %s, "
           "\"ack_latency_p50_ms\": %s, \"ack_latency_p99_ms\": %s, "
           "\"alert_latency_p50_ms\": %s, \"alert_latency_p99_ms\": %s, "
           "\"alert_probes\": %zu, \"errors\": %d}\n",
           o.streams, o.runs, o.batch, Fmt(elapsed).c_str(),
           static_cast<unsigned long long>(records), Fmt(rate).c_str(),
           Fmt(Percentile(ack_ms, 0.5)).c_str(), Fmt(Percentile(ack_ms, 0.99)).c_str(),
           alert_ms.empty() ? "null" : Fmt(Percentile(alert_ms, 0.5)).c_str(),
           alert_ms.empty() ? "null" : Fmt(Percentile(alert_ms, 0.99)).c_str(),
           alert_ms.size(), errors);
  }
  return errors > 0 ? 1 : 0;
}
