#include "op_builders.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "core/dtype.h"
#include "core/error.h"
#include "loader/quant.h"
#include "loader/safetensors.h"
#include "ops/random_uniform.h"

namespace flashnext::opcases {
namespace {

constexpr double kF = 4;  // bytes of a float32 / int32 element
constexpr double kW = 2;  // bytes of a weight element (FP16, the CUDA storage)

// ---------------------------------------------------------------- bounds (cuda_ops_test.cpp's, per precision)

constexpr Bound kF32{1e-4, 1e-4};        // float32 on both sides, reduction order differs
constexpr Bound kRule{1e-4, 1e-3};       // the gated delta rule and attention: long float32 sums
constexpr Bound kGemm16{5e-3, 1e-2};     // tensor-core product of FP16-rounded activations
constexpr Bound kHc16{1e-2, 1e-2};       // hyper-connection read through the FP16 path
constexpr Bound kExperts16{1e-2, 2e-2};  // grouped FP16 experts
constexpr Bound kExpertsW4{1e-2, 1e-2};  // W4A16 experts: FP16 activations in both precisions

// ---------------------------------------------------------------- inputs

/// Deterministic inputs of one case on one backend: tensor number k of the case draws from stream
/// random_bits(seed, k), element i = u(stream, i) mapped to [-scale, scale).
class Gen {
 public:
  Gen(Ops& ops, uint64_t seed, Weights wk) : ops_(ops), seed_(seed), wk_(wk) {}
  Ops& ops() { return ops_; }

  /// n values uniform in [-scale, scale), rounded to FP16 when `fp16`.
  std::vector<float> values(int64_t n, float scale, bool fp16 = false) {
    const uint64_t stream = random_bits(seed_, next_++);
    std::vector<float> v(static_cast<size_t>(std::max<int64_t>(n, 0)));
    for (size_t i = 0; i < v.size(); ++i) {
      const float x = (2.f * random_uniform(stream, i) - 1.f) * scale;
      v[i] = fp16 ? f16_to_float(float_to_f16(x)) : x;
    }
    return v;
  }
  /// A draw in [0, n).
  int64_t index(int64_t n) { return int64_t(random_bits(seed_ ^ 0x5bd1e995u, next_++) % uint64_t(n)); }
  Tensor act(const Shape& s, float scale = 1.f) {
    const auto v = values(shape_numel(s), scale);
    return ops_.upload(v.data(), DType::F32, s);
  }
  Tensor weight(const Shape& s, float scale) {
    if (wk_ == Weights::DeviceRandom) return ops_.random_weight(s, -scale, scale, random_bits(seed_, next_++));
    const auto v = values(shape_numel(s), scale, true);
    return ops_.load_weight(v.data(), DType::F32, s);
  }
  /// An 8-bit linear weight [rows, cols] (Ops::load_w8_linear) of values of RMS about `scale`: every int8 code, or
  /// every E4M3 code but NaN (subnormals, the largest exponents), equally likely, with float32 scales per row and
  /// `group` inputs (group = cols: one a row), each scale / RMS(codes) (73.9 for int8, 100.06 for E4M3) times a
  /// factor in [0.5, 1.5) that FP16 does not hold exactly. The CPU oracle holds their exact float32 values.
  Tensor w8_weight(const Shape& s, float scale, DType code, int64_t group) {
    W8Linear w;
    w.code = code;
    w.rows = s[0];
    w.cols = s[1];
    w.group = group;
    const uint64_t codes = random_bits(seed_, next_++), scales = random_bits(seed_, next_++);
    w.codes.resize(size_t(w.rows * w.cols));
    for (size_t i = 0; i < w.codes.size(); ++i) {
      const uint64_t r = random_bits(codes, i);
      if (code == DType::I8) {
        w.codes[i] = uint8_t(r % 256);
      } else {
        const uint8_t b = uint8_t(r % 254);  // 0x00..0x7e, then the sign
        w.codes[i] = uint8_t(((r >> 8) & 1) << 7 | (b % 127));
      }
    }
    w.scales.resize(size_t(w.rows * w.groups()));
    const float unit = scale / (code == DType::I8 ? 73.9f : 100.06f);
    for (size_t i = 0; i < w.scales.size(); ++i) w.scales[i] = unit * (0.5f + random_uniform(scales, i)) * 1.0001f;
    return ops_.load_w8_linear(w);
  }
  Tensor i32(const std::vector<int32_t>& v, const Shape& s) { return ops_.upload(v.data(), DType::I32, s); }
  Tensor i64(const std::vector<int64_t>& v, const Shape& s) { return ops_.upload(v.data(), DType::I64, s); }

 private:
  Ops& ops_;
  uint64_t seed_;
  Weights wk_;
  uint64_t next_ = 0;
};

// ---------------------------------------------------------------- outputs

std::vector<float> host_f32(Ops& ops, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) ops.download(t, v.data());
  return v;
}
std::vector<int32_t> host_i32(Ops& ops, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) ops.download(t, v.data());
  return v;
}
OpOutput close(Ops& ops, std::string name, const Tensor& t, Bound fp16x2, Bound fp16) {
  OpOutput o;
  o.name = std::move(name);
  o.values = host_f32(ops, t);
  o.fp16x2 = fp16x2;
  o.fp16 = fp16;
  return o;
}
OpOutput exact_f32(Ops& ops, std::string name, const Tensor& t) {
  OpOutput o;
  o.name = std::move(name);
  o.compare = Compare::Exact;
  o.values = host_f32(ops, t);
  return o;
}
OpOutput exact_i32(Ops& ops, std::string name, const Tensor& t) {
  OpOutput o;
  o.name = std::move(name);
  o.compare = Compare::Exact;
  o.ints = host_i32(ops, t);
  return o;
}
OpOutput row_sets(Ops& ops, std::string name, const Tensor& t) {
  OpOutput o;
  o.name = std::move(name);
  o.compare = Compare::RowSets;
  o.ints = host_i32(ops, t);
  o.row_width = t.dim(1);
  return o;
}
// ---------------------------------------------------------------- step batches

/// The paged layout of a StepPlan: slots and KV blocks per sequence, scrambled (a fixed permutation, the same on
/// every backend).
struct Paging {
  int64_t page = 16, num_blocks = 0, num_slots = 0;
  std::vector<int32_t> slot;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int64_t> total;  // positions per sequence after the last step
};

Paging make_paging(const StepPlan& plan) {
  const size_t n = plan.context.size();
  Paging p;
  p.page = plan.page;
  p.num_slots = int64_t(n) + 2;
  std::vector<int64_t> need(n);
  for (size_t s = 0; s < n; ++s) {
    int64_t len = plan.context[s];
    for (const auto& step : plan.steps) len += step[s];
    p.total.push_back(len);
    need[s] = (len + p.page - 1) / p.page;
    p.num_blocks += need[s];
  }
  p.num_blocks += 3;  // spare blocks nobody owns
  std::vector<int32_t> order(static_cast<size_t>(p.num_blocks)), slots(size_t(p.num_slots));
  std::iota(order.begin(), order.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  auto shuffle = [](std::vector<int32_t>& v, uint64_t seed) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[size_t(random_bits(seed, i) % i)]);
  };
  shuffle(order, 17);
  shuffle(slots, 29);
  size_t next = 0;
  for (size_t s = 0; s < n; ++s) {
    p.slot.push_back(slots[s]);
    p.tables.emplace_back(order.begin() + int64_t(next), order.begin() + int64_t(next) + need[s]);
    next += size_t(need[s]);
  }
  return p;
}

/// The StepBatch of step `i` of `plan` (sequences with tokens in that step, in sequence order).
StepBatch plan_step(Ops& ops, const StepPlan& plan, const Paging& p, size_t i) {
  std::vector<StepSequence> seqs;
  for (size_t s = 0; s < plan.context.size(); ++s) {
    int64_t pos0 = plan.context[s];
    for (size_t j = 0; j < i; ++j) pos0 += plan.steps[j][s];
    if (plan.steps[i][s] > 0) seqs.push_back({plan.steps[i][s], pos0, p.slot[s], p.tables[s]});
  }
  return make_step_batch(ops, seqs, p.page);
}

int64_t step_tokens(const StepPlan& plan, size_t i) {
  int64_t T = 0;
  for (int64_t t : plan.steps[i]) T += t;
  return T;
}
int64_t plan_tokens(const StepPlan& plan) {
  int64_t T = 0;
  for (size_t i = 0; i < plan.steps.size(); ++i) T += step_tokens(plan, i);
  return T;
}
int64_t plan_seq_steps(const StepPlan& plan) {  // sum over steps of the sequences in it
  int64_t n = 0;
  for (const auto& step : plan.steps)
    for (int64_t t : step) n += t > 0;
  return n;
}

