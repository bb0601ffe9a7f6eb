#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace flashnext::server {

namespace {

bool valid_name(const std::string& n) {
  if (n.empty() || std::isdigit(static_cast<unsigned char>(n[0]))) return false;
  return std::all_of(n.begin(), n.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':'; });
}

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string label_text(const Labels& labels) {
  if (labels.empty()) return {};
  std::string out = "{";
  bool first = true;
  for (auto& [k, v] : labels) {
    if (!first) out += ",";
    out += k + "=\"" + escape_label(v) + "\"";
    first = false;
  }
  return out + "}";
}

}  // namespace

std::string prometheus_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", int64_t(v));
  return fmt::format("{}", v);
}

void Counter::inc(double v, const Labels& labels) {
  if (!(v >= 0)) return;
  std::lock_guard lock(mutex_);
  values_[labels] += v;
}

double Counter::value(const Labels& labels) const {
  std::lock_guard lock(mutex_);
  auto it = values_.find(labels);
  return it == values_.end() ? 0 : it->second;
}

void Gauge::set(double v, const Labels& labels) {
  std::lock_guard lock(mutex_);
  values_[labels] = v;
}

double Gauge::value(const Labels& labels) const {
  std::lock_guard lock(mutex_);
  auto it = values_.find(labels);
  return it == values_.end() ? 0 : it->second;
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  FN_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()) &&
               std::adjacent_find(bounds_.begin(), bounds_.end()) == bounds_.end(),
           "histogram bucket bounds must be strictly ascending");
}

void Histogram::observe(double v) {
  std::lock_guard lock(mutex_);
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());  // first bound >= v
  ++counts_[i];
  sum_ += v;
  ++count_;
}

uint64_t Histogram::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

double Histogram::sum() const {
  std::lock_guard lock(mutex_);
  return sum_;
}

uint64_t Histogram::bucket(size_t i) const {
  std::lock_guard lock(mutex_);
  uint64_t c = 0;
  for (size_t k = 0; k <= i && k < counts_.size(); ++k) c += counts_[k];
  return c;
}

MetricsRegistry::Entry& MetricsRegistry::add(const std::string& name, const std::string& help, Kind kind) {
  FN_CHECK(valid_name(name), "metrics: invalid metric name \"{}\"", name);
  std::lock_guard lock(mutex_);
  for (auto& e : entries_) FN_CHECK(e->name != name, "metrics: metric \"{}\" registered twice", name);
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->help = help;
  e->kind = kind;
  entries_.push_back(std::move(e));
  return *entries_.back();
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help) {
  Entry& e = add(name, help, Kind::Counter);
  e.counter = std::make_unique<Counter>();
  return *e.counter;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help) {
  Entry& e = add(name, help, Kind::Gauge);
  e.gauge = std::make_unique<Gauge>();
  return *e.gauge;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help, std::vector<double> bounds) {
  auto h = std::make_unique<Histogram>(std::move(bounds));
  Entry& e = add(name, help, Kind::Histogram);
  e.histogram = std::move(h);
  return *e.histogram;
}

std::string MetricsRegistry::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& e : entries_) {
    static const char* kTypes[] = {"counter", "gauge", "histogram"};
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", e->name, escape_help(e->help), e->name, kTypes[int(e->kind)]);
    if (e->kind == Kind::Histogram) {
      const Histogram& h = *e->histogram;
      std::lock_guard hl(h.mutex_);
      uint64_t cum = 0;
      for (size_t i = 0; i < h.bounds_.size(); ++i) {
        cum += h.counts_[i];
        out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", e->name, prometheus_number(h.bounds_[i]), cum);
      }
      out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", e->name, h.count_);
      out += fmt::format("{}_sum {}\n{}_count {}\n", e->name, prometheus_number(h.sum_), e->name, h.count_);
      continue;
    }
    const std::map<Labels, double>* values;
    std::mutex* m = e->kind == Kind::Counter ? &e->counter->mutex_ : &e->gauge->mutex_;
    std::lock_guard vl(*m);
    values = e->kind == Kind::Counter ? &e->counter->values_ : &e->gauge->values_;
    if (values->empty()) out += fmt::format("{} 0\n", e->name);
    for (auto& [labels, v] : *values)
      out += fmt::format("{}{} {}\n", e->name, label_text(labels), prometheus_number(v));
  }
  return out;
}

}  // namespace flashnext::server
