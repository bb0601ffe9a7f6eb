// bench_ops: the perf mode of the op-case registry (tests/ops/op_cases.h). Times every perf case on one backend and
// prints per op the median time, the bytes and FLOPs rates the case's shapes imply, and their ratios to two rates
// measured in the same run: the copy bandwidth (a large device-to-device copy_rows) and the FP16 GEMM rate (a large
// linear).
//   bench_ops [--backend cpu|cuda] [--precision fp16x2|fp16] [--filter REGEX] [--repeat N] [--json FILE] [--small]
// --small runs the test shapes (a quick CPU smoke run); without it, the released widths (GPU sizes: tens of GB of
// device memory; on the CPU use --filter, and the references are the small ones). Each case is built (untimed), run
// once to warm up, then timed --repeat times between Ops::synchronize calls; the median is reported. Cases whose
// warm-up takes over a second are timed 3 times at most. Timing results are not checked against anything (no
// assertion): the tests are test_ops.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "op_cases.h"
#include "ops/ops.h"
#ifdef FLASHNEXT_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace {

using namespace flashnext;
using namespace flashnext::opcases;

struct Options {
  std::string backend = "cpu", precision = "fp16x2", filter, json;
  int repeat = 10;
  bool small = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_ops: %s\nusage: bench_ops [--backend cpu|cuda] [--precision fp16x2|fp16] [--filter REGEX] "
               "[--repeat N] [--json FILE] [--small]\n",
               why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--backend")
      o.backend = value();
    else if (a == "--precision")
      o.precision = value();
    else if (a == "--filter")
      o.filter = value();
    else if (a == "--repeat")
      o.repeat = std::atoi(value().c_str());
    else if (a == "--json")
      o.json = value();
    else if (a == "--small")
      o.small = true;
    else if (a == "--help" || a == "-h")
      usage("help");
    else
      usage("unknown argument " + a);
  }
  if (o.backend != "cpu" && o.backend != "cuda") usage("--backend must be cpu or cuda");
  if (o.precision != "fp16x2" && o.precision != "fp16") usage("--precision must be fp16x2 or fp16");
  if (o.repeat < 1) usage("--repeat must be >= 1");
  return o;
}

std::shared_ptr<Ops> make_backend(const Options& o) {
  if (o.backend == "cpu") return make_cpu_ops(0);
#ifdef FLASHNEXT_HAVE_CUDA
  CudaOpsOptions c = CudaOpsOptions::from_env();
  c.activations = o.precision == "fp16" ? ActivationPrecision::Fp16 : ActivationPrecision::Fp16x2;
  return make_cuda_ops(0, c);
#else
  usage("--backend cuda: this build has no CUDA backend (configure with FLASHNEXT_CUDA=ON)");
#endif
}

/// One timed case.
struct Result {
  const OpCase* c = nullptr;
  double us = 0;  // median microseconds per run
  int runs = 0;
  std::string error;
};

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Result time_case(Ops& ops, const OpCase& c, int repeat) {
  Result r;
  r.c = &c;
  try {
    OpRun run = c.build(ops, 1234);
    ops.synchronize();
    double t0 = now_us();
    run.run();  // warm-up
    ops.synchronize();
    const double warm = now_us() - t0;
    const int n = warm > 1e6 ? std::min(repeat, 3) : repeat;
    std::vector<double> t;
    for (int i = 0; i < n; ++i) {
      t0 = now_us();
      run.run();
      ops.synchronize();
      t.push_back(now_us() - t0);
    }
    std::sort(t.begin(), t.end());
    r.us = t[t.size() / 2];
    r.runs = n;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::shared_ptr<Ops> ops;
  try {
    ops = make_backend(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ops: %s\n", e.what());
    return 1;
  }
  const std::vector<OpCase> cases = perf_cases(o.small);
  // The references of the released list are GPU-sized (1 GiB, 8192^3): the CPU takes the small ones (enough to
  // saturate it) in every mode.
  const std::vector<OpCase> references = o.backend == "cpu" && !o.small ? perf_cases(true) : cases;
  const std::regex filter(o.filter.empty() ? std::string(".*") : o.filter);
  std::vector<Result> results;
  double copy_gbs = 0, gemm_tflops = 0;
  // The two references first (whatever the filter), then the cases the filter selects.
  for (const OpCase& c : references) {
    if (c.reference == Reference::None) continue;
    Result r = time_case(*ops, c, o.repeat);
    if (r.error.empty() && c.reference == Reference::Copy) copy_gbs = c.bytes / r.us * 1e-3;
    if (r.error.empty() && c.reference == Reference::Gemm) gemm_tflops = c.flops / r.us * 1e-6;
    results.push_back(r);
  }
  for (const OpCase& c : cases) {
    if (c.reference != Reference::None || !std::regex_search(c.name, filter)) continue;
    if (c.needs_device_sampling && !ops->samples_on_device()) continue;
    results.push_back(time_case(*ops, c, o.repeat));
  }

  std::printf("bench_ops: %s%s, %s shapes, median of up to %d runs\n", ops->name().c_str(),
              o.backend == "cuda" ? (", activations " + o.precision).c_str() : "", o.small ? "test" : "released",
              o.repeat);
  std::printf("references: copy %.1f GB/s, GEMM %.3f TFLOP/s (linear: FP16 weights on CUDA, float32 on the CPU)\n",
              copy_gbs, gemm_tflops);
  std::printf("%-84s %-8s %11s %9s %9s %7s %7s\n", "case", "family", "us", "GB/s", "TFLOP/s", "/copy", "/gemm");
  nlohmann::json js = nlohmann::json::array();
  for (const Result& r : results) {
    const OpCase& c = *r.c;
    if (!r.error.empty()) {
      std::printf("%-84s %-8s error: %s\n", c.name.c_str(), family_name(c.family), r.error.c_str());
      js.push_back({{"case", c.name}, {"family", family_name(c.family)}, {"error", r.error}});
      continue;
    }
    const double gbs = r.us > 0 ? c.bytes / r.us * 1e-3 : 0, tflops = r.us > 0 ? c.flops / r.us * 1e-6 : 0;
    const double to_copy = copy_gbs > 0 ? gbs / copy_gbs : 0, to_gemm = gemm_tflops > 0 ? tflops / gemm_tflops : 0;
    std::printf("%-84s %-8s %11.1f %9.2f %9.4f %7.3f %7.3f\n", c.name.c_str(), family_name(c.family), r.us, gbs, tflops,
                to_copy, to_gemm);
    js.push_back({{"case", c.name},
                  {"family", family_name(c.family)},
                  {"us", r.us},
                  {"runs", r.runs},
                  {"bytes", c.bytes},
                  {"flops", c.flops},
                  {"gb_per_s", gbs},
                  {"tflop_per_s", tflops},
                  {"ratio_copy", to_copy},
                  {"ratio_gemm", to_gemm}});
  }
  if (!o.json.empty()) {
    nlohmann::json doc = {{"backend", ops->name()},
                          {"precision", o.backend == "cuda" ? o.precision : "float32"},
                          {"shapes", o.small ? "test" : "released"},
                          {"copy_gb_per_s", copy_gbs},
                          {"gemm_tflop_per_s", gemm_tflops},
                          {"cases", js}};
    std::ofstream(o.json) << doc.dump(2) << "\n";
  }
  int errors = 0;
  for (const Result& r : results) errors += !r.error.empty();
  return errors ? 1 : 0;
}
