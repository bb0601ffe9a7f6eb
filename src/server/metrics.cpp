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

Labels concat(const Labels& a, const Labels& b) {
  Labels out = a;
  out.insert(out.end(), b.begin(), b.end());
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

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, MetricType type) {
  FN_CHECK(type != Kind::Histogram, "metrics: gauge \"{}\" cannot be rendered as a histogram", name);
  Entry& e = add(name, help, type);
  e.gauge = std::make_unique<Gauge>();
  return *e.gauge;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help, std::vector<double> bounds) {
  auto h = std::make_unique<Histogram>(std::move(bounds));
  Entry& e = add(name, help, Kind::Histogram);
  e.histogram = std::move(h);
  return *e.histogram;
}

void MetricsRegistry::alias(const std::string& name, const std::string& help, const Counter& source, AliasSpec spec) {
  {
    std::lock_guard lock(mutex_);
    FN_CHECK(std::any_of(entries_.begin(), entries_.end(), [&](auto& e) { return e->counter.get() == &source; }),
             "metrics: alias \"{}\" of a counter of another registry", name);
  }
  Entry& e = add(name, help, spec.type.value_or(Kind::Counter));
  e.src_counter = &source;
  e.spec = std::move(spec);
}

void MetricsRegistry::alias(const std::string& name, const std::string& help, const Gauge& source, AliasSpec spec) {
  Kind kind = Kind::Gauge;  // the source's # TYPE (a gauge may be rendered as a counter), unless spec says otherwise
  {
    std::lock_guard lock(mutex_);
    const auto it = std::find_if(entries_.begin(), entries_.end(), [&](auto& e) { return e->gauge.get() == &source; });
    FN_CHECK(it != entries_.end(), "metrics: alias \"{}\" of a gauge of another registry", name);
    kind = (*it)->kind;
  }
  Entry& e = add(name, help, spec.type.value_or(kind));
  e.src_gauge = &source;
  e.spec = std::move(spec);
}

void MetricsRegistry::alias(const std::string& name, const std::string& help, const Histogram& source, AliasSpec spec) {
  {
    std::lock_guard lock(mutex_);
    FN_CHECK(std::any_of(entries_.begin(), entries_.end(), [&](auto& e) { return e->histogram.get() == &source; }),
             "metrics: alias \"{}\" of a histogram of another registry", name);
  }
  FN_CHECK(!spec.relabel && spec.zero_series.empty() && (!spec.type || *spec.type == Kind::Histogram),
           "metrics: alias \"{}\" of a histogram takes constant labels only", name);
  Entry& e = add(name, help, Kind::Histogram);
  e.src_histogram = &source;
  e.spec = std::move(spec);
}

void MetricsRegistry::render_values(const Entry& e, const std::map<Labels, double>& values, std::string& out) const {
  const bool is_alias = e.src_counter || e.src_gauge;
  if (!is_alias) {
    if (values.empty()) out += fmt::format("{} 0\n", e.name);
    for (auto& [labels, v] : values) out += fmt::format("{}{} {}\n", e.name, label_text(labels), prometheus_number(v));
    return;
  }
  std::map<Labels, double> mapped;
  for (auto& [labels, v] : values) {
    std::optional<Labels> l = e.spec.relabel ? e.spec.relabel(labels) : std::optional<Labels>(labels);
    if (l) mapped[concat(e.spec.labels, *l)] += v;
  }
  for (const Labels& z : e.spec.zero_series) mapped.emplace(concat(e.spec.labels, z), 0.0);
  if (mapped.empty()) out += fmt::format("{}{} 0\n", e.name, label_text(e.spec.labels));
  for (auto& [labels, v] : mapped) out += fmt::format("{}{} {}\n", e.name, label_text(labels), prometheus_number(v));
}

void MetricsRegistry::render_histogram(const Entry& e, const Histogram& h, const Labels& labels,
                                       std::string& out) const {
  std::lock_guard hl(h.mutex_);
  // Labels then `le`: {a="x",le="0.5"}.
  std::string prefix;
  for (auto& [k, v] : labels) prefix += k + "=\"" + escape_label(v) + "\",";
  uint64_t cum = 0;
  for (size_t i = 0; i < h.bounds_.size(); ++i) {
    cum += h.counts_[i];
    out += fmt::format("{}_bucket{{{}le=\"{}\"}} {}\n", e.name, prefix, prometheus_number(h.bounds_[i]), cum);
  }
  out += fmt::format("{}_bucket{{{}le=\"+Inf\"}} {}\n", e.name, prefix, h.count_);
  const std::string l = label_text(labels);
  out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", e.name, l, prometheus_number(h.sum_), e.name, l, h.count_);
}

std::string MetricsRegistry::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& e : entries_) {
    static const char* kTypes[] = {"counter", "gauge", "histogram"};
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", e->name, escape_help(e->help), e->name, kTypes[int(e->kind)]);
    if (e->histogram || e->src_histogram) {
      render_histogram(*e, e->histogram ? *e->histogram : *e->src_histogram, e->spec.labels, out);
      continue;
    }
    const Counter* c = e->counter ? e->counter.get() : e->src_counter;
    const Gauge* g = e->gauge ? e->gauge.get() : e->src_gauge;
    std::lock_guard vl(c ? c->mutex_ : g->mutex_);
    render_values(*e, c ? c->values_ : g->values_, out);
  }
  return out;
}

}  // namespace flashnext::server
