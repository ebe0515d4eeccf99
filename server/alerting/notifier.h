// Delivers alert fires and resolves to Alertmanager (v2 API) and to a plain
// JSON webhook, off the ingest path.
//
// The engine's transition listener calls Notify(), which only takes a short
// lock and enqueues; each configured receiver has its own thread that posts,
// so a slow or dead receiver delays neither ingest nor the other receiver.
// What a receiver cannot keep is dropped and counted:
// trainwatch_notifications_dropped_total{receiver}.
//
// Alertmanager (as Prometheus feeds it): every firing alert is re-sent each
// resend interval with endsAt = now + 4 x the interval, so Alertmanager
// resolves it by itself if trainwatch dies; a resolve is sent with endsAt =
// the resolve time. A failed post is retried with exponential backoff until
// it gets through. At most `queue_capacity` alerts (firing, or waiting to be
// sent) are held.
//
// Webhook: one POST per transition, in order, at most `queue_capacity`
// waiting; each is retried with exponential backoff, `webhook_max_attempts`
// times in all, then given up (counted as dropped).
//
// Thread-safe: every public method may be called from any thread.
#ifndef TRAINWATCH_SERVER_ALERTING_NOTIFIER_H_
#define TRAINWATCH_SERVER_ALERTING_NOTIFIER_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "alerting/http_sender.h"
#include "common/clock.h"
#include "trainwatch/v1/trainwatch.pb.h"

namespace trainwatch {

struct NotifierOptions {
  // Alertmanager base URL (posts go to URL/api/v2/alerts); "" = none.
  std::string alertmanager_url;
  // Plain JSON webhook URL; "" = none.
  std::string webhook_url;
  // How often a firing alert is re-sent to Alertmanager.
  std::chrono::milliseconds resend_interval{60'000};
  // Per receiver: alerts (Alertmanager) or transitions (webhook) held.
  size_t queue_capacity = 10'000;
  // Retry backoff: the first wait, doubled after each failure up to the max.
  std::chrono::milliseconds initial_backoff{500};
  std::chrono::milliseconds max_backoff{30'000};
  // POSTs of one webhook notification, at most, before it is given up.
  int webhook_max_attempts = 6;
  // Alerts per Alertmanager POST, at most (Prometheus uses 64).
  size_t alertmanager_batch = 64;
  // false: no threads; nothing is sent until Pump() (deterministic tests).
  bool start_threads = true;
};

// The counter families the notifier reports on (label `receiver`:
// alertmanager | webhook). Registered by the metrics part; borrowed.
struct NotifierFamilies {
  prometheus::Family<prometheus::Counter>* sent = nullptr;
  prometheus::Family<prometheus::Counter>* failures = nullptr;
  prometheus::Family<prometheus::Counter>* dropped = nullptr;
};

class Notifier {
 public:
  // INVALID_ARGUMENT when neither URL is set, or one is not http(s)://.
  static absl::StatusOr<std::unique_ptr<Notifier>> Create(
      NotifierOptions options, const Clock* clock,
      std::unique_ptr<HttpSender> sender, NotifierFamilies families);
  ~Notifier();  // Stop()
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  // A fire or resolve. Never waits on the network.
  // `alert` carries the run's labels (run_labels).
  void Notify(const v1::Alert& alert);

  // An alert that was firing before a restart (the engine restored it):
  // Alertmanager gets it again, right away and then every resend interval;
  // the webhook, which saw the fire already, gets nothing.
  void Restore(const v1::Alert& firing);

  // Sends what is due now on the calling thread (start_threads = false).
  void Pump();

  // Makes one last attempt at what is waiting (no backoff waits), then ends
  // the threads. Later Notify calls are dropped.
  void Stop();

  // Validates a receiver URL: http:// or https:// and a host.
  static absl::Status CheckUrl(const std::string& flag, const std::string& url);

  class Channel;  // one receiver (notifier.cc)

 private:
  Notifier() = default;
  // Declared before the channels, which borrow them.
  NotifierOptions options_;
  std::unique_ptr<HttpSender> sender_;
  std::vector<std::unique_ptr<Channel>> channels_;
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_ALERTING_NOTIFIER_H_
