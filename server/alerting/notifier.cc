#include "alerting/notifier.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "alerting/alertmanager_payload.h"
#include "alerting/webhook_payload.h"
#include "trainwatch/v1/alert_names.h"

namespace trainwatch {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
// A final flush at Stop() gives up after this long, so a slow receiver
// cannot hold a draining server.
constexpr int64_t kFinalFlushNanos = 5'000'000'000;

int64_t Nanos(std::chrono::nanoseconds d) { return d.count(); }

}  // namespace

// One receiver: a queue guarded by mu_, drained by Pump() on the receiver's
// own thread (or the caller's, without threads). Subclasses decide what is
// held and what is due; the base posts, counts, and backs off. At most one
// post is in flight per channel.
class Notifier::Channel {
 public:
  Channel(std::string receiver, std::string url, const NotifierOptions& options,
          const Clock* clock, HttpSender* sender, const NotifierFamilies& f)
      : receiver_(std::move(receiver)),
        url_(std::move(url)),
        options_(options),
        clock_(clock),
        sender_(sender),
        sent_(f.sent->Add({{"receiver", receiver_}})),
        failures_(f.failures->Add({{"receiver", receiver_}})),
        dropped_(f.dropped->Add({{"receiver", receiver_}})) {}
  virtual ~Channel() = default;

  void Start() { thread_ = std::thread([this] { Loop(); }); }

