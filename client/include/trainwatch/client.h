// trainwatch C++ client: the hook a training loop calls once per optimizer step.
//
//   auto client = trainwatch::Client::Create(options);   // absl::StatusOr
//   (*client)->Record({.step = s, .grad_norm = norm});   // never blocks
//   (*client)->Close();
//
// Record() puts the step into a bounded lock-free queue and returns; a
// background thread batches records, streams them to the server over one gRPC
// bidi stream, reconnects with backoff, and resends every batch the server has
// not acknowledged (the server acks only what is committed to its store, and
// stores a resent step once). When the queue is full, Record() drops the step
// and counts it in Stats().dropped. A server that refuses the stream (bad
// token, or one that may not write this run) is logged once and reported by
// Refusal(), Flush() and Close(); see Refusal().
//
// Thread-safety: Record(), RecordProto(), RecordEvent() and Stats() may be
// called from any thread concurrently. Flush() and Close() may be called
// from any thread.
#ifndef TRAINWATCH_CLIENT_H_
#define TRAINWATCH_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "trainwatch/v1/step_bound.h"
#include "absl/status/statusor.h"

namespace trainwatch {
namespace v1 {
// The wire's step record (trainwatch/v1/trainwatch.pb.h), which only callers
// of RecordProto() need in full.
class StepRecord;
}  // namespace v1

enum class Precision { kUnspecified = 0, kFp32 = 1, kBf16 = 2, kFp16 = 3 };

// Parses "fp32", "bf16", "fp16" (any case); nullopt otherwise.
std::optional<Precision> ParsePrecision(const std::string& text);

// How a client authenticates to the server and protects the connection
// (docs/security.md). Plaintext and no token by default.
struct ConnectionSecurity {
  // Bearer token, sent as "authorization: Bearer TOKEN" on every call; ""
  // sends none. Printable ASCII without spaces.
  std::string auth_token;
  // TLS with the system's root certificates. Also on when any tls_* file is
  // set.
  bool tls = false;
  // PEM root certificates the server's certificate must chain to ("" = the
  // system's roots).
  std::string tls_ca_file;
  // PEM client certificate (chain) and its key, for a server that requires
  // client certificates (mutual TLS); both or neither.
  std::string tls_cert_file;
  std::string tls_key_file;

  bool tls_on() const {
    return tls || !tls_ca_file.empty() || !tls_cert_file.empty() ||
           !tls_key_file.empty();
  }
};

// How a mixture-of-experts run routes (RunStart.moe, docs/contracts.md):
// the proto's MoeBalancing values.
enum class MoeBalancing {
  kUnspecified = 0, kAuxLoss = 1, kSeqAuxLoss = 2, kGlobalAuxLoss = 3,
  kAuxFreeBias = 4, kNone = 5
};
struct MoeConfig {
  uint32_t num_experts = 0;  // 0: unknown
  uint32_t top_k = 0;
  uint32_t ep_size = 0;      // expert-parallel ranks (experts in contiguous blocks)
  MoeBalancing balancing = MoeBalancing::kUnspecified;
  double aux_loss_coeff = 0.0;
  double z_loss_coeff = 0.0;
  double bias_update_rate = 0.0;
  double capacity_factor = 0.0;  // 0: dropless
};

// A reference run this run is judged against (RunStart.baselines,
// docs/baselines.md): one attempt of a run of the same recipe.
struct BaselineRef {
  std::string run;
  uint32_t attempt = 0;
};

struct ClientOptions {
  // Server address, host:port.
  std::string address = "127.0.0.1:50051";
  // TLS and bearer token; the files are read by Create().
  ConnectionSecurity security;

  // RunStart fields (docs/contracts.md).
  std::string run_id;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t attempt = 0;
  Precision precision = Precision::kUnspecified;
  // Clip threshold; 0 means clipping is not configured.
  double max_norm = 0.0;
  uint64_t warmup_steps = 0;
  // FP16 scaler growth interval; 0 lets the server use 2000.
  uint32_t scaler_growth_interval = 0;
  std::optional<double> adam_eps;
  std::optional<double> adam_beta2;
  std::map<std::string, std::string> labels;
  // A mixture-of-experts run's routing; absent for a dense model.
  std::optional<MoeConfig> moe;
  // The machine this rank runs on (RunStart.host). Empty: this machine's
  // hostname, when measure_locally is on.
  std::string host;
  // The seq of the last directive this lineage applied (docs/closed-loop.md),
  // restored from the trainer's checkpoint: the server sends none at or
  // below it. 0 = none.
  uint64_t last_applied_directive = 0;
  // The runs this one is compared with (BaselineDeviation); empty: its
  // previous attempt, or what `trainwatchctl baseline set` names.
  std::vector<BaselineRef> baselines;
  // A host stream (docs/contracts.md): the ranks whose records this client
  // sends, `rank` among them; each Step then names its rank (Step::rank).
  // Empty: this client sends `rank`'s records only. A host stream's client
  // measures no step_time_s (each rank's is its own process's to measure).
  std::vector<uint32_t> local_ranks;
  // Fill what a live trainer knows about itself: `host` from gethostname()
  // and each step's step_time_s (the time since this client's previous
  // Record(), from the steps' time_unix_nanos) when the step does not give
  // one. Off for a replayed log, whose timing and machine are not this one's.
  bool measure_locally = true;