std::string join(const std::vector<int64_t>& v) {
  return fmt::format("{}", fmt::join(v, ","));
}

}  // namespace

// ---------------------------------------------------------------- plans

std::string StepPlan::describe() const {
  std::vector<std::string> steps_s;
  for (const auto& s : steps) steps_s.push_back(join(s));
  return fmt::format("ctx={}/steps={}", join(context), fmt::join(steps_s, "|"));
}

StepPlan one_sequence(int64_t tokens, int64_t pos0) {
  StepPlan p;
  p.context = {pos0};
  p.steps = {{tokens}};
  return p;
}

StepPlan decode_batch(int64_t n, int64_t context) {
  StepPlan p;
  p.context.assign(size_t(n), context);
  p.steps = {std::vector<int64_t>(size_t(n), 1)};
  return p;
}

// ---------------------------------------------------------------- memory

OpCase copy_rows_case(int64_t rows, int64_t width, int64_t src_row, int64_t dst_row, int64_t n) {
  OpCase c;
  c.name = fmt::format("copy_rows/rows={}/width={}/src={}/dst={}/n={}", rows, width, src_row, dst_row, n);
  c.family = OpFamily::Memory;
  c.bytes = 2 * kF * double(n * width);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    Tensor src = g.act({rows, width}), dst = g.act({rows, width});
    return OpRun{[=, &ops] { ops.copy_rows(src, src_row, dst, dst_row, n); },
                 [=, &ops] { return std::vector<OpOutput>{exact_f32(ops, "dst", dst)}; }};
  };
  return c;
}

OpCase gather_rows_case(int64_t src_rows, int64_t width, int64_t n) {
  OpCase c;
  c.name = fmt::format("gather_rows/src_rows={}/width={}/n={}", src_rows, width, n);
  c.family = OpFamily::Memory;
  c.bytes = 2 * kF * double(n * width) + kF * double(n);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    Tensor src = g.act({src_rows, width}), dst = ops.empty({n, width});
    std::vector<int32_t> r(static_cast<size_t>(n));
    for (auto& x : r) x = int32_t(g.index(src_rows));  // repeats allowed
    Tensor rows = g.i32(r, {n});
    return OpRun{[=, &ops] { ops.gather_rows(src, rows, dst); },
                 [=, &ops] { return std::vector<OpOutput>{exact_f32(ops, "dst", dst)}; }};
  };
  return c;
}

OpCase scatter_rows_case(int64_t dst_rows, int64_t width, int64_t n) {
  OpCase c;
  c.name = fmt::format("scatter_rows/dst_rows={}/width={}/n={}", dst_rows, width, n);
  c.family = OpFamily::Memory;
  c.bytes = 2 * kF * double(n * width) + kF * double(n);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    Tensor src = g.act({n, width}), dst = g.act({dst_rows, width});
    std::vector<int32_t> perm(static_cast<size_t>(dst_rows));
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[size_t(g.index(int64_t(i)))]);
    perm.resize(size_t(n));  // distinct rows
    Tensor rows = g.i32(perm, {n});
    return OpRun{[=, &ops] { ops.scatter_rows(src, rows, dst); },
                 [=, &ops] { return std::vector<OpOutput>{exact_f32(ops, "dst", dst)}; }};
  };
  return c;
}

OpCase fill_zero_case(int64_t rows, int64_t width, int64_t r0, int64_t r1) {
  OpCase c;
  c.name = fmt::format("fill_zero/rows={}/width={}/r0={}/r1={}", rows, width, r0, r1);
  c.family = OpFamily::Memory;
  c.bytes = kF * double((r1 - r0) * width);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    Tensor t = g.act({rows, width});
    return OpRun{[=, &ops] { ops.fill_zero(t.rows(r0, r1)); },
                 [=, &ops] { return std::vector<OpOutput>{exact_f32(ops, "t", t)}; }};
  };
  return c;
}

OpCase random_weight_case(Shape shape, float lo, float hi) {
  OpCase c;
  c.name = fmt::format("random_weight/shape={}/lo={}/hi={}", join(shape), lo, hi);
  c.family = OpFamily::Memory;
  c.bytes = kW * double(shape_numel(shape));
  c.build = [=](Ops& ops, uint64_t seed) {
    auto w = std::make_shared<Tensor>();
    return OpRun{[=, &ops] { *w = ops.random_weight(shape, lo, hi, seed); },
                 [=, &ops] {
                   // As float32 whatever the weight dtype (F32 on the CPU, F16 on CUDA).
                   std::vector<uint8_t> raw(w->nbytes());
                   if (!raw.empty()) ops.download(*w, raw.data());
                   std::vector<float> v(static_cast<size_t>(w->numel()));
                   convert_to_float(w->dtype(), raw.data(), v.data(), v.size());
                   OpOutput o;
                   o.name = "weight";
                   o.values = std::move(v);
                   o.fp16x2 = o.fp16 = Bound{1e-7, 4.9e-4};  // FP16 rounding: 2^-11 relative
                   return std::vector<OpOutput>{o};
                 }};
  };
  return c;
}

// ---------------------------------------------------------------- dense

OpCase embedding_case(int64_t V, int64_t H, int64_t T, int64_t replicas, Weights wk) {
  OpCase c;
  c.name = fmt::format("embedding/V={}/H={}/T={}/replicas={}", V, H, T, replicas);
  c.family = OpFamily::Dense;
  c.bytes = kW * double(T * H) + kF * double(T * replicas * H + T);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    Tensor table = g.weight({V, H}, 1.f), out = ops.empty({T, replicas * H});
    std::vector<int32_t> id(static_cast<size_t>(T));
    for (auto& x : id) x = int32_t(g.index(V));
    if (T > 1) id[1] = int32_t(V - 1);  // the last row
    Tensor ids = g.i32(id, {T});
    return OpRun{[=, &ops] { ops.embedding(table, ids, out); },
                 [=, &ops] { return std::vector<OpOutput>{exact_f32(ops, "out", out)}; }};
  };
  return c;
}

OpCase linear_case(int64_t T, int64_t in, int64_t out, bool bias, Weights wk) {
  OpCase c;
  c.name = fmt::format("linear/T={}/in={}/out={}{}", T, in, out, bias ? "/bias" : "");
  c.family = OpFamily::Dense;
  c.bytes = kW * double(in * out + (bias ? out : 0)) + kF * double(T * (in + out));
  c.flops = 2.0 * double(T) * double(in) * double(out);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    // Weights of scale 1/sqrt(in): outputs of about the inputs' size.
    Tensor x = g.act({T, in}), w = g.weight({out, in}, float(std::sqrt(3.0 / double(in)))),
           b = bias ? g.weight({out}, 1.f) : Tensor(), y = ops.empty({T, out});
    return OpRun{[=, &ops] { ops.linear(x, w, y, b); },
                 [=, &ops] { return std::vector<OpOutput>{close(ops, "y", y, kF32, kGemm16)}; }};
  };
  return c;
}

OpCase linear_group_case(int64_t T, int64_t in, std::vector<int64_t> outs, std::vector<bool> bias, Weights wk) {
  OpCase c;
  std::string bias_s;
  for (bool b : bias) bias_s += b ? '1' : '0';
  c.name = fmt::format("linear_group/T={}/in={}/outs={}{}", T, in, join(outs), bias_s.empty() ? "" : "/bias=" + bias_s);
  c.family = OpFamily::Dense;
  int64_t total = 0;
  for (int64_t o : outs) total += o;
  c.bytes = kW * double(in * total) + kF * double(T * (in + total));
  c.flops = 2.0 * double(T) * double(in) * double(total);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    Tensor x = g.act({T, in});
    std::vector<Tensor> w, y, b;
    for (size_t i = 0; i < outs.size(); ++i) {
      w.push_back(g.weight({outs[i], in}, float(std::sqrt(3.0 / double(in)))));
      y.push_back(ops.empty({T, outs[i]}));
      if (!bias.empty()) b.push_back(bias[i] ? g.weight({outs[i]}, 1.f) : Tensor());
    }
    return OpRun{[=, &ops] { ops.linear_group(x, w, y, b); },
                 [=, &ops] {
                   std::vector<OpOutput> r;
                   for (size_t i = 0; i < y.size(); ++i)
                     r.push_back(close(ops, fmt::format("y{}", i), y[i], kF32, kGemm16));
                   return r;
                 }};
  };
  return c;
}

