// Prometheus text exposition (server/metrics.h), checked against the format's rules: HELP/TYPE lines, label
// escaping, cumulative histogram buckets ending with +Inf == _count, and _sum.
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "server/metrics.h"

namespace flashnext::server {
namespace {

TEST(Metrics, RendersCountersGaugesAndHistograms) {
  MetricsRegistry r;
  Counter& c = r.counter("x_requests_total", "Requests.");
  Gauge& g = r.gauge("x_running", "Running.");
  Histogram& h = r.histogram("x_latency_seconds", "Latency.", {0.25, 1, 10});
  c.inc(1, {{"reason", "stop"}});
  c.inc(2, {{"reason", "stop"}});
  c.inc(1, {{"reason", "a\"b\\c\nd"}});
  c.inc(-5, {{"reason", "stop"}});  // ignored: counters never go down
  g.set(3);
  for (double v : {0.125, 0.25, 0.5, 5.0, 50.0}) h.observe(v);  // exact in binary
  EXPECT_EQ(c.value({{"reason", "stop"}}), 3);
  EXPECT_EQ(h.count(), 5u);
  EXPECT_DOUBLE_EQ(h.sum(), 55.875);
  EXPECT_EQ(h.bucket(0), 2u);  // 0.125 and 0.25 (le is inclusive)
  EXPECT_EQ(h.bucket(1), 3u);
  EXPECT_EQ(h.bucket(2), 4u);
  const std::string expected =
      "# HELP x_requests_total Requests.\n"
      "# TYPE x_requests_total counter\n"
      "x_requests_total{reason=\"a\\\"b\\\\c\\nd\"} 1\n"
      "x_requests_total{reason=\"stop\"} 3\n"
      "# HELP x_running Running.\n"
      "# TYPE x_running gauge\n"
      "x_running 3\n"
      "# HELP x_latency_seconds Latency.\n"
      "# TYPE x_latency_seconds histogram\n"
      "x_latency_seconds_bucket{le=\"0.25\"} 2\n"
      "x_latency_seconds_bucket{le=\"1\"} 3\n"
      "x_latency_seconds_bucket{le=\"10\"} 4\n"
      "x_latency_seconds_bucket{le=\"+Inf\"} 5\n"
      "x_latency_seconds_sum 55.875\n"
      "x_latency_seconds_count 5\n";
  EXPECT_EQ(r.render(), expected);
}

// A running total that its owner sets (the scheduler's statistics) is a gauge in code and a counter to Prometheus.
TEST(Metrics, AGaugeSetFromARunningTotalRendersAsACounter) {
  MetricsRegistry r;
  Gauge& g = r.gauge("z_hits_total", "Z.", MetricType::Counter);
  g.set(7);
  EXPECT_EQ(r.render(), "# HELP z_hits_total Z.\n# TYPE z_hits_total counter\nz_hits_total 7\n");
  r.alias("v:hits_total", "V.", g);  // an alias keeps its source's type unless told otherwise
  EXPECT_EQ(r.render(),
            "# HELP z_hits_total Z.\n# TYPE z_hits_total counter\nz_hits_total 7\n"
            "# HELP v:hits_total V.\n# TYPE v:hits_total counter\nv:hits_total 7\n");
  EXPECT_THROW(r.gauge("z_h", "no", MetricType::Histogram), Error);
}

TEST(Metrics, UnsetSeriesRenderAsZeroAndNamesAreChecked) {
  MetricsRegistry r;
  r.counter("y_total", "Y.");
  EXPECT_EQ(r.render(), "# HELP y_total Y.\n# TYPE y_total counter\ny_total 0\n");
  EXPECT_THROW(r.counter("y_total", "again"), Error);
  EXPECT_THROW(r.gauge("1bad", "digits first"), Error);
  EXPECT_THROW(r.gauge("bad-name", "dash"), Error);
  EXPECT_THROW(r.histogram("h", "unsorted", {1, 0.5}), Error);
}

TEST(Metrics, NumbersAndConcurrency) {
  EXPECT_EQ(prometheus_number(3), "3");
  EXPECT_EQ(prometheus_number(0.25), "0.25");
  EXPECT_EQ(prometheus_number(1.0 / 0.0), "+Inf");
  MetricsRegistry r;
  Counter& c = r.counter("z_total", "Z.");
  Histogram& h = r.histogram("z_seconds", "Z.", {1});
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        c.inc();
        h.observe(0.5);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(c.value(), 4000);
  EXPECT_EQ(h.count(), 4000u);
  EXPECT_EQ(h.bucket(0), 4000u);
}

TEST(Metrics, AliasesRenderTheSameValuesUnderAnotherName) {
  MetricsRegistry r;
  Counter& c = r.counter("x_requests_total", "Requests.");
  Gauge& g = r.gauge("x_preemptions_total", "Preemptions (a gauge set from a running total).");
  Histogram& h = r.histogram("x_latency_seconds", "Latency.", {0.5, 1});
  AliasSpec model;
  model.labels = {{"model_name", "m"}};
  AliasSpec reasons = model;
  reasons.relabel = [](const Labels& in) -> std::optional<Labels> {
    if (in.size() != 2 || in[0].first != "endpoint") return std::nullopt;  // left out
    return Labels{{"finished_reason", in[1].second == "tool_calls" ? "stop" : in[1].second}};
  };
  reasons.zero_series = {{{"finished_reason", "abort"}}, {{"finished_reason", "stop"}}};
  r.alias("y:requests_total", "Requests by reason.", c, reasons);
  AliasSpec counter = model;
  counter.type = MetricType::Counter;
  r.alias("y:preemptions_total", "Preemptions.", g, counter);
  r.alias("y:latency_seconds", "Latency.", h, model);
  EXPECT_THROW(r.alias("y:latency_seconds", "twice", h, model), Error);
  MetricsRegistry other;
  EXPECT_THROW(other.alias("z_total", "not ours", c), Error);
  EXPECT_THROW(r.alias("y:bad_seconds", "histograms take constant labels only", h, reasons), Error);

  c.inc(2, {{"endpoint", "chat"}, {"finish_reason", "stop"}});
  c.inc(1, {{"endpoint", "completions"}, {"finish_reason", "stop"}});
  c.inc(4, {{"endpoint", "chat"}, {"finish_reason", "tool_calls"}});
  c.inc(3, {{"endpoint", "chat"}, {"finish_reason", "length"}});
  c.inc(9, {{"other", "x"}});
  g.set(5);
  h.observe(0.25);
  h.observe(2);
  const std::string text = r.render();
  const std::string expected_alias =
      "# HELP y:requests_total Requests by reason.\n"
      "# TYPE y:requests_total counter\n"
      "y:requests_total{model_name=\"m\",finished_reason=\"abort\"} 0\n"
      "y:requests_total{model_name=\"m\",finished_reason=\"length\"} 3\n"
      "y:requests_total{model_name=\"m\",finished_reason=\"stop\"} 7\n"
      "# HELP y:preemptions_total Preemptions.\n"
      "# TYPE y:preemptions_total counter\n"
      "y:preemptions_total{model_name=\"m\"} 5\n"
      "# HELP y:latency_seconds Latency.\n"
      "# TYPE y:latency_seconds histogram\n"
      "y:latency_seconds_bucket{model_name=\"m\",le=\"0.5\"} 1\n"
      "y:latency_seconds_bucket{model_name=\"m\",le=\"1\"} 1\n"
      "y:latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 2\n"
      "y:latency_seconds_sum{model_name=\"m\"} 2.25\n"
      "y:latency_seconds_count{model_name=\"m\"} 2\n";
  ASSERT_NE(text.find(expected_alias), std::string::npos) << text;
  // The sources render as before.
  EXPECT_NE(text.find("x_requests_total{endpoint=\"chat\",finish_reason=\"tool_calls\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE x_preemptions_total gauge\nx_preemptions_total 5\n"), std::string::npos);
  EXPECT_NE(text.find("x_latency_seconds_bucket{le=\"0.5\"} 1\n"), std::string::npos);
}

TEST(Metrics, AnAliasWithNoSeriesRendersItsLabelsAsZero) {
  MetricsRegistry r;
  Counter& c = r.counter("a_total", "A.");
  AliasSpec spec;
  spec.labels = {{"model_name", "m"}, {"engine", "0"}};
  r.alias("b:a_total", "A again.", c, spec);
  EXPECT_EQ(r.render(),
            "# HELP a_total A.\n# TYPE a_total counter\na_total 0\n"
            "# HELP b:a_total A again.\n# TYPE b:a_total counter\nb:a_total{model_name=\"m\",engine=\"0\"} 0\n");
  c.inc(2);
  EXPECT_NE(r.render().find("b:a_total{model_name=\"m\",engine=\"0\"} 2\n"), std::string::npos);
}

}  // namespace
}  // namespace flashnext::server