  // Records held in memory (queued plus sent but unacknowledged) before
  // Record() starts dropping.
  size_t capacity = 100000;
  // Most records in one StepBatch.
  size_t max_batch_records = 1024;
  // A partial batch is sent after this long.
  std::chrono::milliseconds flush_interval{20};
  // Reconnect backoff: doubles from initial to max.
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{2000};
  // A one-shot sender (trainwatchctl replay, import): a RESOURCE_EXHAUSTED
  // (a quota) is a refusal that Flush() and Close() return at once, as
  // UNAUTHENTICATED is. Off (a trainer): keep buffering and retrying with
  // backoff, since runs finish and free the quota, and log the reason at
  // most once a minute.
  bool fail_fast = false;
};

// Steps are stored as signed 64-bit integers: Record() and RecordProto()
// refuse a step above this (a -1 read as unsigned) and count it in
// ClientStats::rejected, so it never reaches a batch. The server's bound is
// the same constant (trainwatch/v1/step_bound.h).
using v1::kMaxStep;

// What a layer is (the proto's LayerKind values): the per-layer rules leave
// out embeddings and the output head, whose rows see a gradient only when
// their token occurs. Unspecified: the server infers it from the name.
enum class LayerKind { kUnspecified = 0, kDense = 1, kEmbedding = 2, kOutput = 3, kNorm = 4, kRouter = 5 };

struct LayerStat {
  double grad_norm = 0.0;
  double grad_rms = 0.0;
  double g_over_sqrt_v_rms = 0.0;
  // RMS of this step's weight update over RMS of the weights; absent when
  // not measured (docs/contracts.md layer_stats).
  std::optional<double> update_rms_ratio;
  LayerKind kind = LayerKind::kUnspecified;
};

// FP8 formats of Fp8Stat (the proto's Fp8Format values).
enum class Fp8Format { kUnspecified = 0, kE4M3 = 1, kE5M2 = 2, kE4M3Fnuz = 3, kE5M2Fnuz = 4 };

// One FP8 tensor's per-tensor scaling state (docs/contracts.md fp8):
// fp8 = cast(x * scale), scale from the amax history.
struct Fp8Stat {
  Fp8Format format = Fp8Format::kUnspecified;
  double amax = 0.0;
  double scale = 0.0;
  uint32_t amax_history_len = 0;
  double margin = 0.0;
  std::optional<double> overflow_fraction;
  std::optional<double> underflow_fraction;
  std::string amax_group;
};

// One MoE layer's routing in a step's global batch (MoeLayerStats of
// docs/contracts.md): routed assignments per expert before any capacity
// drop (num_experts long, or empty with aggregates only), the assignments
// dropped (absent when dropless), the load-balancing loss without its
// coefficient normalised to 1.0 at balance, the router z-loss, the
// aux-loss-free bias (num_experts long or empty), the largest router logit.
struct MoeLayerStat {
  std::string layer;
  std::vector<uint64_t> tokens_per_expert;
  std::optional<uint64_t> dropped;
  std::optional<double> aux_loss;
  std::optional<double> z_loss;
  std::vector<float> expert_bias;
  std::optional<double> router_logit_max;
};

// One optimizer step (StepRecord of docs/contracts.md). Floats may be NaN or Inf.
struct Step {
  uint64_t step = 0;
  double grad_norm = 0.0;                 // pre-clip global norm
  std::optional<bool> clipped;            // derived from max_norm when absent
  std::optional<double> clip_coef;        // derived from max_norm when absent
  std::optional<double> loss_scale;
  bool skipped = false;
  std::optional<double> max_attn_logit;
  std::optional<double> log_z;
  std::optional<double> loss;
  std::optional<double> lr;
  int64_t time_unix_nanos = 0;            // 0: the time Record() is called
  std::vector<int64_t> batch_ids;
  std::optional<double> shard_sq_sum;
  std::map<std::string, LayerStat> layer_stats;
  // FP8 tensor name -> its scaling state (every N steps, FP8 runs only).
  std::map<std::string, Fp8Stat> fp8;
  // MoE routing, one entry a layer (every N steps, MoE runs only).
  std::vector<MoeLayerStat> moe;
  // Wall seconds since this rank's previous optimizer step (measured by the
  // client when absent, see ClientOptions::measure_locally), and the part of
  // it spent waiting for the input pipeline.
  std::optional<double> step_time_s;
  std::optional<double> data_wait_s;
  // Tokens consumed so far, the axis of a comparison with reference runs.
  std::optional<uint64_t> tokens;
  // The rank the step is of, on a host stream (ClientOptions::local_ranks);
  // absent: the client's own rank.
  std::optional<uint32_t> rank;
};

enum class EventKind { kCheckpointSaved = 1, kRunFinished = 2, kRunFailed = 3 };

// A closed-loop directive from the server (docs/closed-loop.md): one action,
// for every rank, just before the optimizer step of apply_at_step.
struct Directive {
  enum class Action { kNone, kCheckpointNow, kSkip, kRollback, kScaleLr, kStop };
  std::string id;              // the idempotency key
  uint64_t seq = 0;            // per run, increasing: checkpoint the last applied
  uint32_t for_attempt = 0;
  uint64_t apply_at_step = 0;
  std::string alert;           // "LossDivergence@1110"
  std::string reason;
  std::string approved_by;
  Action action = Action::kNone;
  std::string checkpoint_tag;            // kCheckpointNow
  std::vector<int64_t> skip_batch_ids;   // kSkip, kRollback
  uint64_t rollback_to_step = 0;         // kRollback
  std::string rollback_checkpoint;       // kRollback
  double lr_scale = 1.0;                 // kRollback; kScaleLr's factor
  bool checkpoint_first = false;         // kStop
};

// A rank's answer to a directive (the proto's DirectiveState values).
enum class DirectiveState { kReceived = 1, kApplied = 2, kRejected = 3 };

struct ClientStats {
  uint64_t recorded = 0;  // steps accepted by Record()
  uint64_t sent = 0;      // steps written to a stream (a resend counts again)
  uint64_t acked = 0;     // steps the server acknowledged as durable
  uint64_t dropped = 0;   // steps dropped because the buffer was full
  // Steps refused alone: by Record() (a step above kMaxStep, or on a host
  // stream one of no rank of local_ranks) or by the
  // server, which stored the rest of their batch (ReportResponse
  // rejected_records). Not counted in acked.
  uint64_t rejected = 0;
  uint64_t reconnects = 0;
};

class Client {
 public:
  // Validates the options (run_id, rank < world_size, max_norm) and starts the
  // background thread. Does not wait for the server: an unreachable server is
  // retried in the background while Record() buffers.
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options);

