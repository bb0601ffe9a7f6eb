// CPU backend: memory, dense building blocks and hyper-connections.
#include "ops/cpu/cpu_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "ops/contract/dense.h"
#include "ops/contract/hc.h"
#include "ops/contract/memory.h"
#include "ops/cpu/kernels.h"

namespace flashnext {

std::shared_ptr<Ops> make_cpu_ops(int threads) {
  return std::make_shared<cpu::CpuOps>(threads);
}

namespace cpu {

Tensor slot_view(const Tensor& pool, int64_t slot) {
  Shape inner(pool.shape().begin() + 1, pool.shape().end());
  return pool.rows(slot, slot + 1).view(inner);
}

Tensor seq_rows(const Tensor& t, const StepBatch& batch, int64_t s) {
  return t.rows(batch.cu_seqlens[size_t(s)], batch.cu_seqlens[size_t(s) + 1]);
}

namespace {

Tensor alloc(const Shape& shape, DType dtype) {
  for (auto d : shape) FN_CHECK(d >= 0, "cpu: negative dimension in shape [{}]", fmt::join(shape, ", "));
  const size_t bytes = std::max<size_t>(size_t(shape_numel(shape)) * dtype_size(dtype), 1);
  // 64-byte aligned storage; the deleter frees it when the last Tensor handle goes away.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) fail("cpu: out of memory allocating {} bytes for a {} tensor", bytes, dtype_name(dtype));
  std::shared_ptr<void> owner(p, [](void* q) { std::free(q); });
  return Tensor(std::move(owner), p, dtype, shape, Device::CPU);
}

}  // namespace

CpuOps::CpuOps(int threads) : pool_(threads) {}

std::string CpuOps::name() const {
  return fmt::format("cpu ({} threads)", pool_.size());
}

Tensor CpuOps::empty(const Shape& shape, DType dtype) {
  return alloc(shape, dtype);
}

Tensor CpuOps::zeros(const Shape& shape, DType dtype) {
  Tensor t = alloc(shape, dtype);
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor CpuOps::upload(const void* host, DType dtype, const Shape& shape) {
  Tensor t = alloc(shape, dtype);
  if (t.nbytes()) std::memcpy(t.data(), host, t.nbytes());
  return t;
}

void CpuOps::download(const Tensor& t, void* host) {
  FN_CHECK(t.device() == Device::CPU, "download: tensor {} is not on the CPU", t.str());
  if (t.nbytes()) std::memcpy(host, t.data(), t.nbytes());
}

Tensor CpuOps::load_weight(const void* host, DType dtype, const Shape& shape) {
  contract::load_weight(dtype);
  Tensor t = alloc(shape, DType::F32);
  convert_to_float(dtype, host, mp(t), size_t(t.numel()));
  return t;
}

Tensor CpuOps::map_host_table(const void* host, DType dtype, const Shape& shape,
                              std::shared_ptr<const void> keepalive) {
  FN_CHECK(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32 || dtype == DType::F8_E4M3 ||
               dtype == DType::F8_E5M2 || dtype == DType::I8,
           "map_host_table: table must be BF16, F16, F32, FP8 (E4M3 / E5M2) or I8, got {}", dtype_name(dtype));
  std::shared_ptr<void> owner(std::const_pointer_cast<void>(std::move(keepalive)));
  return Tensor(std::move(owner), const_cast<void*>(host), dtype, shape, Device::CPU);
}

void CpuOps::copy_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t n) {
  const size_t row = contract::copy_rows(kCpu, src, src_row, dst, dst_row, n);
  if (row)
    std::memmove(static_cast<uint8_t*>(dst.data()) + size_t(dst_row) * row,
                 static_cast<const uint8_t*>(src.data()) + size_t(src_row) * row, size_t(n) * row);
}

void CpuOps::fill_zero(const Tensor& t) {
  FN_CHECK(t.device() == Device::CPU, "fill_zero: tensor {} is not on the CPU", t.str());
  if (t.nbytes()) std::memset(t.data(), 0, t.nbytes());
}

namespace {
/// The contract of gather_rows / scatter_rows plus the row ids, which the CPU checks before copying.
size_t check_row_map(const char* op, const Tensor& indexed, const Tensor& rows, const Tensor& packed) {
  const size_t row = contract::row_map(kCpu, op, indexed, rows, packed);
  const int32_t* r = rows.data_as<const int32_t>();
  for (int64_t i = 0; i < rows.dim(0); ++i)
    FN_CHECK(r[i] >= 0 && r[i] < indexed.dim(0), "{}: row id {} at index {} is outside [0, {})", op, r[i], i,
             indexed.dim(0));
  return row;
}
}  // namespace

void CpuOps::gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) {
  const size_t row = check_row_map("gather_rows", src, rows, dst);
  const int32_t* r = rows.data_as<const int32_t>();
  for (int64_t i = 0; i < rows.dim(0); ++i)
    std::memcpy(static_cast<uint8_t*>(dst.data()) + size_t(i) * row,
                static_cast<const uint8_t*>(src.data()) + size_t(r[i]) * row, row);
}

void CpuOps::scatter_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) {
  const size_t row = check_row_map("scatter_rows", dst, rows, src);
  const int32_t* r = rows.data_as<const int32_t>();
  for (int64_t i = 0; i < rows.dim(0); ++i)
    std::memcpy(static_cast<uint8_t*>(dst.data()) + size_t(r[i]) * row,
                static_cast<const uint8_t*>(src.data()) + size_t(i) * row, row);
}