namespace {
/// "i8-row", "fp8-g64": an 8-bit weight's code and scale layout in case names.
std::string w8_name(DType code, int64_t group, int64_t in) {
  return fmt::format("{}-{}", code == DType::I8 ? "i8" : "fp8",
                     group >= in ? std::string("row") : fmt::format("g{}", group));
}
/// The bound of a product with an 8-bit weight under FP16x2 activations: float32 where the codes stay exact (one
/// scale a row, or the 8-bit GEMV: at most 32 rows, inputs and groups multiples of 16), else an FP16 rounding of
/// code * scale (block scales in a tensor-core tile).
Bound w8_bound(int64_t T, int64_t group, int64_t in) {
  return group >= in || (T <= 32 && in % 16 == 0 && group % 16 == 0) ? kF32 : kGemm16;
}
}  // namespace

OpCase linear_w8_case(int64_t T, int64_t in, int64_t out, DType code, int64_t group, bool bias) {
  OpCase c;
  c.name = fmt::format("linear/T={}/in={}/out={}/w8={}{}", T, in, out, w8_name(code, group, in), bias ? "/bias" : "");
  c.family = OpFamily::Dense;
  const int64_t G = (in + group - 1) / group;
  c.bytes = double(in * out) + kF * double(out * G) + kW * double(bias ? out : 0) + kF * double(T * (in + out));
  c.flops = 2.0 * double(T) * double(in) * double(out);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    Tensor x = g.act({T, in}), w = g.w8_weight({out, in}, float(std::sqrt(3.0 / double(in))), code, group),
           b = bias ? g.weight({out}, 1.f) : Tensor(), y = ops.empty({T, out});
    return OpRun{[=, &ops] { ops.linear(x, w, y, b); },
                 [=, &ops] { return std::vector<OpOutput>{close(ops, "y", y, w8_bound(T, group, in), kGemm16)}; }};
  };
  return c;
}

OpCase linear_group_w8_case(int64_t T, int64_t in, std::vector<int64_t> outs, DType code, int64_t group,
                            bool fp16_last) {
  OpCase c;
  c.name = fmt::format("linear_group/T={}/in={}/outs={}/w8={}{}", T, in, join(outs), w8_name(code, group, in),
                       fp16_last ? "/last_fp16" : "");
  c.family = OpFamily::Dense;
  int64_t total = 0;
  for (int64_t o : outs) total += o;
  // Codes, their float32 scales and the activations (the FP16 weight of a mixed group counted as 8-bit).
  c.bytes = double(in * total) + kF * double(total * ((in + group - 1) / group)) + kF * double(T * (in + total));
  c.flops = 2.0 * double(T) * double(in) * double(total);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    Tensor x = g.act({T, in});
    std::vector<Tensor> w, y;
    const float scale = float(std::sqrt(3.0 / double(in)));
    for (size_t i = 0; i < outs.size(); ++i) {
      const bool f16 = fp16_last && i + 1 == outs.size();
      w.push_back(f16 ? g.weight({outs[i], in}, scale) : g.w8_weight({outs[i], in}, scale, code, group));
      y.push_back(ops.empty({T, outs[i]}));
    }
    return OpRun{[=, &ops] { ops.linear_group(x, w, y, {}); },
                 [=, &ops] {
                   std::vector<OpOutput> r;
                   for (size_t i = 0; i < y.size(); ++i)
                     r.push_back(close(ops, fmt::format("y{}", i), y[i], w8_bound(T, group, in), kGemm16));
                   return r;
                 }};
  };
  return c;
}

OpCase zc_rms_norm_case(int64_t T, int64_t L, int64_t W, int64_t group, bool in_place, Weights wk) {
  OpCase c;
  c.name = fmt::format("zc_rms_norm/T={}/L={}/W={}/group={}{}", T, L, W, group, in_place ? "/in_place" : "");
  c.family = OpFamily::Dense;
  c.bytes = kW * double(W) + 2 * kF * double(T * L);
  c.flops = 4.0 * double(T * L);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    Tensor x = g.act({T, L}, 3.f), w = g.weight({W}, 0.3f), y = in_place ? x : ops.empty({T, L});
    return OpRun{[=, &ops] { ops.zc_rms_norm(x, w, group, 1e-6, y); },
                 [=, &ops] { return std::vector<OpOutput>{close(ops, "y", y, kF32, kF32)}; }};
  };
  return c;
}

OpCase gated_rms_norm_case(int64_t T, int64_t heads, int64_t D, GateAct act, Weights wk) {
  OpCase c;
  c.name = fmt::format("gated_rms_norm/T={}/heads={}/D={}/{}", T, heads, D, act == GateAct::Silu ? "silu" : "sigmoid");
  c.family = OpFamily::Dense;
  c.bytes = kW * double(D) + 3 * kF * double(T * heads * D);
  c.flops = 8.0 * double(T * heads * D);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    Tensor x = g.act({T, heads * D}), z = g.act({T, heads * D}, 2.f), w = g.weight({D}, 0.5f);
    return OpRun{[=, &ops] { ops.gated_rms_norm(x, z, w, 1e-6, act, x); },  // in place, as the model calls it
                 [=, &ops] { return std::vector<OpOutput>{close(ops, "y", x, kF32, kF32)}; }};
  };
  return c;
}

// ---------------------------------------------------------------- hyper-connections

OpCase hc_read_case(int64_t T, int64_t S, int64_t H, int64_t R, bool inject, Weights wk, float x_scale) {
  OpCase c;
  c.name = fmt::format("hc_read/T={}/S={}/H={}/R={}{}{}", T, S, H, R, inject ? "/inject" : "/mixer",
                       x_scale == 2.f ? std::string() : fmt::format("/x={:g}", x_scale));
  c.family = OpFamily::Hc;
  const int64_t SH = S * H;
  c.bytes = kW * double(SH * (2 * R + 1 + (inject ? S : 0))) + kF * double(T * (SH + H + (inject ? S : 0)));
  c.flops = 2.0 * double(T) * double(SH) * double(2 * R + (inject ? S : 0)) + 10.0 * double(T * SH);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    Tensor X = g.act({T, SH}, x_scale);
    HcWeights hc{g.weight({SH}, 0.2f), g.weight({R, SH}, float(std::sqrt(3.0 / double(SH)))),
                 g.weight({SH, R}, float(std::sqrt(3.0 / double(R)))),
                 inject ? g.weight({S, SH}, float(std::sqrt(3.0 / double(SH)))) : Tensor()};
    Tensor u = ops.empty({T, H}), inj = inject ? ops.empty({T, S}) : Tensor();
    return OpRun{[=, &ops] { ops.hc_read(X, hc, 1e-6, u, inj); },
                 [=, &ops] {
                   std::vector<OpOutput> r{close(ops, "u", u, kF32, kHc16)};
                   if (inject) r.push_back(close(ops, "inj", inj, kF32, kHc16));
                   return r;
                 }};
  };
  return c;
}

OpCase hc_inject_read_case(int64_t T, int64_t S, int64_t H, int64_t R, bool inject, Weights wk) {
  OpCase c;
  c.name = fmt::format("hc_inject_read/T={}/S={}/H={}/R={}{}", T, S, H, R, inject ? "/inject" : "/mixer");
  c.family = OpFamily::Hc;
  const int64_t SH = S * H;
  c.bytes = kW * double(SH * (2 * R + 1 + (inject ? S : 0))) + kF * double(T * (2 * SH + 2 * H + S + (inject ? S : 0)));
  c.flops = 2.0 * double(T) * double(SH) * double(2 * R + (inject ? S : 0)) + 12.0 * double(T * SH);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    Tensor X = g.act({T, SH}, 2.f), out = g.act({T, H}), inj_prev = g.act({T, S});
    HcWeights hc{g.weight({SH}, 0.2f), g.weight({R, SH}, float(std::sqrt(3.0 / double(SH)))),
                 g.weight({SH, R}, float(std::sqrt(3.0 / double(R)))),
                 inject ? g.weight({S, SH}, float(std::sqrt(3.0 / double(SH)))) : Tensor()};
    Tensor u = ops.empty({T, H}), inj = inject ? ops.empty({T, S}) : Tensor();
    return OpRun{[=, &ops] { ops.hc_inject_read(X, out, inj_prev, hc, 1e-6, u, inj); },
                 [=, &ops] {
                   std::vector<OpOutput> r{close(ops, "X", X, kF32, kF32), close(ops, "u", u, kF32, kHc16)};
                   if (inject) r.push_back(close(ops, "inj", inj, kF32, kHc16));
                   return r;
                 }};
  };
  return c;
}

