// Prometheus metrics in the text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/): counters, gauges and histograms, each with optional
// labels, rendered by GET /metrics. A metric can also be rendered under a second name (an alias: vLLM's `vllm:`
// names beside flashnext's own) from the same values, so that nothing is measured twice. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flashnext::server {

/// Label pairs of one series, e.g. {{"finished_reason", "stop"}}. Values are escaped when rendered.
using Labels = std::vector<std::pair<std::string, std::string>>;

class MetricsRegistry;

/// A monotonically increasing value per label set.
class Counter {
 public:
  /// Adds `v` (>= 0; a negative value is ignored, a counter never goes down).
  void inc(double v = 1, const Labels& labels = {});
  double value(const Labels& labels = {}) const;

 private:
  friend class MetricsRegistry;
  mutable std::mutex mutex_;
  std::map<Labels, double> values_;
};

/// A value that goes up and down per label set.
class Gauge {
 public:
  void set(double v, const Labels& labels = {});
  double value(const Labels& labels = {}) const;

 private:
  friend class MetricsRegistry;
  mutable std::mutex mutex_;
  std::map<Labels, double> values_;
};

/// Observations counted into cumulative buckets (upper bounds, ascending; +Inf is implicit), with their sum.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  uint64_t count() const;
  double sum() const;
  /// Cumulative count of observations <= bounds()[i].
  uint64_t bucket(size_t i) const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  friend class MetricsRegistry;
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

/// The Prometheus type of a metric (its # TYPE line).
enum class MetricType { Counter, Gauge, Histogram };

/// How an alias renders the series of the metric it repeats.
struct AliasSpec {
  /// Constant labels put before each series' own (e.g. {{"model_name", "m"}}); histograms get them before `le`.
  Labels labels;
  /// Maps the labels of each source series to those of the alias (nullopt: the series is left out). Series that map
  /// to the same labels are summed. Null: the labels are kept.
  std::function<std::optional<Labels>(const Labels&)> relabel;
  /// Label sets (as `relabel` returns them) rendered with 0 until a source series maps to them, so that every
  /// expected series exists from the start (as prometheus_client renders a counter's pre-declared labels).
  std::vector<Labels> zero_series;
  /// The # TYPE of the alias; default: the source's (a gauge that only grows may be rendered as a counter).
  std::optional<MetricType> type;
};

/// The metrics of one server. Metrics are created once (names must be unique and valid Prometheus names) and
/// live as long as the registry.
class MetricsRegistry {
 public:
  Counter& counter(const std::string& name, const std::string& help);
  /// `type` Counter: a cumulative total that the owner sets from its own count (say the scheduler's statistics),
  /// rendered with # TYPE counter, as its _total name promises.
  Gauge& gauge(const std::string& name, const std::string& help, MetricType type = MetricType::Gauge);
  Histogram& histogram(const std::string& name, const std::string& help, std::vector<double> bounds);

  /// Renders `source` (created by this registry) again as `name`, as `spec` says, from the same values. Names are
  /// checked as for a new metric.
  void alias(const std::string& name, const std::string& help, const Counter& source, AliasSpec spec = {});
  void alias(const std::string& name, const std::string& help, const Gauge& source, AliasSpec spec = {});
  void alias(const std::string& name, const std::string& help, const Histogram& source, AliasSpec spec = {});

  /// All metrics, in creation order, as Prometheus text (# HELP, # TYPE, then one line per series; histograms as
  /// NAME_bucket{le="..."} cumulative, NAME_sum, NAME_count). A counter or gauge with no series yet renders as 0.
  std::string render() const;

 private:
  using Kind = MetricType;
  struct Entry {
    std::string name, help;
    Kind kind;  ///< the # TYPE rendered
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
    // An alias: the metric it renders (one of them) and how.
    const Counter* src_counter = nullptr;
    const Gauge* src_gauge = nullptr;
    const Histogram* src_histogram = nullptr;
    AliasSpec spec;
  };
  Entry& add(const std::string& name, const std::string& help, Kind kind);
  void render_values(const Entry& e, const std::map<Labels, double>& values, std::string& out) const;
  void render_histogram(const Entry& e, const Histogram& h, const Labels& labels, std::string& out) const;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Entry>> entries_;
};

/// `v` in Prometheus float syntax: integers without a fraction, "+Inf", "-Inf", "NaN", else shortest round-trip.
std::string prometheus_number(double v);

}  // namespace flashnext::server