// ------------------------------------------------------------------------------------------------ dense

void CpuOps::embedding(const Tensor& table, const Tensor& ids, const Tensor& out) {
  const auto [V, H, T, reps] = contract::embedding(kCpu, table, ids, out);
  const int32_t* id = ids.data_as<const int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    FN_CHECK(id[t] >= 0 && id[t] < V, "embedding: token id {} at position {} is outside the vocabulary [0, {})", id[t],
             t, V);
    for (int64_t r = 0; r < reps; ++r) std::memcpy(mp(out) + (t * reps + r) * H, fp(table) + id[t] * H, H * 4);
  }
}

namespace {

// y[t, o] for tokens t0, t0+1 and rows o .. o+3: 2 x 4 dot products sharing their loads (8 accumulators of 4
// lanes); `in` must be a multiple of 4. GCC/Clang vector extensions, so it vectorises without intrinsics.
typedef float v4 __attribute__((vector_size(16)));

inline v4 load4(const float* p) {
  v4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline float hsum(v4 v) {
  return (v[0] + v[2]) + (v[1] + v[3]);
}

void tile_2x4(const float* x0, const float* x1, const float* w, int64_t in, float* y0, float* y1) {
  v4 a00 = {}, a01 = {}, a02 = {}, a03 = {}, a10 = {}, a11 = {}, a12 = {}, a13 = {};
  const float *w0 = w, *w1 = w + in, *w2 = w + 2 * in, *w3 = w + 3 * in;
  for (int64_t i = 0; i < in; i += 4) {
    const v4 p = load4(x0 + i), q = load4(x1 + i);
    const v4 b0 = load4(w0 + i), b1 = load4(w1 + i), b2 = load4(w2 + i), b3 = load4(w3 + i);
    a00 += p * b0, a01 += p * b1, a02 += p * b2, a03 += p * b3;
    a10 += q * b0, a11 += q * b1, a12 += q * b2, a13 += q * b3;
  }
  y0[0] = hsum(a00), y0[1] = hsum(a01), y0[2] = hsum(a02), y0[3] = hsum(a03);
  y1[0] = hsum(a10), y1[1] = hsum(a11), y1[2] = hsum(a12), y1[3] = hsum(a13);
}

// y[t, o .. o+3] for one token (the decode case): 4 dot products sharing the loads of x.
void tile_1x4(const float* x0, const float* w, int64_t in, float* y0) {
  v4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  const float *w0 = w, *w1 = w + in, *w2 = w + 2 * in, *w3 = w + 3 * in;
  for (int64_t i = 0; i < in; i += 4) {
    const v4 p = load4(x0 + i);
    a0 += p * load4(w0 + i), a1 += p * load4(w1 + i), a2 += p * load4(w2 + i), a3 += p * load4(w3 + i);
  }
  y0[0] = hsum(a0), y0[1] = hsum(a1), y0[2] = hsum(a2), y0[3] = hsum(a3);
}

}  // namespace

void CpuOps::matmul_nt(const float* x, int64_t T, int64_t in, const float* w, int64_t out, float* y) {
  if (T == 0 || out == 0) return;
  // Parallel over output features. Tokens in tiles of 8 so that a tile of x stays in cache while W streams; within
  // a tile, 2 tokens x 4 rows at a time through the register tile when `in` allows it, plain dots otherwise.
  const int64_t work_per_row = std::max<int64_t>(1, T * in);
  const int64_t grain = std::max<int64_t>(4, 65536 / work_per_row);
  const bool tiled = in % 4 == 0;
  pool_.parallel_for(out, grain, [&](int64_t o0, int64_t o1) {
    float r0[4], r1[4];
    for (int64_t t0 = 0; t0 < T; t0 += 8) {
      const int64_t t1 = std::min(T, t0 + 8);
      int64_t o = o0;
      if (tiled) {
        for (; o + 4 <= o1; o += 4) {
          int64_t t = t0;
          for (; t + 2 <= t1; t += 2) {
            tile_2x4(x + t * in, x + (t + 1) * in, w + o * in, in, r0, r1);
            for (int k = 0; k < 4; ++k) y[t * out + o + k] = r0[k], y[(t + 1) * out + o + k] = r1[k];
          }
          for (; t < t1; ++t) {
            tile_1x4(x + t * in, w + o * in, in, r0);
            for (int k = 0; k < 4; ++k) y[t * out + o + k] = r0[k];
          }
        }
      }
      for (; o < o1; ++o) {
        for (int64_t t = t0; t < t1; ++t) y[t * out + o] = dot(x + t * in, w + o * in, in);
      }
    }
  });
}

void CpuOps::linear(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& bias) {
  contract::linear(kCpu, x, w, y, bias);
  matmul_nt(fp(x), x.dim(0), x.dim(1), fp(w), w.dim(0), mp(y));
  if (bias.defined()) {
    for (int64_t t = 0; t < y.dim(0); ++t) {
      for (int64_t o = 0; o < y.dim(1); ++o) mp(y)[t * y.dim(1) + o] += fp(bias)[o];
    }
  }
}

void CpuOps::zc_rms_norm(const Tensor& x, const Tensor& w, int64_t group, double eps, const Tensor& y) {
  const auto [T, L, W] = contract::zc_rms_norm(kCpu, x, w, group, y);
  pool_.parallel_for(T, std::max<int64_t>(1, 4096 / L), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t g = 0; g < L; g += group) {
        zc_norm(fp(x) + t * L + g, fp(w) + g % W, group, float(eps), mp(y) + t * L + g);
      }
    }
  });
}