OpCase hc_inject_case(int64_t T, int64_t S, int64_t H) {
  OpCase c;
  c.name = fmt::format("hc_inject/T={}/S={}/H={}", T, S, H);
  c.family = OpFamily::Hc;
  c.bytes = kF * double(T * (2 * S * H + H + S));
  c.flops = 2.0 * double(T * S * H);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    Tensor X = g.act({T, S * H}, 2.f), out = g.act({T, H}), inj = g.act({T, S});
    return OpRun{[=, &ops] { ops.hc_inject(X, out, inj); },
                 [=, &ops] { return std::vector<OpOutput>{close(ops, "X", X, kF32, kF32)}; }};
  };
  return c;
}

// ---------------------------------------------------------------- Gated DeltaNet

OpCase gdn_conv_batch_case(const GdnDims& d, int64_t K, const StepPlan& plan, Weights wk) {
  OpCase c;
  const int64_t C = d.conv_dim();
  c.name = fmt::format("gdn_conv_batch/C={}/K={}/{}", C, K, plan.describe());
  c.family = OpFamily::Gdn;
  const int64_t T = plan_tokens(plan);
  c.bytes = kW * double(C * K) + kF * double(2 * T * C + 2 * plan_seq_steps(plan) * (K - 1) * C);
  c.flops = 2.0 * double(T * C * K);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    const Paging p = make_paging(plan);
    Tensor w = g.weight({C, K}, 0.5f);
    // Non-zero carried state in every slot (a sequence's earlier inputs; sequences at position 0 read it too, as
    // the op defines: the caller zeroes a new sequence's slot).
    Tensor pool = g.act({p.num_slots, K - 1, C});
    std::vector<Tensor> qkv;
    std::vector<StepBatch> batches;
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      qkv.push_back(g.act({step_tokens(plan, i), C}));
      batches.push_back(plan_step(ops, plan, p, i));
    }
    return OpRun{[=, &ops] {
                   for (size_t i = 0; i < qkv.size(); ++i) ops.gdn_conv_batch(qkv[i], w, pool, batches[i]);
                 },
                 [=, &ops] {
                   std::vector<OpOutput> r;
                   for (size_t i = 0; i < qkv.size(); ++i)
                     r.push_back(close(ops, fmt::format("step{}.qkv", i), qkv[i], kF32, kF32));
                   r.push_back(exact_f32(ops, "state_pool", pool));
                   return r;
                 }};
  };
  return c;
}

// The per-step inputs of the gated delta rule cases: qkv [n, conv_dim], a and b [n, nv] (with z, the output gate
// [n, nv*dv]), an output o [n, nv*dv] and the StepBatch of each step of the plan.
struct GdnSteps {
  std::vector<Tensor> qkv, a, b, z, o;
  std::vector<StepBatch> batches;
};
GdnSteps gdn_steps(Ops& ops, Gen& g, const StepPlan& plan, const Paging& p, const GdnDims& d, bool with_z) {
  GdnSteps s;
  const int64_t nv = d.num_v_heads, width = nv * d.v_head_dim;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const int64_t n = step_tokens(plan, i);
    s.qkv.push_back(g.act({n, d.conv_dim()}));
    s.a.push_back(g.act({n, nv}, 2.f));
    s.b.push_back(g.act({n, nv}, 2.f));
    if (with_z) s.z.push_back(g.act({n, width}, 2.f));
    s.o.push_back(ops.empty({n, width}));
    s.batches.push_back(plan_step(ops, plan, p, i));
  }
  return s;
}

OpCase gdn_rule_batch_case(const GdnDims& d, const StepPlan& plan, Weights wk, float state_scale) {
  OpCase c;
  const int64_t C = d.conv_dim(), nv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim;
  c.name = fmt::format("gdn_rule_batch/nk={}/nv={}/dk={}/dv={}/{}{}", d.num_k_heads, nv, dk, dv, plan.describe(),
                       state_scale == 0.1f ? std::string() : fmt::format("/state={:g}", state_scale));
  c.family = OpFamily::Gdn;
  const int64_t T = plan_tokens(plan);
  c.bytes = kF * double(T * (C + 2 * nv + nv * dv) + 2 * plan_seq_steps(plan) * nv * dk * dv);
  c.flops = 7.0 * double(T * nv * dk * dv);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    const Paging p = make_paging(plan);
    // A_log, dt_bias are float32 parameters in the checkpoint; here FP16-exact too.
    GdnWeights w{g.weight({nv}, 0.5f), g.weight({nv}, 0.5f)};
    Tensor pool = g.act({p.num_slots, nv, dk, dv}, state_scale);
    const GdnSteps in = gdn_steps(ops, g, plan, p, d, false);
    return OpRun{[=, &ops] {
                   for (size_t i = 0; i < in.qkv.size(); ++i)
                     ops.gdn_rule_batch(in.qkv[i], in.a[i], in.b[i], w, d, pool, in.batches[i], in.o[i]);
                 },
                 [=, &ops] {
                   std::vector<OpOutput> r;
                   for (size_t i = 0; i < in.o.size(); ++i)
                     r.push_back(close(ops, fmt::format("step{}.o", i), in.o[i], kRule, kRule));
                   r.push_back(close(ops, "state_pool", pool, kRule, kRule));
                   return r;
                 }};
  };
  return c;
}

OpCase gdn_mix_batch_case(const GdnDims& d, int64_t K, const StepPlan& plan, std::optional<GateAct> act, Weights wk) {
  OpCase c;
  const int64_t C = d.conv_dim(), nv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim;
  c.name =
      fmt::format("gdn_mix_batch/nk={}/nv={}/dk={}/dv={}/K={}/{}/{}", d.num_k_heads, nv, dk, dv, K, plan.describe(),
                  !act                    ? "no_norm"
                  : *act == GateAct::Silu ? "silu"
                                          : "sigmoid");
  c.family = OpFamily::Gdn;
  const int64_t T = plan_tokens(plan), steps = plan_seq_steps(plan);
  c.bytes =
      kW * double(C * K + dv) + kF * double(T * (C + 2 * nv + 2 * nv * dv) + 2 * steps * (nv * dk * dv + (K - 1) * C));
  c.flops = 2.0 * double(T * C * K) + 7.0 * double(T * nv * dk * dv) + 8.0 * double(T * nv * dv);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    const Paging p = make_paging(plan);
    GdnWeights w{g.weight({nv}, 0.5f), g.weight({nv}, 0.5f)};
    Tensor conv_w = g.weight({C, K}, 0.5f), norm_w = g.weight({dv}, 0.5f);
    Tensor conv_pool = g.act({p.num_slots, K - 1, C}), pool = g.act({p.num_slots, nv, dk, dv}, 0.1f);
    const GdnSteps in = gdn_steps(ops, g, plan, p, d, true);
    return OpRun{[=, &ops] {
                   for (size_t i = 0; i < in.qkv.size(); ++i) {
                     const GdnOutputNorm norm = act ? GdnOutputNorm{in.z[i], norm_w, 1e-6, *act} : GdnOutputNorm{};
                     ops.gdn_mix_batch(in.qkv[i], conv_w, conv_pool, in.a[i], in.b[i], w, d, pool, in.batches[i], norm,
                                       in.o[i]);
                   }
                 },
                 [=, &ops] {
                   std::vector<OpOutput> r;
                   for (size_t i = 0; i < in.o.size(); ++i)
                     r.push_back(close(ops, fmt::format("step{}.o", i), in.o[i], kRule, kRule));
                   r.push_back(close(ops, "state_pool", pool, kRule, kRule));
                   r.push_back(exact_f32(ops, "conv_pool", conv_pool));
                   return r;
                 }};
  };
  return c;
}

// ---------------------------------------------------------------- QSA

