// The notifiers without a network: payload shapes, Alertmanager re-sends on a
// fake clock, retries with backoff, and a dead receiver that costs drops,
// never a blocked caller.
#include "alerting/notifier.h"

#include <prometheus/registry.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "alerting/alertmanager_payload.h"
#include "alerting/time_format.h"
#include "alerting/webhook_payload.h"
#include "gtest/gtest.h"

namespace trainwatch {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int64_t kStart = 1'700'000'000'123'456'789;  // 2023-11-14T22:13:20.123Z

v1::Alert Spike(bool firing = true) {
  v1::Alert n;
  n.set_alertname("GradNormSpike");
  n.set_run("llama/run-42");
  n.set_severity(v1::SEVERITY_WARNING);
  n.set_state(firing ? v1::ALERT_STATE_FIRING : v1::ALERT_STATE_RESOLVED);
  (*n.mutable_run_labels())["model"] = "llama-7b";
  (*n.mutable_run_labels())["owner"] = "ana";
  (*n.mutable_run_labels())["severity"] = "page-me";
  n.set_summary("gradient norm spike");
  n.set_description("norm 12 is 34x the EMA");
  n.set_likely_cause("a bad batch");
  n.set_fix("restart 100 steps earlier");
  n.set_started_step(3000);
  n.set_peak_value(12.0);
  n.add_batch_ids(21000);
  n.add_batch_ids(21001);
  n.set_started_unix_nanos(kStart);
  if (!firing) {
    n.set_resolved_step(3100);
    n.set_resolved_unix_nanos(kStart + 90'000'000'000);
  }
  return n;
}

// Records every post; answers with a settable status; can hold posts (a
// receiver that accepted the connection and never answers).
class FakeSender final : public HttpSender {
 public:
  struct Request {
    std::string url;
    json body;
  };

  absl::StatusOr<int> Post(const std::string& url, const std::string& body) override {
    std::unique_lock<std::mutex> lock(mu_);
    posts_.push_back({url, json::parse(body)});
    cv_.notify_all();
    cv_.wait(lock, [this] { return !blocked_; });
    return status_;
  }

  void set_status(absl::StatusOr<int> s) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(s);
  }
  void set_blocked(bool b) {
    std::lock_guard<std::mutex> lock(mu_);
    blocked_ = b;
    cv_.notify_all();
  }
  std::vector<Request> posts() {
    std::lock_guard<std::mutex> lock(mu_);
    return posts_;
  }
  bool WaitForPosts(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, seconds(10), [&] { return posts_.size() >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Request> posts_;
  absl::StatusOr<int> status_ = 200;
  bool blocked_ = false;
};

TEST(FormatRfc3339, UtcWithMilliseconds) {
  EXPECT_EQ(FormatRfc3339(kStart), "2023-11-14T22:13:20.123Z");
  EXPECT_EQ(FormatRfc3339(0), "1970-01-01T00:00:00.000Z");
}

TEST(AlertmanagerPayload, LabelsAnnotationsAndTimes) {
  v1::Alert firing = Spike();
  json body = json::parse(AlertmanagerPayload({&firing}, kStart + 1'000'000'000,
                                              seconds(60)));
  ASSERT_TRUE(body.is_array());
  ASSERT_EQ(body.size(), 1u);
  const json& a = body[0];
  // The reserved labels win over a run label of the same name.
  EXPECT_EQ(a["labels"], (json{{"alertname", "GradNormSpike"},
                               {"run", "llama/run-42"},
                               {"severity", "warning"},
                               {"model", "llama-7b"},
                               {"owner", "ana"}}));
  EXPECT_EQ(a["annotations"], (json{{"summary", "gradient norm spike"},
                                    {"description", "norm 12 is 34x the EMA"},
                                    {"likely_cause", "a bad batch"},
                                    {"fix", "restart 100 steps earlier"},
                                    {"started_step", "3000"},
                                    {"batch_ids", "21000,21001"}}));
  EXPECT_EQ(a["startsAt"], "2023-11-14T22:13:20.123Z");
  // Firing: now + 4 x 60 s, so Alertmanager resolves it if we die.
  EXPECT_EQ(a["endsAt"], "2023-11-14T22:17:21.123Z");

  v1::Alert resolved = Spike(/*firing=*/false);
  body = json::parse(AlertmanagerPayload({&resolved}, kStart + 500'000'000'000,
                                         seconds(60)));
  EXPECT_EQ(body[0]["endsAt"], "2023-11-14T22:14:50.123Z");  // the resolve time
}

TEST(AlertmanagerAlertsUrl, AppendsTheV2Path) {
  EXPECT_EQ(AlertmanagerAlertsUrl("http://am:9093"), "http://am:9093/api/v2/alerts");
  EXPECT_EQ(AlertmanagerAlertsUrl("http://am:9093/"), "http://am:9093/api/v2/alerts");
}

TEST(WebhookPayload, FiringAndResolvedShapes) {
  json f = json::parse(WebhookPayload(Spike()));
  EXPECT_EQ(f["status"], "firing");
  EXPECT_EQ(f["alertname"], "GradNormSpike");
  EXPECT_EQ(f["run"], "llama/run-42");
  EXPECT_EQ(f["severity"], "warning");
  EXPECT_EQ(f["labels"]["model"], "llama-7b");
  EXPECT_EQ(f["summary"], "gradient norm spike");
  EXPECT_EQ(f["description"], "norm 12 is 34x the EMA");
  EXPECT_EQ(f["likely_cause"], "a bad batch");
  EXPECT_EQ(f["fix"], "restart 100 steps earlier");
  EXPECT_EQ(f["started_step"], 3000);
  EXPECT_TRUE(f["resolved_step"].is_null());
  EXPECT_EQ(f["peak_value"], 12.0);
  EXPECT_EQ(f["batch_ids"], (json{21000, 21001}));
  EXPECT_EQ(f["started_at"], "2023-11-14T22:13:20.123Z");
  EXPECT_TRUE(f["resolved_at"].is_null());

  json r = json::parse(WebhookPayload(Spike(/*firing=*/false)));
  EXPECT_EQ(r["status"], "resolved");
  EXPECT_EQ(r["resolved_step"], 3100);
  EXPECT_EQ(r["resolved_at"], "2023-11-14T22:14:50.123Z");

  v1::Alert nan = Spike();
  nan.set_peak_value(std::nan(""));
  EXPECT_TRUE(json::parse(WebhookPayload(nan))["peak_value"].is_null());
}

class NotifierTest : public ::testing::Test {
 protected:
  std::unique_ptr<Notifier> Make(NotifierOptions options) {
    auto sender = std::make_unique<FakeSender>();
    sender_ = sender.get();
    auto n = Notifier::Create(std::move(options), &clock_, std::move(sender),
                              NotifierFamilies{.sent = &sent_,
                                               .failures = &failures_,
                                               .dropped = &dropped_});
    EXPECT_TRUE(n.ok()) << n.status();
    return n.ok() ? std::move(*n) : nullptr;
  }
  static NotifierOptions Manual(std::string am, std::string webhook) {
    NotifierOptions o;
    o.alertmanager_url = std::move(am);
    o.webhook_url = std::move(webhook);
    o.start_threads = false;
    return o;
  }
  double Value(prometheus::Family<prometheus::Counter>& f, const char* receiver) {
    return f.Add({{"receiver", receiver}}).Value();
  }

  FakeClock clock_{kStart};
  prometheus::Registry registry_;
  prometheus::Family<prometheus::Counter>& sent_ =
      prometheus::BuildCounter().Name("sent").Register(registry_);
  prometheus::Family<prometheus::Counter>& failures_ =
      prometheus::BuildCounter().Name("failures").Register(registry_);
  prometheus::Family<prometheus::Counter>& dropped_ =
      prometheus::BuildCounter().Name("dropped").Register(registry_);
  FakeSender* sender_ = nullptr;
};

TEST_F(NotifierTest, AlertmanagerResendsWhileFiringAndSendsTheResolve) {
  auto n = Make(Manual("http://am:9093", ""));
  n->Notify(Spike());
  n->Pump();
  ASSERT_EQ(sender_->posts().size(), 1u);
  EXPECT_EQ(sender_->posts()[0].url, "http://am:9093/api/v2/alerts");
  EXPECT_EQ(sender_->posts()[0].body[0]["endsAt"], "2023-11-14T22:17:20.123Z");

  clock_.Advance(seconds(59));
  n->Pump();
  EXPECT_EQ(sender_->posts().size(), 1u) << "re-sent before the interval";
  clock_.Advance(seconds(1));
  n->Pump();
  ASSERT_EQ(sender_->posts().size(), 2u);
  // The re-send pushes endsAt on: now (start + 60 s) + 240 s.
  EXPECT_EQ(sender_->posts()[1].body[0]["endsAt"], "2023-11-14T22:18:20.123Z");
  EXPECT_EQ(sender_->posts()[1].body[0]["startsAt"], "2023-11-14T22:13:20.123Z");

  n->Notify(Spike(/*firing=*/false));
  n->Pump();
  ASSERT_EQ(sender_->posts().size(), 3u);
  EXPECT_EQ(sender_->posts()[2].body[0]["endsAt"], "2023-11-14T22:14:50.123Z");
  clock_.Advance(seconds(600));
  n->Pump();
  EXPECT_EQ(sender_->posts().size(), 3u) << "a resolved alert is not re-sent";
  EXPECT_EQ(Value(sent_, "alertmanager"), 3);
  EXPECT_EQ(Value(failures_, "alertmanager"), 0);
}

TEST_F(NotifierTest, RetriesWithExponentialBackoff) {
  auto n = Make(Manual("http://am:9093", ""));
  sender_->set_status(absl::UnavailableError("connection refused"));
  n->Notify(Spike());
  n->Pump();
  EXPECT_EQ(sender_->posts().size(), 1u);
  // Waits 0.5 s, then 1 s, then 2 s between tries.
  const std::vector<std::pair<milliseconds, size_t>> steps = {
      {milliseconds(499), 1}, {milliseconds(1), 2},    {milliseconds(999), 2},
      {milliseconds(1), 3},   {milliseconds(1999), 3}, {milliseconds(1), 4}};
  for (auto [wait, posts] : steps) {
    clock_.Advance(wait);
    n->Pump();
    EXPECT_EQ(sender_->posts().size(), posts) << "after " << wait.count() << " ms more";
  }
  sender_->set_status(503);  // an answer, but not a success: retried too
  clock_.Advance(seconds(4));
  n->Pump();
  EXPECT_EQ(sender_->posts().size(), 5u);
  sender_->set_status(200);
  clock_.Advance(seconds(8));
  n->Pump();
  ASSERT_EQ(sender_->posts().size(), 6u);
  EXPECT_EQ(sender_->posts()[5].body[0]["labels"]["alertname"], "GradNormSpike");
  EXPECT_EQ(Value(failures_, "alertmanager"), 5);
  EXPECT_EQ(Value(sent_, "alertmanager"), 1);
  // Success resets the backoff: the next failure waits 0.5 s again.
  sender_->set_status(absl::UnavailableError("down"));
  n->Notify(Spike(/*firing=*/false));
  n->Pump();
  clock_.Advance(milliseconds(500));
  n->Pump();
  EXPECT_EQ(sender_->posts().size(), 8u);
}

TEST_F(NotifierTest, WebhookPostsEachTransitionInOrderAndGivesUpAfterItsAttempts) {
  NotifierOptions o = Manual("", "http://hooks:8080/tw");
  o.webhook_max_attempts = 3;
  auto n = Make(o);
  n->Notify(Spike());
  n->Notify(Spike(/*firing=*/false));
  n->Pump();
  ASSERT_EQ(sender_->posts().size(), 2u);
  EXPECT_EQ(sender_->posts()[0].url, "http://hooks:8080/tw");
  EXPECT_EQ(sender_->posts()[0].body["status"], "firing");
  EXPECT_EQ(sender_->posts()[1].body["status"], "resolved");

  sender_->set_status(absl::UnavailableError("refused"));
  n->Notify(Spike());
  for (int i = 0; i < 5; ++i) {
    n->Pump();
    clock_.Advance(seconds(10));
  }
  EXPECT_EQ(sender_->posts().size(), 5u) << "3 attempts, then given up";
  EXPECT_EQ(Value(failures_, "webhook"), 3);
  EXPECT_EQ(Value(dropped_, "webhook"), 1);

  // A 4xx is the receiver refusing this body: no retry.
  sender_->set_status(400);
  n->Notify(Spike());
  n->Pump();
  clock_.Advance(seconds(10));
  n->Pump();
  EXPECT_EQ(sender_->posts().size(), 6u);
  EXPECT_EQ(Value(dropped_, "webhook"), 2);
}

TEST_F(NotifierTest, RestoredAlertsGoToAlertmanagerAtOnceNotToTheWebhook) {
  auto n = Make(Manual("http://am:9093", "http://hooks:8080/tw"));
  n->Restore(Spike());
  n->Pump();
  ASSERT_EQ(sender_->posts().size(), 1u);
  EXPECT_EQ(sender_->posts()[0].url, "http://am:9093/api/v2/alerts");
  clock_.Advance(seconds(60));
  n->Pump();
  EXPECT_EQ(sender_->posts().size(), 2u) << "re-sent like any firing alert";
  // Its resolve reaches both (the webhook saw the fire before the restart).
  n->Notify(Spike(/*firing=*/false));
  n->Pump();
  ASSERT_EQ(sender_->posts().size(), 4u);
  EXPECT_EQ(Value(sent_, "webhook"), 1);
}

TEST_F(NotifierTest, ADeadReceiverCostsDropsAndNeverBlocksNotify) {
  NotifierOptions o;
  o.webhook_url = "http://hooks:8080/tw";
  o.queue_capacity = 3;
  auto n = Make(o);  // with its thread
  sender_->set_blocked(true);
  n->Notify(Spike());
  ASSERT_TRUE(sender_->WaitForPosts(1));  // the thread is stuck in Post
  // These return although the sender is blocked: two fit behind the one in
  // flight, the rest are dropped.
  for (int i = 0; i < 7; ++i) n->Notify(Spike());
  EXPECT_EQ(Value(dropped_, "webhook"), 5);
  EXPECT_EQ(sender_->posts().size(), 1u);
  sender_->set_blocked(false);
  n->Stop();  // delivers what is queued
  EXPECT_EQ(sender_->posts().size(), 3u);
  EXPECT_EQ(Value(sent_, "webhook"), 3);
  n->Notify(Spike());  // after Stop: dropped, not queued
  EXPECT_EQ(Value(dropped_, "webhook"), 6);
}

TEST_F(NotifierTest, AlertmanagerHoldsAtMostItsCapacityOfAlerts) {
  NotifierOptions o = Manual("http://am:9093", "");
  o.queue_capacity = 2;
  auto n = Make(o);
  for (int i = 0; i < 4; ++i) {
    v1::Alert a = Spike();
    a.set_run("run-" + std::to_string(i));
    n->Notify(a);
  }
  n->Notify(Spike());  // a new run: no room either
  EXPECT_EQ(Value(dropped_, "alertmanager"), 3);
  n->Pump();
  ASSERT_EQ(sender_->posts().size(), 1u);
  EXPECT_EQ(sender_->posts()[0].body.size(), 2u) << "both held alerts, one post";
}

TEST(Notifier, RefusesBadUrls) {
  EXPECT_TRUE(Notifier::CheckUrl("--webhook-url", "https://hooks.example/x").ok());
  EXPECT_TRUE(Notifier::CheckUrl("--alertmanager-url", "http://127.0.0.1:9093").ok());
  EXPECT_FALSE(Notifier::CheckUrl("--alertmanager-url", "127.0.0.1:9093").ok());
  EXPECT_FALSE(Notifier::CheckUrl("--webhook-url", "ftp://x/y").ok());
  EXPECT_FALSE(Notifier::CheckUrl("--webhook-url", "http://").ok());
}

}  // namespace
}  // namespace trainwatch