// ------------------------------------------------------------------------------------------------ hyper-connections

void CpuOps::hc_read(const Tensor& X, const HcWeights& hc, double eps, const Tensor& u, const Tensor& inj) {
  const auto [T, S, H, R, with_inject] = contract::hc_read(kCpu, X, hc, u, inj);
  const int64_t W = S * H;
  std::vector<float> N(static_cast<size_t>(T * W)), low(static_cast<size_t>(T * R)), m(static_cast<size_t>(T * W));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < S; ++b)
      zc_norm(fp(X) + t * W + b * H, fp(hc.norm) + b * H, H, float(eps), &N[t * W + b * H]);
  }
  matmul_nt(N.data(), T, W, fp(hc.down), R, low.data());
  for (auto& v : low) v = silu(v / float(S));
  matmul_nt(low.data(), T, R, fp(hc.up), W, m.data());
  for (int64_t t = 0; t < T; ++t) {
    float* ur = mp(u) + t * H;
    for (int64_t j = 0; j < H; ++j) {
      float s = 0;
      for (int64_t b = 0; b < S; ++b) s += sigmoid(m[t * W + b * H + j]) * N[t * W + b * H + j];
      ur[j] = s / float(S);
    }
  }
  if (with_inject) {
    matmul_nt(N.data(), T, W, fp(hc.inject), S, mp(inj));
    for (int64_t i = 0; i < T * S; ++i) mp(inj)[i] = 2.0f * sigmoid(mp(inj)[i] / float(S));
  }
}

void CpuOps::hc_inject(const Tensor& X, const Tensor& out, const Tensor& inj) {
  const auto [T, S, H] = contract::hc_inject(kCpu, X, out, inj);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < S; ++b) {
      const float w = fp(inj)[t * S + b];
      float* x = mp(X) + t * S * H + b * H;
      const float* o = fp(out) + t * H;
      for (int64_t j = 0; j < H; ++j) x[j] += o[j] * w;
    }
  }
}

Tensor CpuOps::gather_sequence(const Tensor& pool, const StepBatch& b, int64_t s, int64_t length) {
  std::vector<int32_t> rows(static_cast<size_t>(length));
  for (int64_t p = 0; p < length; ++p) rows[size_t(p)] = int32_t(b.cache_row(s, p));
  Shape shape = pool.shape();
  shape[0] = length;
  Tensor out = empty(shape, pool.dtype());
  gather_rows(pool, upload(rows.data(), DType::I32, {length}), out);
  return out;
}

}  // namespace cpu
}  // namespace flashnext