OpCase qsa_prepare_qk_batch_case(int64_t nh, int64_t nkv, int64_t D, int64_t rotary, const StepPlan& plan, Weights wk) {
  OpCase c;
  c.name = fmt::format("qsa_prepare_qk_batch/nh={}/nkv={}/D={}/rotary={}/{}", nh, nkv, D, rotary, plan.describe());
  c.family = OpFamily::Qsa;
  const int64_t T = plan_tokens(plan);
  c.bytes = kW * double(2 * D) + kF * double(T * (4 * nh * D + 2 * nkv * D));
  c.flops = 10.0 * double(T * (nh + nkv) * D);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    const Paging p = make_paging(plan);
    Tensor qn = g.weight({D}, 0.2f), kn = g.weight({D}, 0.2f);
    const RopeParams rope{rotary, 10000000.0};
    std::vector<Tensor> qg, k, q, gate;
    std::vector<StepBatch> batches;
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      const int64_t n = step_tokens(plan, i);
      qg.push_back(g.act({n, nh * 2 * D}, 2.f));
      k.push_back(g.act({n, nkv * D}, 2.f));
      q.push_back(ops.empty({n, nh * D}));
      gate.push_back(ops.empty({n, nh * D}));
      batches.push_back(plan_step(ops, plan, p, i));
    }
    return OpRun{[=, &ops] {
                   for (size_t i = 0; i < qg.size(); ++i)
                     ops.qsa_prepare_qk_batch(qg[i], k[i], qn, kn, 1e-6, rope, batches[i], q[i], gate[i]);
                 },
                 [=, &ops] {
                   std::vector<OpOutput> r;
                   for (size_t i = 0; i < q.size(); ++i) {
                     r.push_back(close(ops, fmt::format("step{}.q", i), q[i], kF32, kF32));
                     r.push_back(close(ops, fmt::format("step{}.k", i), k[i], kF32, kF32));
                     r.push_back(exact_f32(ops, fmt::format("step{}.gate", i), gate[i]));
                   }
                   return r;
                 }};
  };
  return c;
}

OpCase qsa_indexer_select_batch_case(int64_t ni, int64_t Di, int64_t budget, int64_t block, const StepPlan& plan,
                                     int64_t zero_every, Weights wk) {
  OpCase c;
  c.name = fmt::format("qsa_indexer_select_batch/ni={}/Di={}/budget={}/block={}/page={}/{}{}", ni, Di, budget, block,
                       plan.page, plan.describe(), zero_every ? fmt::format("/zero_every={}", zero_every) : "");
  c.family = OpFamily::Qsa;
  const int64_t width = budget + block - 1;
  {
    double blocks = 0, seq_reads = 0;
    for (size_t s = 0; s < plan.context.size(); ++s) {
      int64_t pos = plan.context[s];
      for (const auto& step : plan.steps) {
        for (int64_t t = 0; t < step[s]; ++t, ++pos) blocks += double((pos + 1) / block);
        if (step[s] > 0) seq_reads += double(pos / block);  // the sequence's pooled keys, read once per step
      }
    }
    const int64_t T = plan_tokens(plan);
    c.bytes = kW * double(2 * Di) + kF * (double(T * (ni * Di + Di + width)) + seq_reads * double(Di));
    c.flops = 2.0 * double(ni * Di) * blocks;
  }
  c.build = [=](Ops& ops, uint64_t seed) {
    FN_CHECK(wk == Weights::DeviceRandom ||
                 std::all_of(plan.context.begin(), plan.context.end(), [](int64_t x) { return x == 0; }),
             "qsa_indexer_select_batch case: test plans start at position 0");
    Gen g(ops, seed, wk);
    const Paging p = make_paging(plan);
    const RopeParams rope{std::min<int64_t>(64, Di), 10000000.0};
    Tensor qn = g.weight({Di}, 0.2f), kn = g.weight({Di}, 0.2f);
    const int64_t rows = p.num_blocks * p.page;
    // Test plans fill the pools through their steps (zeros first); perf plans start from random keys.
    Tensor key_pool = wk == Weights::DeviceRandom ? g.act({rows, Di}) : ops.zeros({rows, Di});
    Tensor pooled = wk == Weights::DeviceRandom ? g.act({rows / block, Di}) : ops.zeros({rows / block, Di});
    std::vector<Tensor> qi, ki, sel;
    std::vector<StepBatch> batches;
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      const int64_t n = step_tokens(plan, i);
      std::vector<float> q = g.values(n * ni * Di, 1.f);
      if (zero_every > 0)
        for (int64_t t = 0; t < n; t += zero_every) std::fill_n(q.begin() + t * ni * Di, ni * Di, 0.f);
      qi.push_back(ops.upload(q.data(), DType::F32, {n, ni * Di}));
      ki.push_back(g.act({n, Di}));
      sel.push_back(ops.empty({n, width}, DType::I32));
      batches.push_back(plan_step(ops, plan, p, i));
    }
    return OpRun{[=, &ops] {
                   for (size_t i = 0; i < qi.size(); ++i) {
                     ops.scatter_rows(ki[i], batches[i].slot_mapping, key_pool);
                     ops.qsa_indexer_select_batch(qi[i], key_pool, pooled, qn, kn, 1e-6, rope, budget, block,
                                                  batches[i], sel[i]);
                   }
                 },
                 [=, &ops] {
                   std::vector<OpOutput> r;
                   for (size_t i = 0; i < sel.size(); ++i)
                     r.push_back(row_sets(ops, fmt::format("step{}.selected", i), sel[i]));
                   return r;
                 }};
  };
  return c;
}

OpCase sparse_attention_batch_case(int64_t nh, int64_t nkv, int64_t D, int64_t budget, int64_t block,
                                   const StepPlan& plan) {
  OpCase c;
  c.name = fmt::format("sparse_attention_batch/nh={}/nkv={}/D={}/budget={}/block={}/page={}/{}", nh, nkv, D, budget,
                       block, plan.page, plan.describe());
  c.family = OpFamily::Qsa;
  const int64_t width = budget + block - 1;
  {
    double selected = 0;
    for (size_t s = 0; s < plan.context.size(); ++s) {
      int64_t pos = plan.context[s];
      for (const auto& step : plan.steps)
        for (int64_t t = 0; t < step[s]; ++t, ++pos) {
          const int64_t nb = (pos + 1) / block;
          selected += double(std::min(nb, budget / block) * block + (pos + 1 - nb * block));
        }
    }
    const int64_t T = plan_tokens(plan);
    c.bytes = kF * (double(T * (3 * nh * D + width)) + 2 * selected * double(nkv * D));
    c.flops = 4.0 * double(nh * D) * selected;
  }
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    const Paging p = make_paging(plan);
    const int64_t rows = p.num_blocks * p.page;
    Tensor k_pool = g.act({rows, nkv, D}), v_pool = g.act({rows, nkv, D});
    std::vector<Tensor> q, gate, sel, out;
    std::vector<StepBatch> batches;
    std::vector<int64_t> pos(plan.context);
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      const int64_t n = step_tokens(plan, i);
      q.push_back(g.act({n, nh, D}));
      gate.push_back(g.act({n, nh, D}, 2.f));
      out.push_back(ops.empty({n, nh, D}));
      // Per query at position p: min(budget/block, nb) distinct random blocks, then the tail, padded with -1.
      std::vector<int32_t> s_host;
      for (size_t s = 0; s < plan.context.size(); ++s) {
        for (int64_t t = 0; t < plan.steps[i][s]; ++t, ++pos[s]) {
          const int64_t at = pos[s], nb = (at + 1) / block, keep = std::min(nb, budget / block);
          std::vector<int32_t> blocks(static_cast<size_t>(nb));
          std::iota(blocks.begin(), blocks.end(), 0);
          for (int64_t j = 0; j < keep; ++j) std::swap(blocks[size_t(j)], blocks[size_t(j + g.index(nb - j))]);
          std::vector<int32_t> row;
          for (int64_t j = 0; j < keep; ++j)
            for (int64_t e = 0; e < block; ++e) row.push_back(int32_t(blocks[size_t(j)] * block + e));
          for (int64_t e = nb * block; e <= at; ++e) row.push_back(int32_t(e));
          row.resize(size_t(width), -1);
          s_host.insert(s_host.end(), row.begin(), row.end());
        }
      }
      sel.push_back(g.i32(s_host, {n, width}));
      batches.push_back(plan_step(ops, plan, p, i));
    }
    const double scale = 1.0 / std::sqrt(double(D));
    return OpRun{[=, &ops] {
                   for (size_t i = 0; i < q.size(); ++i)
                     ops.sparse_attention_batch(q[i], k_pool, v_pool, sel[i], gate[i], scale, batches[i], out[i]);
                 },
                 [=, &ops] {
                   std::vector<OpOutput> r;
                   for (size_t i = 0; i < out.size(); ++i)
                     r.push_back(close(ops, fmt::format("step{}.out", i), out[i], kRule, kRule));
                   return r;
                 }};
  };
  return c;
}

// ---------------------------------------------------------------- MoE