  ~Client();  // Close() with a short flush.
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Queues one step. Never blocks; returns false when the step was dropped.
  // On a host stream (ClientOptions::local_ranks) the step names its rank,
  // one of them: one without is refused (counted in ClientStats::rejected).
  bool Record(Step step);

  // A host stream's step: one Step per local rank (each naming its rank),
  // queued in order as one stream's records. Never blocks; returns false
  // when any was dropped or refused.
  bool RecordRanks(std::vector<Step> steps);

  // Queues a step that is already a wire record (a step log's or an
  // imported log's, as trainwatchctl replay and import have it), and sends
  // it as Record() sends the same Step: a time of 0 becomes now, step_time_s
  // is measured as ClientOptions::measure_locally says, and clipped and
  // clip_coef are derived from max_norm when absent. Never blocks; returns
  // false when the step was dropped.
  bool RecordProto(v1::StepRecord record);

  // Queues a run event, ordered after the steps recorded before it.
  bool RecordEvent(EventKind kind, uint64_t step, std::string detail = "");

  // Waits until everything recorded so far is acknowledged. DEADLINE_EXCEEDED
  // on timeout.
  absl::Status Flush(std::chrono::milliseconds timeout);

  // Flushes (up to timeout), then stops the stream and the thread. Idempotent.
  absl::Status Close(std::chrono::milliseconds timeout = std::chrono::seconds(10));

  ClientStats Stats() const;

  // Latest recommended_max_norm the server sent, if any.
  std::optional<double> RecommendedMaxNorm() const;

  // Why the server refuses this client's stream (UNAUTHENTICATED,
  // PERMISSION_DENIED, or INVALID_ARGUMENT for the RunStart), as it said;
  // OK when it does not. While refused, the client keeps what it holds,
  // retries every max_backoff, and Record() drops (and counts) once the
  // buffer is full; Flush() and Close() return this status at once instead
  // of waiting for their timeout. Cleared when the server acks again.
  absl::Status Refusal() const;

  // The server's reason for the latest record it refused alone (naming its
  // step and field); OK when none was refused.
  absl::Status LastRejection() const;

  // The closed loop (docs/closed-loop.md). The directives received with
  // apply_at_step <= `step` that this client has not answered, by seq; the
  // training loop calls it before each optimizer step. One whose
  // apply_at_step is below `step` came late: answer it REJECTED "late" (the
  // server reissues it for a later step). Never blocks. The client acks
  // RECEIVED by itself when a directive arrives.
  std::vector<Directive> DueDirectives(uint64_t step);

  // Answers a directive: APPLIED once it is carried out (it is never
  // returned again, whatever the server resends), REJECTED with a `detail`
  // ("late", or why not). Sent in order with the records. False for an id
  // this client has not received or has already answered APPLIED.
  bool AckDirective(const std::string& id, DirectiveState state, std::string detail = "");

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_CLIENT_H_