  void Add(const v1::Alert& notice, bool restored) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || !AddLocked(notice, restored)) {
        dropped_.Increment();
        return;
      }
      work_ = true;
    }
    cv_.Signal();
  }

  // Posts what is due until nothing is, or a post fails. Returns when there
  // is work next (kNever: none until something is added). `final`: ignore
  // the backoff, stop at the first failure (Stop()).
  int64_t Pump(bool final) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return PumpLocked(final);
  }

  // Ends the thread after one last pump (without threads: only refuses
  // what comes later).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    cv_.Signal();
    if (thread_.joinable()) thread_.join();
  }

 protected:
  // Pump()'s work; unlocks while a post is on the network.
  int64_t PumpLocked(bool final) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t final_deadline = clock_->NowUnixNanos() + kFinalFlushNanos;
    for (;;) {
      const int64_t now = clock_->NowUnixNanos();
      if (!final && now < retry_at_) return retry_at_;
      if (final && now > final_deadline) return kNever;
      std::string body;
      size_t count = TakeLocked(now, &body);
      if (count == 0) return NextDueLocked();
      mu_.Unlock();
      absl::StatusOr<int> status = sender_->Post(url_, body);
      mu_.Lock();
      if (status.ok() && *status >= 200 && *status < 300) {
        sent_.Increment(static_cast<double>(count));
        SentLocked(now);
        if (backoff_ > 0) {
          fprintf(stderr, "trainwatch-server: %s notifications delivered again\n",
                  receiver_.c_str());
        }
        backoff_ = 0;
        retry_at_ = 0;
        continue;
      }
      failures_.Increment();
      // A 4xx other than timeout/rate limit means the receiver refuses this
      // body: sending it again cannot help.
      const bool permanent = status.ok() && *status >= 400 && *status < 500 &&
                             *status != 408 && *status != 429;
      if (size_t given_up = FailedLocked(now, permanent); given_up > 0) {
        dropped_.Increment(static_cast<double>(given_up));
      }
      if (backoff_ == 0) {  // log once per failure streak, not per retry
        fprintf(stderr, "trainwatch-server: %s notification to %s failed (%s); "
                        "retrying with backoff\n",
                receiver_.c_str(), url_.c_str(),
                status.ok() ? absl::StrCat("HTTP ", *status).c_str()
                            : std::string(status.status().message()).c_str());
      }
      backoff_ = backoff_ == 0
                     ? Nanos(options_.initial_backoff)
                     : std::min(2 * backoff_, Nanos(options_.max_backoff));
      retry_at_ = clock_->NowUnixNanos() + backoff_;
      if (final) return kNever;
    }
  }

  // Takes in what was added; false when it is dropped (no room).
  virtual bool AddLocked(const v1::Alert& notice, bool restored)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Builds the next body due at `now`; returns the notifications in it (0:
  // nothing due). What it took stays in flight until Sent/Failed.
  virtual size_t TakeLocked(int64_t now, std::string* body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual void SentLocked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Returns the notifications given up.
  virtual size_t FailedLocked(int64_t now, bool permanent)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // When something held becomes due, nothing being due now.
  virtual int64_t NextDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;

  const NotifierOptions& options() const { return options_; }
  absl::Mutex mu_;

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    pthread_setname_np(pthread_self(), "tw-notifier");
    mu_.Lock();
    while (!stopping_) {
      work_ = false;
      mu_.Unlock();
      const int64_t next = Pump(/*final=*/false);
      mu_.Lock();
      if (stopping_ || work_) continue;
      // On the injected clock (a fake one wakes it when moved past).
      const int64_t wait = std::min<int64_t>(next - clock_->NowUnixNanos(),
                                             60'000'000'000);
      const int64_t deadline = clock_->MonotonicNanos() + wait;
      while (wait > 0 && !stopping_ && !work_) {
        if (clock_->WaitUntil(cv_, mu_, deadline)) break;  // timed out
      }
    }
    mu_.Unlock();
    Pump(/*final=*/true);
  }

  const std::string receiver_;
  const std::string url_;
  const NotifierOptions& options_;
  const Clock* const clock_;
  HttpSender* const sender_;
  prometheus::Counter& sent_;
  prometheus::Counter& failures_;
  prometheus::Counter& dropped_;
  absl::CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool work_ ABSL_GUARDED_BY(mu_) = false;  // added since the last pump
  int64_t backoff_ ABSL_GUARDED_BY(mu_) = 0;   // nanos; 0 = not failing
  int64_t retry_at_ ABSL_GUARDED_BY(mu_) = 0;  // unix nanos
  std::thread thread_;
};

namespace {

// Alertmanager: holds every firing alert (re-sent each resend interval) and
// every resolve not yet delivered, keyed by episode (run, alertname, fire
// time), so a new episode of an alert does not overwrite the undelivered
// resolve of the last one.
class AlertmanagerChannel final : public Notifier::Channel {
 public:
  using Channel::Channel;

 private:
  using Key = std::tuple<std::string, std::string, int64_t>;
  struct Entry {
    v1::Alert notice;
    bool pending = true;    // changed since last delivered
    int64_t last_sent = 0;  // unix nanos
    uint64_t version = 0;   // bumped by every change, to spot one mid-post
  };

  bool AddLocked(const v1::Alert& n, bool restored) override {
    Key key{n.run(), n.alertname(), n.started_unix_nanos()};
    auto it = alerts_.find(key);
    if (it == alerts_.end()) {
      if (alerts_.size() >= options().queue_capacity) return false;
      it = alerts_.emplace(std::move(key), Entry{}).first;
    }
    Entry& e = it->second;
    e.notice = n;
    e.pending = true;
    ++e.version;
    return true;
  }

  size_t TakeLocked(int64_t now, std::string* body) override {
    const int64_t resend = Nanos(options().resend_interval);
    std::vector<const v1::Alert*> batch;
    in_flight_.clear();
    for (const auto& [key, e] : alerts_) {
      if (batch.size() >= options().alertmanager_batch) break;
      if (e.pending || (v1::Firing(e.notice) && now - e.last_sent >= resend)) {
        batch.push_back(&e.notice);
        in_flight_.emplace_back(key, e.version);
      }
    }
    if (batch.empty()) return 0;
    *body = AlertmanagerPayload(batch, now, options().resend_interval);
    return batch.size();
  }

  void SentLocked(int64_t now) override {
    for (const auto& [key, version] : in_flight_) {
      auto it = alerts_.find(key);
      if (it == alerts_.end()) continue;
      it->second.last_sent = now;
      // Changed while posting (e.g. resolved): still to be sent.
      if (it->second.version != version) continue;
      it->second.pending = false;
      if (!v1::Firing(it->second.notice)) alerts_.erase(it);
    }
    in_flight_.clear();
  }

  size_t FailedLocked(int64_t now, bool permanent) override {
    size_t n = in_flight_.size();
    // Transient: everything stays due and goes again after the backoff.
    // Refused: a firing alert waits for its next resend, a resolve is lost.
    if (permanent) SentLocked(now);
    in_flight_.clear();
    return permanent ? n : 0;
  }

  int64_t NextDueLocked() override {
    int64_t next = kNever;
    for (const auto& [key, e] : alerts_) {
      if (e.pending) return 0;
      if (v1::Firing(e.notice)) {
        next = std::min(next, e.last_sent + Nanos(options().resend_interval));
      }
    }
    return next;
  }

  std::map<Key, Entry> alerts_;
  std::vector<std::pair<Key, uint64_t>> in_flight_;
};

// Webhook: a FIFO of transitions, one POST each, in order.
class WebhookChannel final : public Notifier::Channel {
 public:
  using Channel::Channel;

 private:
  struct Item {
    v1::Alert notice;
    int attempts = 0;
  };

  bool AddLocked(const v1::Alert& n, bool restored) override {
    if (restored) return true;  // its fire was delivered before the restart
    if (queue_.size() >= options().queue_capacity) return false;
    queue_.push_back(Item{n});
    return true;
  }

  size_t TakeLocked(int64_t now, std::string* body) override {
    if (queue_.empty()) return 0;
    *body = WebhookPayload(queue_.front().notice);
    return 1;
  }

  // Only this channel's pump pops, so the front is still the one posted.
  void SentLocked(int64_t now) override { queue_.pop_front(); }

  size_t FailedLocked(int64_t now, bool permanent) override {
    if (permanent || ++queue_.front().attempts >= options().webhook_max_attempts) {
      queue_.pop_front();
      return 1;
    }
    return 0;
  }

  int64_t NextDueLocked() override { return queue_.empty() ? kNever : 0; }

  std::deque<Item> queue_;
};

}  // namespace

absl::Status Notifier::CheckUrl(const std::string& flag, const std::string& url) {
  for (const char* scheme : {"http://", "https://"}) {
    if (absl::StartsWith(url, scheme) && url.size() > strlen(scheme) &&
        url[strlen(scheme)] != '/') {
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      flag, " wants an http:// or https:// URL with a host, got \"", url, "\""));
}

absl::StatusOr<std::unique_ptr<Notifier>> Notifier::Create(
    NotifierOptions options, const Clock* clock,
    std::unique_ptr<HttpSender> sender, NotifierFamilies families) {
  if (options.alertmanager_url.empty() && options.webhook_url.empty()) {
    return absl::InvalidArgumentError("a notifier needs a receiver URL");
  }
  if (families.sent == nullptr || families.failures == nullptr ||
      families.dropped == nullptr || sender == nullptr) {
    return absl::InvalidArgumentError("a notifier needs a sender and counters");
  }
  if (options.resend_interval.count() <= 0) {
    return absl::InvalidArgumentError("the resend interval must be positive");
  }
  std::unique_ptr<Notifier> n(new Notifier());
  n->options_ = std::move(options);
  n->sender_ = std::move(sender);
  if (!n->options_.alertmanager_url.empty()) {
    if (absl::Status s = CheckUrl("--alertmanager-url", n->options_.alertmanager_url);
        !s.ok()) {
      return s;
    }
    n->channels_.push_back(std::make_unique<AlertmanagerChannel>(
        "alertmanager", AlertmanagerAlertsUrl(n->options_.alertmanager_url),
        n->options_, clock, n->sender_.get(), families));
  }
  if (!n->options_.webhook_url.empty()) {
    if (absl::Status s = CheckUrl("--webhook-url", n->options_.webhook_url); !s.ok()) {
      return s;
    }
    n->channels_.push_back(std::make_unique<WebhookChannel>(
        "webhook", n->options_.webhook_url, n->options_, clock,
        n->sender_.get(), families));
  }
  if (n->options_.start_threads) {
    for (auto& c : n->channels_) c->Start();
  }
  return n;
}

Notifier::~Notifier() { Stop(); }

void Notifier::Notify(const v1::Alert& notice) {
  for (auto& c : channels_) c->Add(notice, /*restored=*/false);
}

void Notifier::Restore(const v1::Alert& firing) {
  for (auto& c : channels_) c->Add(firing, /*restored=*/true);
}

void Notifier::Pump() {
  for (auto& c : channels_) c->Pump(/*final=*/false);
}

void Notifier::Stop() {
  for (auto& c : channels_) c->Stop();
}

}  // namespace trainwatch