OpCase moe_router_topk_case(int64_t T, int64_t H, int64_t E, int64_t k, bool norm, Weights wk) {
  OpCase c;
  c.name = fmt::format("moe_router_topk/T={}/H={}/E={}/k={}{}", T, H, E, k, norm ? "/norm" : "");
  c.family = OpFamily::Moe;
  c.bytes = kW * double(E * H) + kF * double(T * (H + 2 * k));
  c.flops = 2.0 * double(T) * double(E * H);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    Tensor u = g.act({T, H}), router = g.weight({E, H}, float(std::sqrt(3.0 / double(H))));
    Tensor ids = ops.empty({T, k}, DType::I32), weights = ops.empty({T, k});
    return OpRun{[=, &ops] { ops.moe_router_topk(u, router, norm, ids, weights); },
                 [=, &ops] {
                   return std::vector<OpOutput>{exact_i32(ops, "ids", ids), close(ops, "weights", weights, kF32, kF32)};
                 }};
  };
  return c;
}

namespace {

/// Host routing of T tokens over E experts: k distinct ids per token, positive weights summing to 1. Returns the
/// number of distinct experts used.
int64_t host_routing(Gen& g, int64_t T, int64_t E, int64_t k, std::vector<int32_t>& ids, std::vector<float>& w) {
  ids.assign(size_t(T * k), 0);
  w.assign(size_t(T * k), 0.f);
  std::vector<bool> used(size_t(E), false);
  const std::vector<float> r = g.values(T * k, 1.f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(E));
    std::iota(all.begin(), all.end(), 0);
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      std::swap(all[size_t(j)], all[size_t(j + g.index(E - j))]);
      ids[size_t(t * k + j)] = all[size_t(j)];
      used[size_t(all[size_t(j)])] = true;
      w[size_t(t * k + j)] = 1.5f + r[size_t(t * k + j)];
      sum += w[size_t(t * k + j)];
    }
    for (int64_t j = 0; j < k; ++j) w[size_t(t * k + j)] /= sum;
  }
  return std::count(used.begin(), used.end(), true);
}

/// The shared expert's weights (gate / up [Is, H], down [H, Is], shared_expert_gate [1, H]) set in `w`.
void shared_expert_weights(Gen& g, int64_t H, int64_t Is, MoeWeights& w) {
  w.shared_gate_proj = g.weight({Is, H}, float(std::sqrt(3.0 / double(H))));
  w.shared_up_proj = g.weight({Is, H}, float(std::sqrt(3.0 / double(H))));
  w.shared_down_proj = g.weight({H, Is}, float(std::sqrt(3.0 / double(Is))));
  w.shared_expert_gate = g.weight({1, H}, float(std::sqrt(3.0 / double(H))));
}

/// The routed-experts case body shared by the dense, quantized and random forms: routing made on the host, then
/// moe_experts with `w`. With `shared` also a shared expert of width I: moe_shared_expert_start first, its term
/// given to moe_experts (the MoE block after its router, as the model runs it).
OpRun experts_run(Ops& ops, Gen& g, int64_t T, int64_t H, int64_t E, int64_t k, int64_t I, bool shared, MoeWeights w,
                  Bound fp16x2, Bound fp16) {
  std::vector<int32_t> id;
  std::vector<float> wt;
  host_routing(g, T, E, k, id, wt);
  Tensor u = g.act({T, H}), ids = g.i32(id, {T, k}), weights = ops.upload(wt.data(), DType::F32, {T, k});
  Tensor out = ops.empty({T, H});
  if (!shared)
    return OpRun{[=, &ops] { ops.moe_experts(u, ids, weights, w, out); },
                 [=, &ops] { return std::vector<OpOutput>{close(ops, "out", out, fp16x2, fp16)}; }};
  shared_expert_weights(g, H, I, w);
  Tensor s = ops.empty({T, H});
  return OpRun{[=, &ops] {
                 ops.moe_shared_expert_start(u, w, s);
                 ops.moe_experts(u, ids, weights, w, out, s);
               },
               [=, &ops] { return std::vector<OpOutput>{close(ops, "out", out, fp16x2, fp16)}; }};
}

/// A case name's suffix and the bytes of the shared expert (width I) when the case has one.
std::string shared_suffix(bool shared) {
  return shared ? "/shared" : "";
}
double shared_bytes(bool shared, int64_t H, int64_t I) {
  return shared ? kW * double(3 * H * I + H) + kF * double(H) : 0.0;
}

/// Bytes of the routed experts a T-token step touches: min(E, T*k) experts (all of them once T*k >= E).
double expert_bytes(int64_t T, int64_t E, int64_t k, int64_t H, int64_t I, double bytes_per_weight) {
  return double(std::min(E, T * k)) * 3.0 * double(H * I) * bytes_per_weight;
}

}  // namespace

OpCase moe_experts_case(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, Weights wk, bool shared) {
  OpCase c;
  c.name = fmt::format("moe_experts/dense/T={}/H={}/I={}/E={}/k={}{}", T, H, I, E, k, shared_suffix(shared));
  c.family = OpFamily::Moe;
  c.bytes = expert_bytes(T, E, k, H, I, kW) + kF * double(T * (2 * H + 2 * k)) + shared_bytes(shared, H, I);
  c.flops = 6.0 * double(T * k + (shared ? T : 0)) * double(H * I);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    MoeWeights w;
    w.gate = g.weight({E, I, H}, float(std::sqrt(3.0 / double(H))));
    w.up = g.weight({E, I, H}, float(std::sqrt(3.0 / double(H))));
    w.down = g.weight({E, H, I}, float(std::sqrt(3.0 / double(I))));
    return experts_run(ops, g, T, H, E, k, I, shared, w, Bound{1e-4, 2e-4}, kExperts16);
  };
  return c;
}

namespace {

/// Synthetic checkpoint arrays of one quantized matrix, owned, with the TensorViews the loader's dequantize reads.
struct QuantStore {
  std::vector<uint8_t> data, scale, global, zeros;
  TensorView v_data, v_scale, v_global, v_zeros;
  QuantizedWeight q;
};

/// A [rows, cols] matrix of format `kind` with random codes and scales of about 1/sqrt(cols) per weight.
std::shared_ptr<QuantStore> synth_quant(Gen& g, QuantFormat kind, int64_t rows, int64_t cols, const std::string& name) {
  auto s = std::make_shared<QuantStore>();
  auto bytes_of = [&](int64_t n) {  // n random bytes
    const std::vector<float> v = g.values(n, 1.f);
    std::vector<uint8_t> b(static_cast<size_t>(n));
    for (size_t i = 0; i < b.size(); ++i) b[i] = uint8_t(int((v[i] + 1.f) * 128.f) & 0xff);
    return b;
  };
  auto view = [](TensorView& v, const std::string& nm, DType dt, Shape shape, std::vector<uint8_t>& b) {
    v.name = nm;
    v.dtype = dt;
    v.shape = std::move(shape);
    v.data = b.data();
    v.nbytes = b.size();
    v.file = "(synthetic)";
  };
  s->q.name = name;
  s->q.rows = rows;
  s->q.cols = cols;
  const float target = float(1.0 / std::sqrt(double(cols)));
  if (kind == QuantFormat::Nvfp4) {
    s->q.format = QuantFormat::Nvfp4;
    s->q.group = 16;
    s->data = bytes_of(rows * cols / 2);
    s->scale = bytes_of(rows * cols / 16);
    for (uint8_t& b : s->scale) b = uint8_t(0x30 + (b & 0x0f));  // E4M3 in [0.5, 1.9]
    const float global = target / 2.f;                           // |e2m1| averages about 2
    s->global.resize(4);
    std::memcpy(s->global.data(), &global, 4);
    view(s->v_data, name, DType::U8, {rows, cols / 2}, s->data);
    view(s->v_scale, name + "_scale", DType::F8_E4M3, {rows, cols / 16}, s->scale);
    view(s->v_global, name + "_scale_2", DType::F32, {}, s->global);
    s->q.data = &s->v_data;
    s->q.scale = &s->v_scale;
    s->q.global_scale = &s->v_global;
  } else {
    const int64_t group = 32, G = (cols + group - 1) / group;
    s->q.group = group;
    // BF16 scales of one binade (exact in the CUDA repacking's FP16 after its power-of-two row scale).
    std::vector<uint16_t> sc;
    const std::vector<float> u = g.values(rows * G, 1.f);
    for (float x : u) sc.push_back(float_to_bf16(target / 4.f * (1.5f + 0.45f * x)));
    s->scale.resize(sc.size() * 2);
    std::memcpy(s->scale.data(), sc.data(), s->scale.size());
    if (kind == QuantFormat::CtInt4) {  // symmetric: q - 8
      s->q.format = QuantFormat::CtInt4;
      s->data = bytes_of(rows * ((cols + 7) / 8) * 4);
      view(s->v_data, name + "_packed", DType::I32, {rows, (cols + 7) / 8}, s->data);
      view(s->v_scale, name + "_scale", DType::BF16, {rows, G}, s->scale);
    } else {  // GPTQ v1: qweight [K/8, N], scales [G, N], qzeros [G, N/8]
      FN_CHECK(kind == QuantFormat::Gptq, "moe_quantized_experts_case: unsupported format");
      s->q.format = QuantFormat::Gptq;
      s->data = bytes_of(cols / 8 * rows * 4);
      s->zeros = bytes_of(G * rows / 8 * 4);
      for (size_t i = 0; i < s->zeros.size(); ++i) s->zeros[i] = uint8_t(0x77);  // stored 7 (+1 in v1): zero 8
      view(s->v_data, name + ".qweight", DType::I32, {cols / 8, rows}, s->data);
      // scales [G, N]: reuse the [N, G] draws transposed is not needed; the values are i.i.d.
      view(s->v_scale, name + ".scales", DType::BF16, {G, rows}, s->scale);
      view(s->v_zeros, name + ".qzeros", DType::I32, {G, rows / 8}, s->zeros);
      s->q.zero_point = &s->v_zeros;
    }
    s->q.data = &s->v_data;
    s->q.scale = &s->v_scale;
  }
  return s;
}

QuantMatrix quant_matrix(const std::shared_ptr<QuantStore>& s, QuantFormat kind) {
  auto arr = [](const TensorView* v) { return v ? HostArray{v->data, v->dtype, v->shape} : HostArray{}; };
  QuantMatrix m;
  m.format = kind;
  m.name = s->q.name;
  m.rows = s->q.rows;
  m.cols = s->q.cols;
  m.group = s->q.group;
  m.data = arr(s->q.data);
  m.scale = arr(s->q.scale);
  m.global_scale = arr(s->q.global_scale);
  m.zero_point = arr(s->q.zero_point);
  m.dequantize = [s] { return dequantize(s->q); };
  return m;
}

const char* quant_kind_name(QuantFormat k) {
  switch (k) {
    case QuantFormat::Nvfp4:
      return "nvfp4";
    case QuantFormat::CtNvfp4:
      return "ct-nvfp4";
    case QuantFormat::Fp8Block:
      return "fp8-block";
    case QuantFormat::CtInt4:
      return "ct-int4-g32";
    case QuantFormat::Gptq:
      return "gptq-int4-g32";
    case QuantFormat::Awq:
      return "awq-int4";
    case QuantFormat::CtInt8:
      return "ct-int8";
    case QuantFormat::CtFp8:
      return "ct-fp8";
    case QuantFormat::None:
      return "none";
  }
  return "?";
}

}  // namespace

