#include "ops/kernel_trace.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>

#include "core/error.h"

namespace flashnext {

KernelTraceSummary summarize_kernel_trace(std::vector<KernelInterval> trace, bool by_grid) {
  KernelTraceSummary s;
  if (trace.empty()) return s;
  for (const KernelInterval& k : trace)
    FN_CHECK(k.end_ns >= k.start_ns, "kernel trace: '{}' ends ({} ns) before it starts ({} ns)", k.name, k.end_ns,
             k.start_ns);
  std::sort(trace.begin(), trace.end(), [](const KernelInterval& a, const KernelInterval& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns < b.end_ns;
  });
  std::map<std::string, KernelTraceRow> rows;
  uint64_t latest_end = trace.front().start_ns;
  for (const KernelInterval& k : trace) {
    const std::string key = by_grid ? fmt::format("{} [{} x {} x {}]", k.name, k.grid_x, k.grid_y, k.grid_z) : k.name;
    KernelTraceRow& r = rows[key];
    r.name = key;
    ++r.launches;
    r.busy_us += double(k.end_ns - k.start_ns) * 1e-3;
    if (k.start_ns > latest_end) {
      const double gap = double(k.start_ns - latest_end) * 1e-3;
      s.idle_us += gap;
      r.idle_before_us += gap;
    }
    const uint64_t from = std::max(k.start_ns, latest_end);
    if (k.end_ns > from) r.critical_us += double(k.end_ns - from) * 1e-3;
    latest_end = std::max(latest_end, k.end_ns);
  }
  s.span_us = double(latest_end - trace.front().start_ns) * 1e-3;
  s.kernels = int64_t(trace.size());
  for (auto& [name, r] : rows) s.rows.push_back(std::move(r));
  std::stable_sort(s.rows.begin(), s.rows.end(),
                   [](const KernelTraceRow& a, const KernelTraceRow& b) { return a.critical_us > b.critical_us; });
  return s;
}

std::string short_kernel_name(const char* symbol) {
  if (!symbol) return "?";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(abi::__cxa_demangle(symbol, nullptr, nullptr, &status), &std::free);
  if (status != 0 || !d) return symbol;
  std::string n = d.get();
  for (const char* ns : {"flashnext::", "detail::", "(anonymous namespace)::"})
    for (size_t p; (p = n.find(ns)) != std::string::npos;) n.erase(p, std::char_traits<char>::length(ns));
  // The parameter list: the last top-level parenthesised group (a parameter of function-pointer type holds
  // parentheses of its own).
  int depth = 0;
  size_t open = std::string::npos;
  for (size_t i = n.size(); i-- > 0;) {
    if (n[i] == ')') ++depth;
    if (n[i] == '(' && --depth == 0) {
      open = i;
      break;
    }
  }
  if (open != std::string::npos && open > 0) n.resize(open);
  // The return type: up to the last space outside template brackets.
  depth = 0;
  for (size_t i = n.size(); i-- > 0;) {
    if (n[i] == '>') ++depth;
    if (n[i] == '<') --depth;
    if (n[i] == ' ' && depth == 0) {
      n.erase(0, i + 1);
      break;
    }
  }
  return n;
}

}  // namespace flashnext
