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

}  // namespace
}  // namespace flashnext::server