OpCase moe_quantized_experts_case(QuantFormat kind, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k,
                                  bool shared) {
  OpCase c;
  c.name = fmt::format("moe_experts/{}/T={}/H={}/I={}/E={}/k={}{}", quant_kind_name(kind), T, H, I, E, k,
                       shared_suffix(shared));
  c.family = OpFamily::Moe;
  c.bytes = expert_bytes(T, E, k, H, I, 4.5 / 8) + kF * double(T * (2 * H + 2 * k)) + shared_bytes(shared, H, I);
  c.flops = 6.0 * double(T * k + (shared ? T : 0)) * double(H * I);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    QuantExperts q;
    q.name = "op_cases.experts";
    q.experts = E;
    q.hidden = H;
    q.inter = I;
    for (int64_t e = 0; e < E; ++e) {
      q.gate.push_back(quant_matrix(synth_quant(g, kind, I, H, fmt::format("experts.{}.gate_proj.weight", e)), kind));
      q.up.push_back(quant_matrix(synth_quant(g, kind, I, H, fmt::format("experts.{}.up_proj.weight", e)), kind));
      q.down.push_back(quant_matrix(synth_quant(g, kind, H, I, fmt::format("experts.{}.down_proj.weight", e)), kind));
    }
    const RoutedExperts r = ops.load_quantized_experts(q);
    MoeWeights w;
    w.gate = r.gate, w.up = r.up, w.down = r.down, w.packed = r.packed;
    return experts_run(ops, g, T, H, E, k, I, shared, w, kExpertsW4, kExpertsW4);
  };
  return c;
}

OpCase moe_random_experts_case(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, bool shared) {
  OpCase c;
  c.name = fmt::format("moe_experts/random_experts/T={}/H={}/I={}/E={}/k={}{}", T, H, I, E, k, shared_suffix(shared));
  c.family = OpFamily::Moe;
  c.bytes = expert_bytes(T, E, k, H, I, 4.5 / 8) + kF * double(T * (2 * H + 2 * k)) + shared_bytes(shared, H, I);
  c.flops = 6.0 * double(T * k + (shared ? T : 0)) * double(H * I);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::DeviceRandom);
    const RoutedExperts r = ops.random_experts(E, I, H, seed);
    MoeWeights w;
    w.gate = r.gate, w.up = r.up, w.down = r.down, w.packed = r.packed;
    return experts_run(ops, g, T, H, E, k, I, shared, w, kExpertsW4, kExpertsW4);
  };
  return c;
}

OpCase moe_shared_expert_case(int64_t T, int64_t H, int64_t Is, Weights wk) {
  OpCase c;
  c.name = fmt::format("moe_shared_expert/T={}/H={}/Is={}", T, H, Is);
  c.family = OpFamily::Moe;
  c.bytes = kW * double(3 * H * Is + H) + kF * double(3 * T * H);
  c.flops = 2.0 * double(T) * double(3 * H * Is + H);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    MoeWeights w;
    shared_expert_weights(g, H, Is, w);
    Tensor u = g.act({T, H}), out = g.act({T, H});  // accumulated onto the routed output
    return OpRun{[=, &ops] { ops.moe_shared_expert(u, w, out); },
                 [=, &ops] { return std::vector<OpOutput>{close(ops, "out", out, kF32, kExperts16)}; }};
  };
  return c;
}

OpCase moe_shared_expert_w8_case(int64_t T, int64_t H, int64_t Is, DType code) {
  OpCase c;
  c.name = fmt::format("moe_shared_expert/T={}/H={}/Is={}/w8={}", T, H, Is, code == DType::I8 ? "i8-row" : "fp8-row");
  c.family = OpFamily::Moe;
  c.bytes = double(3 * H * Is) + kW * double(H) + kF * double(3 * T * H);
  c.flops = 2.0 * double(T) * double(3 * H * Is + H);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    MoeWeights w;
    w.shared_gate_proj = g.w8_weight({Is, H}, float(std::sqrt(3.0 / double(H))), code, H);
    w.shared_up_proj = g.w8_weight({Is, H}, float(std::sqrt(3.0 / double(H))), code, H);
    w.shared_down_proj = g.w8_weight({H, Is}, float(std::sqrt(3.0 / double(Is))), code, Is);
    w.shared_expert_gate = g.weight({1, H}, float(std::sqrt(3.0 / double(H))));
    Tensor u = g.act({T, H}), out = g.act({T, H});
    return OpRun{[=, &ops] { ops.moe_shared_expert(u, w, out); },
                 [=, &ops] { return std::vector<OpOutput>{close(ops, "out", out, kF32, kExperts16)}; }};
  };
  return c;
}

// ---------------------------------------------------------------- PLE

