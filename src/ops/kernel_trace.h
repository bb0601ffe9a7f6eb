// The device timeline of a run of kernels (`flashnext bench --kernel-trace`, docs/BENCH.md): which kernels a step's
// time goes to when its kernels overlap (programmatic dependent launch lets a kernel's blocks start before the one
// ahead ends; branch streams run beside the main one), so that no kernel's duration alone says what it costs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashnext {

/// One kernel's execution: its name (short_kernel_name), when its first block started and its last ended, in
/// nanoseconds of one clock (CUPTI's timestamps), the device and stream it ran on, and its grid (blocks in x, y, z;
/// 0 where unknown).
struct KernelInterval {
  std::string name;
  uint64_t start_ns = 0, end_ns = 0;
  uint32_t device = 0, stream = 0;
  int32_t grid_x = 0, grid_y = 0, grid_z = 0;
};

/// The kernels of one name in a trace: launches, busy time (the sum of end - start; under programmatic launch it
/// includes the time the blocks waited for the kernel ahead), critical time (what the timeline gains by this name's
/// ends) and idle before (the device idle just before these kernels started: what they waited for, e.g. a copy or
/// the host), in microseconds (summarize_kernel_trace).
struct KernelTraceRow {
  std::string name;
  int64_t launches = 0;
  double busy_us = 0, critical_us = 0, idle_before_us = 0;
};

/// A trace summed: span (first start to last end), idle (time within the span when no kernel ran: host work, copies,
/// waits on the host), kernels, and rows per name, largest critical time first (ties by name). The critical times and
/// idle add up to the span.
struct KernelTraceSummary {
  double span_us = 0, idle_us = 0;
  int64_t kernels = 0;
  std::vector<KernelTraceRow> rows;
};

/// Sums a trace. The intervals are taken in order of start (ties: earlier end first); with E the latest end of the
/// ones before, interval i is charged max(0, end_i - max(start_i, E)): the part of the timeline it alone extends, so
/// a kernel that ran inside the span of others (a branch stream's, or one hidden by its neighbours) is charged
/// nothing, and a chain of overlapping kernels is charged end to end. start_i > E adds start_i - E to idle and to
/// kernel i's idle_before_us. Intervals
/// with end < start are an error (Error naming the kernel).
/// With `by_grid` the rows are per name and grid ("name [gx x gy x gz]"), which tells apart the launches of one kernel
/// at different shapes (the decode GEMV's projections, its lm_head).
KernelTraceSummary summarize_kernel_trace(std::vector<KernelInterval> trace, bool by_grid = false);

/// A kernel's symbol as a short name: demangled, without return type, parameter list and the namespaces flashnext::,
/// detail:: and (anonymous namespace)::, template arguments kept ("_Z3fooILi1EEvPf" -> "foo<1>"). A name that does not
/// demangle (a C symbol, cuBLAS's internal names) is returned as it is.
std::string short_kernel_name(const char* symbol);

}  // namespace flashnext
