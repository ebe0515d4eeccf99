// RunFamily: a family of per-run series that trainwatch owns instead of a
// prometheus::Family. prometheus-cpp 1.0's Family::Remove finds the series by
// a linear scan of the family, so removing a run's ~30 series with 10,000
// runs cost minutes (every RunMetrics destructor at SIGTERM, and each run
// forgotten at retention). Here Add and Remove are a hash lookup, and Collect
// yields what a prometheus::Family with the same series would.
#ifndef TRAINWATCH_SERVER_METRICS_RUN_FAMILY_H_
#define TRAINWATCH_SERVER_METRICS_RUN_FAMILY_H_

#include <prometheus/client_metric.h>
#include <prometheus/detail/utils.h>
#include <prometheus/labels.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace trainwatch {

// A run's counter, written by one thread at a time (the engine shard that
// owns the run) and read by scrapes. An update is a relaxed load and store,
// not prometheus::Counter's compare-and-swap loop: the engine makes several
// per step record. A negative increment is ignored, as prometheus-cpp does.
class RunCounter {
 public:
  static constexpr prometheus::MetricType kType =
      prometheus::MetricType::Counter;
  void Increment(double v = 1.0) {
    if (!(v >= 0.0)) return;
    value_.store(value_.load(std::memory_order_relaxed) + v,
                 std::memory_order_relaxed);
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }
  prometheus::ClientMetric Collect() const {
    prometheus::ClientMetric m;
    m.counter.value = Value();
    return m;
  }

 private:
  std::atomic<double> value_{0.0};
};

// A run's gauge; same threading as RunCounter.
class RunGauge {
 public:
  static constexpr prometheus::MetricType kType = prometheus::MetricType::Gauge;
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }
  prometheus::ClientMetric Collect() const {
    prometheus::ClientMetric m;
    m.gauge.value = Value();
    return m;
  }

 private:
  std::atomic<double> value_{0.0};
};

// One series: its labels and its value (a RunCounter or RunGauge).
template <typename T>
struct RunSeries {
  explicit RunSeries(prometheus::Labels l) : labels(std::move(l)) {}
  const prometheus::Labels labels;
  T metric;
  size_t refs =
      0;  // Add()s not yet matched by a Remove(); guarded by the family
};

// Thread-safe. Add and Remove lock the family; updating a series does not.
template <typename T>
class RunFamily {
 public:
  RunFamily(std::string name, std::string help)
      : name_(std::move(name)), help_(std::move(help)) {}
  RunFamily(const RunFamily&) = delete;
  RunFamily& operator=(const RunFamily&) = delete;
  ~RunFamily() {
    for (RunSeries<T>* s : series_) delete s;
  }

  // The series with these labels, created at 0 if absent. Adding the same
  // labels twice gives the same series; it stays until removed as many times.
  RunSeries<T>* Add(prometheus::Labels labels) {
    absl::MutexLock lock(&mu_);
    auto it = series_.find(labels);
    if (it == series_.end()) {
      it = series_.insert(new RunSeries<T>(std::move(labels))).first;
    }
    ++(*it)->refs;
    return *it;
  }

  // Undoes one Add of `s` (a hash lookup, not a scan).
  void Remove(RunSeries<T>* s) {
    absl::MutexLock lock(&mu_);
    if (--s->refs > 0) return;
    series_.erase(s);
    delete s;
  }

  // Appends this family to `out`, as prometheus::Family::Collect would: no
  // family while it has no series.
  void Collect(std::vector<prometheus::MetricFamily>* out) const {
    absl::MutexLock lock(&mu_);
    if (series_.empty()) return;
    prometheus::MetricFamily& f = out->emplace_back();
    f.name = name_;
    f.help = help_;
    f.type = T::kType;
    f.metric.reserve(series_.size());
    for (const RunSeries<T>* s : series_) {
      prometheus::ClientMetric& m = f.metric.emplace_back(s->metric.Collect());
      m.label.reserve(s->labels.size());
      for (const auto& [name, value] : s->labels) {
        m.label.push_back(prometheus::ClientMetric::Label{name, value});
      }
    }
  }

  size_t size() const {
    absl::MutexLock lock(&mu_);
    return series_.size();
  }

 private:
  // Hashes and compares series by their labels; looks up by labels too.
  struct Hash {
    using is_transparent = void;
    size_t operator()(const prometheus::Labels& l) const {
      return prometheus::detail::LabelHasher()(l);
    }
    size_t operator()(const RunSeries<T>* s) const {
      return (*this)(s->labels);
    }
  };
  struct Eq {
    using is_transparent = void;
    static const prometheus::Labels& L(const prometheus::Labels& l) {
      return l;
    }
    static const prometheus::Labels& L(const RunSeries<T>* s) {
      return s->labels;
    }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return L(a) == L(b);
    }
  };

  const std::string name_;
  const std::string help_;
  mutable absl::Mutex mu_;
  absl::flat_hash_set<RunSeries<T>*, Hash, Eq> series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainwatch

#endif  // TRAINWATCH_SERVER_METRICS_RUN_FAMILY_H_
