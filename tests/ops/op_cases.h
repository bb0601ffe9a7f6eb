// The op-case registry: every op the qwen4_exp forward calls (src/model/qwen4_exp/*.cpp), as a table of cases that
// run through any `Ops` backend and are compared with the float32 CPU backend (make_cpu_ops), the oracle.
// tests/ops/backend_ops_test.cpp runs every test case (test_ops); benchmarks/ops/ops_perf.cpp times the perf cases
// (bench_ops). In the manner of llama.cpp's test-backend-ops (every backend op against the CPU backend, with a perf
// mode) and llm.c's dev/cuda (a CPU reference, validation and a GB/s figure side by side).
//
// A case builds its inputs on the backend it is given, deterministically from a seed: activations as float32
// host vectors (`upload`), weights as FP16-representable values (`load_weight`), so that the CPU (float32 weights)
// and the CUDA backend (FP16 weights) hold the same weights exactly. Running it enqueues the op (one or several
// calls, e.g. steps with state carried between them); its outputs are then downloaded as host vectors, each with
// how it is compared and its error bound per activation precision of the backend under test.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace flashnext::opcases {

/// The op families (ops.h's sections).
enum class OpFamily : uint8_t { Memory, Dense, Hc, Gdn, Qsa, Moe, Ple, Sampling };
/// "memory", "dense", "hc", "gdn", "qsa", "moe", "ple", "sampling".
const char* family_name(OpFamily f);

/// Activation precision of the backend under test (the CUDA backend's ActivationPrecision; the CPU has one mode and
/// is compared bitwise whatever this says).
enum class Precision : uint8_t { Fp16x2, Fp16 };

/// Error bound of one float output: every element must satisfy |got - want| <= abs * scale + rel * |want|, where
/// want is the CPU oracle's value and scale = max |want| over the output (the output's scale; 1 when all zero).
/// {0, 0} asks for equality.
struct Bound {
  double abs = 0, rel = 0;
};

/// How an output is compared with the oracle's when the backend under test is not the CPU (CPU against CPU is always
/// bitwise).
enum class Compare : uint8_t {
  Close,    ///< floats within the Bound of the precision
  Exact,    ///< integers (or floats) equal element by element
  RowSets,  ///< integer rows [rows, width] equal as sets of their non-negative entries (QSA selections: the CUDA
            ///< backend may return a complete selection in position order)
};

/// One output of a case, downloaded to the host.
struct OpOutput {
  std::string name;  ///< e.g. "y", "state_pool"
  Compare compare = Compare::Close;
  std::vector<float> values;  ///< float outputs (Compare::Close, or Exact floats)
  std::vector<int32_t> ints;  ///< integer outputs (Exact, RowSets)
  int64_t row_width = 0;      ///< RowSets: entries per row
  Bound fp16x2, fp16;         ///< Close: the bound under each activation precision
};

/// A case built on one backend: `run` enqueues the op(s) (repeatable: perf mode runs it many times; state-carrying
/// cases keep advancing their state), `outputs` downloads the results of the runs so far.
struct OpRun {
  std::function<void()> run;
  std::function<std::vector<OpOutput>()> outputs;
};

/// What a perf case measures besides its own op: the references bench_ops divides by.
enum class Reference : uint8_t {
  None,
  Copy,  ///< the device's copy bandwidth: a large copy_rows
  Gemm,  ///< the FP16 GEMM rate: a large linear
};

/// One registry case.
struct OpCase {
  std::string name;  ///< "<op>/<shape parameters>", e.g. "linear/T=7/in=200/out=130"
  OpFamily family = OpFamily::Dense;
  /// Builds inputs on `ops` from `seed` (the same values on every backend for the same seed). Throws Error as the
  /// ops do.
  std::function<OpRun(Ops& ops, uint64_t seed)> build;
  /// Bytes one run moves (every input read and output written once; weights counted at 2 bytes (FP16, the CUDA
  /// storage), activations and state at their 4-byte dtype) and FLOPs it does (2 per multiply-add), from the shapes.
  double bytes = 0, flops = 0;
  /// The op exists only where Ops::samples_on_device() (sample_tokens): skipped elsewhere.
  bool needs_device_sampling = false;
  Reference reference = Reference::None;  ///< set on bench_ops' two reference cases
};

/// The test cases: every op at small widths, tails and edge shapes, plus a few at the released widths and their
/// TP2 / TP4 shards. Names are unique. Fast on the CPU (well under a minute for all in a Release build).
const std::vector<OpCase>& test_cases();

/// The perf cases. `small`: the test cases (CPU smoke runs) and references of 64 MiB / 1024^3; otherwise the
/// production ops at the released widths (models/release/config.json): decode T = 1, 8, 64 and prefill T = 4096
/// where meaningful, contexts of 8192 positions for the indexer and attention, weights made with Ops::random_weight /
/// random_experts on the device; references of 1 GiB / 8192^3. Exactly one case of each Reference kind.
std::vector<OpCase> perf_cases(bool small);

/// Compares `got` (the backend under test) with `want` (the CPU oracle) output by output: bitwise when `bitwise`,
/// else as each output's Compare says under `precision`. Returns "" when they agree, else a message naming the
/// output, the number of bad elements and the worst one.
std::string compare_outputs(const std::vector<OpOutput>& want, const std::vector<OpOutput>& got, bool bitwise,
                            Precision precision);

}  // namespace flashnext::opcases