OpCase ple_gather_case(int64_t T, int64_t heads, int64_t hd, int64_t rows, DType dtype, int64_t shards,
                       TableSource source, bool ahead, int64_t group, DType scales_dtype) {
  OpCase c;
  c.name =
      fmt::format("ple_gather/T={}/heads={}/hd={}/rows={}/{}{}/shards={}/{}{}", T, heads, hd, rows, dtype_name(dtype),
                  group > 0 ? fmt::format("-g{}-{}-scales", group, dtype_name(scales_dtype)) : std::string(), shards,
                  source == TableSource::MapHost ? "map_host_table" : "host_table", ahead ? "/ahead" : "");
  c.family = OpFamily::Ple;
  c.bytes = double(T * heads * hd) * (double(dtype_size(dtype)) + kF) + 8.0 * double(T * heads) +
            (group > 0 ? double(T * heads * (hd / group) * int64_t(dtype_size(scales_dtype))) : 0.0);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    const size_t es = dtype_size(dtype);
    // Table bytes: float values of scale 1 in the dtype; FP8: random finite E4M3 bytes (no NaN pattern).
    auto bytes = std::make_shared<std::vector<uint8_t>>(size_t(rows * hd) * es);
    {
      const std::vector<float> v = g.values(rows * hd, 1.f);
      for (size_t i = 0; i < v.size(); ++i) {
        uint8_t* p = bytes->data() + i * es;
        if (dtype == DType::F32) {
          std::memcpy(p, &v[i], 4);
        } else if (dtype == DType::I8) {
          *p = uint8_t(int8_t(std::lround(v[i] * 127.f)));  // v in [-1, 1]: every code, -127..127
        } else if (dtype == DType::BF16 || dtype == DType::F16) {
          const uint16_t h = dtype == DType::BF16 ? float_to_bf16(v[i]) : float_to_f16(v[i]);
          std::memcpy(p, &h, 2);
        } else {
          FN_CHECK(dtype == DType::F8_E4M3, "ple_gather_case: dtype {}", dtype_name(dtype));
          const uint8_t b = uint8_t(int((v[i] + 1.f) * 128.f) & 0xff);
          *p = (b & 0x7f) == 0x7f ? uint8_t(b ^ 0x01) : b;  // S.1111.111 is NaN
        }
      }
    }
    // I8 tables: group scales of both signs and many magnitudes, stored in scales_dtype.
    const int64_t groups = group > 0 ? hd / group : 0;
    const size_t ss = dtype_size(scales_dtype);
    auto scale_bytes = std::make_shared<std::vector<uint8_t>>(size_t(rows * groups) * ss);
    {
      const std::vector<float> v = g.values(rows * groups, 1.f);
      for (size_t i = 0; i < v.size(); ++i) {
        const float f = v[i] * std::ldexp(1.f, int(i % 13) - 6);
        uint8_t* p = scale_bytes->data() + i * ss;
        if (scales_dtype == DType::F32) {
          std::memcpy(p, &f, 4);
        } else {
          const uint16_t h = scales_dtype == DType::BF16 ? float_to_bf16(f) : float_to_f16(f);
          std::memcpy(p, &h, 2);
        }
      }
    }
    PleTable table;
    table.rows = rows;
    table.head_dim = hd;
    table.scale = dtype == DType::F8_E4M3 ? 0.5f : 1.f;
    table.group = group;
    for (int64_t k = 0; k < shards; ++k) {
      const int64_t r0 = rows * k / shards, r1 = rows * (k + 1) / shards;
      const uint8_t* src = bytes->data() + size_t(r0 * hd) * es;
      if (group > 0)
        table.group_scales.push_back(ops.map_host_table(scale_bytes->data() + size_t(r0 * groups) * ss, scales_dtype,
                                                        {r1 - r0, groups}, scale_bytes));
      if (source == TableSource::MapHost) {
        table.shards.push_back(ops.map_host_table(src, dtype, {r1 - r0, hd}, bytes));
      } else {
        HostTable h = ops.host_table(dtype, {r1 - r0, hd});
        std::memcpy(h.host, src, size_t((r1 - r0) * hd) * es);
        table.shards.push_back(h.table);
      }
    }
    std::vector<int64_t> r(static_cast<size_t>(T * heads));
    for (auto& x : r) x = g.index(rows);
    if (T > 0) r[0] = rows - 1;  // the last row of the last shard
    Tensor row_ids = g.i64(r, {T, heads}), e = ops.empty({T, heads * hd});
    if (!ahead)
      return OpRun{[=, &ops] { ops.ple_gather(table, row_ids, e); },
                   [=, &ops] { return std::vector<OpOutput>{exact_f32(ops, "e", e)}; }};
    Tensor x = g.act({64, 64}), w = g.weight({64, 64}, 0.2f), y = ops.empty({64, 64});  // work in between
    return OpRun{[=, &ops] {
                   ops.ple_gather_start(table, row_ids, e);
                   ops.linear(x, w, y);
                   ops.ple_gather_wait(e);
                 },
                 [=, &ops] { return std::vector<OpOutput>{exact_f32(ops, "e", e)}; }};
  };
  return c;
}

OpCase ple_gate_case(int64_t T, int64_t S, int64_t H, Weights wk) {
  OpCase c;
  c.name = fmt::format("ple_gate/T={}/S={}/H={}", T, S, H);
  c.family = OpFamily::Ple;
  c.bytes = kW * double(S * H) + kF * double(T * (3 * S * H + H));
  c.flops = 8.0 * double(T * S * H);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    Tensor kn = g.act({T, S * H}), v = g.act({T, H}), X = g.act({T, S * H}, 2.f), nq = g.weight({S * H}, 0.2f);
    Tensor P = ops.empty({T, S * H});
    return OpRun{[=, &ops] { ops.ple_gate(kn, v, X, nq, 1e-6, P); },
                 [=, &ops] { return std::vector<OpOutput>{close(ops, "P", P, kF32, kF32)}; }};
  };
  return c;
}

OpCase ple_conv_add_batch_case(int64_t S, int64_t H, int64_t K, int64_t dilation, const StepPlan& plan, Weights wk) {
  OpCase c;
  const int64_t SH = S * H, L = (K - 1) * dilation;
  c.name = fmt::format("ple_conv_add_batch/S={}/H={}/K={}/dilation={}/{}", S, H, K, dilation, plan.describe());
  c.family = OpFamily::Ple;
  const int64_t T = plan_tokens(plan);
  c.bytes = kW * double(SH * (K + 1)) + kF * double(3 * T * SH + 2 * plan_seq_steps(plan) * L * SH);
  c.flops = double(T * SH) * (2.0 * double(K) + 10.0);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, wk);
    const Paging p = make_paging(plan);
    Tensor norm = g.weight({SH}, 0.2f), conv = g.weight({SH, K}, 0.5f), pool = g.act({p.num_slots, L, SH});
    std::vector<Tensor> P, X;
    std::vector<StepBatch> batches;
    for (size_t i = 0; i < plan.steps.size(); ++i) {
      P.push_back(g.act({step_tokens(plan, i), SH}));
      X.push_back(g.act({step_tokens(plan, i), SH}, 2.f));
      batches.push_back(plan_step(ops, plan, p, i));
    }
    return OpRun{[=, &ops] {
                   for (size_t i = 0; i < P.size(); ++i)
                     ops.ple_conv_add_batch(P[i], norm, H, conv, dilation, 1e-6, pool, batches[i], X[i]);
                 },
                 [=, &ops] {
                   std::vector<OpOutput> r;
                   for (size_t i = 0; i < X.size(); ++i)
                     r.push_back(close(ops, fmt::format("step{}.X", i), X[i], kF32, kF32));
                   r.push_back(close(ops, "state_pool", pool, kF32, kF32));
                   return r;
                 }};
  };
  return c;
}

// ---------------------------------------------------------------- sampling

OpCase sample_tokens_case(int64_t rows, int64_t V) {
  OpCase c;
  c.name = fmt::format("sample_tokens/greedy/rows={}/V={}", rows, V);
  c.family = OpFamily::Sampling;
  c.needs_device_sampling = true;
  c.bytes = kF * double(rows * V);
  c.build = [=](Ops& ops, uint64_t seed) {
    Gen g(ops, seed, Weights::HostFp16);
    std::vector<float> l = g.values(rows * V, 4.f);
    for (int64_t r = 0; r < rows; r += 2) {  // even rows: a tie at the maximum (greedy: the lower id wins)
      const int64_t a = g.index(V), b = g.index(V);
      l[size_t(r * V + a)] = l[size_t(r * V + b)] = 100.f;
    }
    Tensor logits = ops.upload(l.data(), DType::F32, {rows, V});
    std::vector<TokenSampling> params(static_cast<size_t>(rows));
    // Odd rows r = 1 mod 4: temperature 0.7 with top-k 1 (no tie there, so the one survivor is the argmax).
    for (int64_t r = 1; r < rows; r += 4) params[size_t(r)] = TokenSampling{0.7f, 1, 1.f, 0.f, uint64_t(r), 3};
    auto ids = std::make_shared<std::vector<int32_t>>();
    return OpRun{[=, &ops] {
                   if (ops.samples_on_device()) {
                     *ids = ops.sample_tokens(logits, params);
                     return;
                   }
                   // The oracle: greedy (and top-k 1) is the argmax, lowest id among equal maxima.
                   ids->assign(size_t(rows), 0);
                   for (int64_t r = 0; r < rows; ++r)
                     (*ids)[size_t(r)] =
                         int32_t(std::max_element(l.begin() + r * V, l.begin() + (r + 1) * V) - (l.begin() + r * V));
                 },
                 [=] {
                   OpOutput o;
                   o.name = "ids";
                   o.compare = Compare::Exact;
                   o.ints = *ids;
                   return std::vector<OpOutput>{o};
                 }};
  };
  return c;
}

}  // namespace flashnext::opcases
