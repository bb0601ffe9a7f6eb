// summarize_kernel_trace and short_kernel_name (ops/kernel_trace.h): the charges of overlapping and idle timelines
// against their definition, and names against the demangler.
#include "ops/kernel_trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/error.h"

namespace flashnext {
namespace {

const KernelTraceRow& row(const KernelTraceSummary& s, const std::string& name) {
  auto it = std::find_if(s.rows.begin(), s.rows.end(), [&](const KernelTraceRow& r) { return r.name == name; });
  EXPECT_NE(it, s.rows.end()) << name;
  return *it;
}

TEST(KernelTrace, OverlappingChainIdleGapAndBranch) {
  // a [0, 10] us; b starts at 5 (its blocks wait on a) and ends at 20; a gap of 5; c [25, 30]; d on another stream
  // inside b's span. Given out of order.
  const std::vector<KernelInterval> t{{"c", 25000, 30000, 0, 1},
                                      {"a", 0, 10000, 0, 1},
                                      {"d", 12000, 18000, 0, 2},
                                      {"b", 5000, 20000, 0, 1}};
  const KernelTraceSummary s = summarize_kernel_trace(t);
  EXPECT_EQ(s.kernels, 4);
  EXPECT_DOUBLE_EQ(s.span_us, 30.0);
  EXPECT_DOUBLE_EQ(s.idle_us, 5.0);
  EXPECT_DOUBLE_EQ(row(s, "a").critical_us, 10.0);
  EXPECT_DOUBLE_EQ(row(s, "b").critical_us, 10.0);  // 10 .. 20: what it alone extends
  EXPECT_DOUBLE_EQ(row(s, "c").critical_us, 5.0);
  EXPECT_DOUBLE_EQ(row(s, "d").critical_us, 0.0);  // inside b
  EXPECT_DOUBLE_EQ(row(s, "b").busy_us, 15.0);
  EXPECT_DOUBLE_EQ(row(s, "d").busy_us, 6.0);
  EXPECT_DOUBLE_EQ(row(s, "c").idle_before_us, 5.0);  // the gap 20 .. 25
  EXPECT_DOUBLE_EQ(row(s, "a").idle_before_us + row(s, "b").idle_before_us + row(s, "d").idle_before_us, 0.0);
  // Largest critical first; equal ones keep name order (a before b).
  ASSERT_EQ(s.rows.size(), 4u);
  EXPECT_EQ(s.rows[0].name, "a");
  EXPECT_EQ(s.rows[1].name, "b");
  EXPECT_EQ(s.rows[2].name, "c");
  EXPECT_EQ(s.rows[3].name, "d");
}

TEST(KernelTrace, LaunchesOfOneNameAddUp) {
  const std::vector<KernelInterval> t{{"k", 0, 2000}, {"k", 3000, 4000}, {"k", 3500, 6000}};
  const KernelTraceSummary s = summarize_kernel_trace(t);
  ASSERT_EQ(s.rows.size(), 1u);
  EXPECT_EQ(s.rows[0].launches, 3);
  EXPECT_DOUBLE_EQ(s.rows[0].busy_us, 2.0 + 1.0 + 2.5);
  EXPECT_DOUBLE_EQ(s.rows[0].critical_us, 2.0 + 1.0 + 2.0);
  EXPECT_DOUBLE_EQ(s.idle_us, 1.0);
  EXPECT_DOUBLE_EQ(s.span_us, 6.0);
}

TEST(KernelTrace, RowsByGrid) {
  // One kernel at two shapes: by name one row, by grid two, with the same charges in all.
  const std::vector<KernelInterval> t{{"gemv", 0, 4000, 0, 0, 2060, 1, 1},
                                      {"gemv", 4000, 5000, 0, 0, 640, 1, 1},
                                      {"gemv", 6000, 10000, 0, 0, 2060, 1, 1}};
  const KernelTraceSummary by_name = summarize_kernel_trace(t), by_grid = summarize_kernel_trace(t, true);
  ASSERT_EQ(by_name.rows.size(), 1u);
  EXPECT_DOUBLE_EQ(by_name.rows[0].critical_us, 9.0);
  ASSERT_EQ(by_grid.rows.size(), 2u);
  EXPECT_EQ(by_grid.rows[0].name, "gemv [2060 x 1 x 1]");
  EXPECT_EQ(by_grid.rows[0].launches, 2);
  EXPECT_DOUBLE_EQ(by_grid.rows[0].critical_us, 8.0);
  EXPECT_EQ(by_grid.rows[1].name, "gemv [640 x 1 x 1]");
  EXPECT_DOUBLE_EQ(by_grid.rows[1].critical_us, 1.0);
  EXPECT_DOUBLE_EQ(by_grid.rows[0].idle_before_us + by_grid.rows[1].idle_before_us, by_name.idle_us);
  EXPECT_DOUBLE_EQ(by_grid.idle_us, 1.0);
}

TEST(KernelTrace, ChargesAreTheUnionOfTheIntervals) {
  // Random timelines on a grid of 1 ns: the charges add up to the covered points, idle to the uncovered ones.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<KernelInterval> t;
    const int n = 1 + int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const uint64_t a = rng() % 1000, len = rng() % 60;
      const char* names[] = {"k0", "k1", "k2", "k3", "k4"};
      t.push_back({names[rng() % 5], a, a + len, 0, uint32_t(rng() % 3)});
    }
    uint64_t lo = t[0].start_ns, hi = t[0].end_ns;
    for (const auto& k : t) lo = std::min(lo, k.start_ns), hi = std::max(hi, k.end_ns);
    std::vector<char> covered(size_t(hi - lo), 0);
    for (const auto& k : t)
      for (uint64_t x = k.start_ns; x < k.end_ns; ++x) covered[size_t(x - lo)] = 1;
    const double union_us = double(std::count(covered.begin(), covered.end(), 1)) * 1e-3;
    const KernelTraceSummary s = summarize_kernel_trace(t);
    double critical = 0, busy = 0, busy_expected = 0, idle_before = 0;
    for (const auto& r : s.rows) critical += r.critical_us, busy += r.busy_us, idle_before += r.idle_before_us;
    EXPECT_NEAR(idle_before, s.idle_us, 1e-9) << trial;
    for (const auto& k : t) busy_expected += double(k.end_ns - k.start_ns) * 1e-3;
    EXPECT_NEAR(critical, union_us, 1e-9) << trial;
    EXPECT_NEAR(s.idle_us, double(hi - lo) * 1e-3 - union_us, 1e-9) << trial;
    EXPECT_NEAR(s.span_us, double(hi - lo) * 1e-3, 1e-9) << trial;
    EXPECT_NEAR(busy, busy_expected, 1e-9) << trial;
  }
}

TEST(KernelTrace, EmptyAndInvalid) {
  const KernelTraceSummary s = summarize_kernel_trace({});
  EXPECT_EQ(s.kernels, 0);
  EXPECT_EQ(s.span_us, 0.0);
  EXPECT_TRUE(s.rows.empty());
  try {
    summarize_kernel_trace({{"bad_kernel", 100, 50}});
    FAIL() << "an interval ending before it starts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad_kernel"), std::string::npos) << e.what();
  }
}

TEST(KernelTrace, ShortNames) {
  // Symbols as g++ mangles them (checked with c++filt).
  EXPECT_EQ(short_kernel_name("_ZN9flashnext6detail12_GLOBAL__N_112hc_up_kernelILi4EEEvPfPKfPK6__halfifb"),
            "hc_up_kernel<4>");
  EXPECT_EQ(short_kernel_name("_ZN9flashnext6detail12_GLOBAL__N_111gemv_kernelIfLi2EEEvPKT_PFviE"),
            "gemv_kernel<float, 2>");
  EXPECT_EQ(short_kernel_name("plain_c_kernel"), "plain_c_kernel");
  EXPECT_EQ(short_kernel_name(nullptr), "?");
}

}  // namespace
}  // namespace flashnext
