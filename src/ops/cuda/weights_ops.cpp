// The CUDA backend's weights: FP16 conversion at load (with the range check), PLE host tables, random weights made
// on the device (flashnext bench), and the lossless W4A16 repacking of NVFP4 / int4 / 8-bit / FP8 routed experts.
#include <cuda_fp16.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "ops/contract/memory.h"
#include "ops/cuda/backend.h"
#include "ops/cuda/moe_kernels.h"
#include "ops/cuda/random_kernels.h"

namespace flashnext::cuda {

namespace {

/// An aligned copy of a little-endian checkpoint array (which may be unaligned in the mapping).
template <class T>
std::vector<T> host_copy(const HostArray& a) {
  std::vector<T> v(size_t(shape_numel(a.shape)));
  if (!v.empty()) std::memcpy(v.data(), a.data, v.size() * sizeof(T));
  return v;
}

/// A float copy of a BF16 / F16 / F32 checkpoint array (exact).
std::vector<float> float_copy(const HostArray& a, const std::string& what) {
  FN_CHECK(a.defined() && (a.dtype == DType::BF16 || a.dtype == DType::F16 || a.dtype == DType::F32),
           "load_quantized_experts: {} must be BF16, F16 or F32, got {}", what,
           a.defined() ? dtype_name(a.dtype) : "nothing");
  std::vector<float> v(size_t(shape_numel(a.shape)));
  convert_to_float(a.dtype, a.data, v.data(), v.size());
  return v;
}

/// The int4 plain form of a GPTQ (2-4 bits), AutoAWQ or compressed-tensors int4 checkpoint matrix [R, C].
Int4Plain int4_plain(const QuantMatrix& m, QuantFormat kind, bool zeros) {
  const char* op = "load_quantized_experts";
  FN_CHECK(m.data.dtype == DType::I32, "{}: int4 weight '{}' needs I32 packed codes", op, m.name);
  const int64_t R = m.rows, C = m.cols;
  const std::vector<int32_t> packed = host_copy<int32_t>(m.data);
  const std::vector<float> scales = float_copy(m.scale, "the scales of '" + m.name + "'");
  if (kind == QuantFormat::Gptq) {
    FN_CHECK(m.zero_point.defined() && m.zero_point.dtype == DType::I32, "{}: GPTQ weight '{}' needs I32 qzeros", op,
             m.name);
    const std::vector<int32_t> z = host_copy<int32_t>(m.zero_point);
    return unpack_gptq(packed.data(), z.data(), scales.data(), R, C, m.group, m.gptq_v2, int(m.bits));
  }
  FN_CHECK(m.zero_point.defined() == zeros && (!zeros || m.zero_point.dtype == DType::I32),
           "{}: '{}' {} {}, the first expert {}", op, m.name, m.zero_point.defined() ? "has" : "lacks",
           kind == QuantFormat::Awq ? "qzeros" : "zero points", zeros ? "has them" : "does not");
  const std::vector<int32_t> z = zeros ? host_copy<int32_t>(m.zero_point) : std::vector<int32_t>();
  if (kind == QuantFormat::Awq)
    return unpack_awq(packed.data(), zeros ? z.data() : nullptr, scales.data(), R, C, m.group);
  return unpack_ct_int4(packed.data(), zeros ? z.data() : nullptr, scales.data(), R, C, m.group);
}

/// The 8-bit plain form of a matrix of a block held as two 4-bit planes: compressed-tensors int8, GPTQ of 8 bits,
/// or a GPTQ matrix of 2-4 bits beside them (its high plane zero).
Int8Plain int8_plain(const QuantMatrix& m, QuantFormat kind) {
  const char* op = "load_quantized_experts";
  if (kind == QuantFormat::CtInt8) {
    FN_CHECK(m.data.dtype == DType::I8 && shape_numel(m.data.shape) == m.rows * m.cols,
             "{}: int8 weight '{}' needs I8 values [{}, {}]", op, m.name, m.rows, m.cols);
    const std::vector<float> scales = float_copy(m.scale, "the scales of '" + m.name + "'");
    FN_CHECK(scales.size() == 1 || int64_t(scales.size()) == m.rows,
             "{}: int8 weight '{}' has {} scales, expected one per row ({}) or one", op, m.name, scales.size(), m.rows);
    return unpack_ct_int8(static_cast<const int8_t*>(m.data.data), scales.data(), scales.size() != 1, m.rows, m.cols);
  }
  FN_CHECK(kind == QuantFormat::Gptq, "{}: '{}' ({}) cannot be held as 8-bit planes", op, m.name,
           quant_format_name(kind));
  if (m.bits != 8) return int8_from_int4(int4_plain(m, kind, true));
  FN_CHECK(m.data.dtype == DType::I32 && m.zero_point.defined() && m.zero_point.dtype == DType::I32,
           "{}: GPTQ weight '{}' needs I32 qweight and qzeros", op, m.name);
  const std::vector<int32_t> packed = host_copy<int32_t>(m.data), z = host_copy<int32_t>(m.zero_point);
  const std::vector<float> scales = float_copy(m.scale, "the scales of '" + m.name + "'");
  return unpack_gptq_int8(packed.data(), z.data(), scales.data(), m.rows, m.cols, m.group, m.gptq_v2);
}

/// The FP8 plain form of a compressed-tensors float-quantized or FP8 block matrix [R, C].
Fp8Plain fp8_plain(const QuantMatrix& m, QuantFormat kind) {
  const char* op = "load_quantized_experts";
  FN_CHECK(m.data.dtype == DType::F8_E4M3 && shape_numel(m.data.shape) == m.rows * m.cols,
           "{}: FP8 weight '{}' needs F8_E4M3 values [{}, {}]", op, m.name, m.rows, m.cols);
  const std::vector<float> scales = float_copy(m.scale, "the scales of '" + m.name + "'");
  const auto* q = static_cast<const uint8_t*>(m.data.data);
  if (kind == QuantFormat::Fp8Block) {
    const int64_t n = m.block_rows > 0 && m.block_cols > 0
                          ? ((m.rows + m.block_rows - 1) / m.block_rows) * ((m.cols + m.block_cols - 1) / m.block_cols)
                          : -1;
    FN_CHECK(int64_t(scales.size()) == n, "{}: FP8 block weight '{}' has {} scales, expected {} (blocks of [{}, {}])",
             op, m.name, scales.size(), n, m.block_rows, m.block_cols);
    return unpack_fp8_block(q, scales.data(), m.rows, m.cols, m.block_rows, m.block_cols);
  }
  FN_CHECK(kind == QuantFormat::CtFp8, "{}: '{}' ({}) is not FP8", op, m.name, quant_format_name(kind));
  FN_CHECK(scales.size() == 1 || int64_t(scales.size()) == m.rows,
           "{}: FP8 weight '{}' has {} scales, expected one per row ({}) or one", op, m.name, scales.size(), m.rows);
  return unpack_ct_fp8(q, scales.data(), scales.size() != 1, m.rows, m.cols);
}

}  // namespace

Tensor CudaOps::load_w8_linear(const W8Linear& w) {
  w.check();
  Tensor codes = alloc({w.rows, w.cols}, w.code, "8-bit weight", Lifetime::Kept);
  Tensor scales = alloc({w.rows, w.groups()}, DType::F32, "8-bit weight scales", Lifetime::Kept);
  FN_CUDA_CHECK(cudaMemcpyAsync(codes.data(), w.codes.data(), codes.nbytes(), cudaMemcpyHostToDevice, stream()),
                "load_w8_linear");
  FN_CUDA_CHECK(cudaMemcpyAsync(scales.data(), w.scales.data(), scales.nbytes(), cudaMemcpyHostToDevice, stream()),
                "load_w8_linear");
  synchronize("load_w8_linear");  // the host vectors may go once this returns
  return codes.with_scales(std::move(scales), w.group);
}

Tensor CudaOps::load_weight(const void* host, DType dtype, const Shape& shape) {
  contract::load_weight(dtype);
  Tensor t = alloc(shape, DType::F16, "weight");
  const int64_t n = t.numel();
  if (n == 0) return t;
  if (dtype == DType::F16) {
    FN_CUDA_CHECK(cudaMemcpyAsync(t.data(), host, t.nbytes(), cudaMemcpyHostToDevice, stream()), "load_weight");
    return t;
  }
  // Raw checkpoint bytes to the GPU, converted there; stats = {values outside FP16, bits of the largest |x|}.
  Tensor raw = alloc({n}, dtype, "weight staging");
  Tensor stats = alloc({2}, DType::I32, "weight range");
  FN_CUDA_CHECK(cudaMemcpyAsync(raw.data(), host, raw.nbytes(), cudaMemcpyHostToDevice, stream()), "load_weight");
  FN_CUDA_CHECK(cudaMemsetAsync(stats.data(), 0, stats.nbytes(), stream()), "load_weight");
  FN_CUDA_CHECK(detail::launch_weight_to_f16(raw.data(), dtype == DType::BF16 ? detail::kSrcBF16 : detail::kSrcF32,
                                             dp<__half>(t), n, dp<uint32_t>(stats), stream()),
                "load_weight");
  uint32_t s[2] = {0, 0};
  FN_CUDA_CHECK(cudaMemcpyAsync(s, stats.data(), sizeof s, cudaMemcpyDeviceToHost, stream()), "load_weight");
  synchronize("load_weight");
  if (s[0] != 0) {
    float mx = 0;
    std::memcpy(&mx, &s[1], sizeof mx);
    fail(
        "load_weight: {} of the {} values of this {} [{}] tensor lie outside the FP16 range (|x| > 65504, or not "
        "finite; the largest finite |x| is {:g}); the CUDA backend stores weights in FP16 and cannot run it",
        s[0], n, dtype_name(dtype), fmt::join(shape, ", "), mx);
  }
  return t;
}

Tensor CudaOps::map_host_table(const void* host, DType dtype, const Shape& shape,
                               std::shared_ptr<const void> keepalive) {
  FN_CHECK(dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32 || dtype == DType::F8_E4M3 ||
               dtype == DType::I8,
           "map_host_table: table must be BF16, F16, F32, F8_E4M3 or I8, got {}", dtype_name(dtype));
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  if (options_.ple_table == PleTablePlacement::Device) return upload(host, dtype, shape);
  // Exact-size pinned copy, mapped into the device's address space; freed with the last tensor handle.
  auto pinned = std::make_shared<PinnedMemory>(bytes, fmt::format("a PLE table shard [{}]", fmt::join(shape, ", ")));
  if (bytes) std::memcpy(pinned->host(), host, bytes);
  void* dev = const_cast<void*>(pinned->device());
  return Tensor(std::move(pinned), dev, dtype, shape, Device::CUDA, ctx_->device);
}

HostTable CudaOps::host_table(DType dtype, const Shape& shape) {
  const size_t bytes = contract::host_table(dtype, shape);
  use_device();
  auto pinned = std::make_shared<PinnedMemory>(
      bytes, fmt::format("a [{}] {} host table", fmt::join(shape, ", "), dtype_name(dtype)));
  void* host = pinned->host();
  void* dev = const_cast<void*>(pinned->device());
  return {Tensor(std::move(pinned), dev, dtype, shape, Device::CUDA, ctx_->device), host};
}

Tensor CudaOps::random_weight(const Shape& shape, float lo, float hi, uint64_t seed) {
  contract::random_weight(lo, hi);
  FN_CHECK(std::max(std::fabs(lo), std::fabs(hi)) <= 65504.f,
           "random_weight: bounds [{}, {}] exceed the FP16 range of the CUDA backend's weights", lo, hi);
  Tensor t = alloc(shape, DType::F16, "random weight");
  FN_CUDA_CHECK(detail::launch_random_f16(dp<__half>(t), t.numel(), lo, hi, seed, stream()), "random_weight");
  return t;
}

RoutedExperts CudaOps::random_experts(int64_t E, int64_t I, int64_t H, uint64_t seed) {
  const char* op = "random_experts";
  contract::random_experts(E, I, H);
  if (H % 8 != 0 || I % 8 != 0 || E > detail::kMoeMaxExperts) return Ops::random_experts(E, I, H, seed);
  use_device();
  const double rms = std::sqrt(68.5 / 8.0);
  auto gu = W4DeviceMatrix::random_nvfp4(to_int(E, op, "experts"), to_int(2 * I, op, "rows"), int(H),
                                         float(std::sqrt(1.0 / double(H)) / rms), seed, stream());
  auto dn =
      W4DeviceMatrix::random_nvfp4(int(E), int(H), int(I), float(std::sqrt(1.0 / double(I)) / rms), seed + 1, stream());
  RoutedExperts r;
  r.packed = std::make_shared<CudaW4Experts>(std::move(gu), std::move(dn), ctx_->device, int(E), int(H), int(I),
                                             "w4a16 (random, nvfp4 layout)");
  return r;
}

RoutedExperts CudaOps::load_quantized_experts(const QuantExperts& q) {
  contract::quantized_experts(q);
  const int64_t E = q.experts, H = q.hidden, I = q.inter, F = q.full(), b = q.inter_begin;
  const QuantFormat kind = q.gate[0].format;
  const bool nvfp4 = kind == QuantFormat::Nvfp4 || kind == QuantFormat::CtNvfp4;
  // GPTQ of 2, 3 and 4 bits alike is held as 4-bit codes (exact), a block with 8-bit integer matrices as two 4-bit
  // planes, one of FP8 matrices as FP8 bytes, any other the dequantized FP16 path as a whole (core/quant_format.h
  // w4a16_planes).
  int planes = kW4a16BlockStart;
  for (const auto* list : {&q.gate, &q.up, &q.down})
    for (const QuantMatrix& m : *list) planes = w4a16_block_planes(planes, m.format, m.bits);
  const bool int4 =
      planes == 1 && (kind == QuantFormat::CtInt4 || kind == QuantFormat::Awq || kind == QuantFormat::Gptq);
  const bool int8 = planes == 2, fp8 = planes == kW4a16Fp8;
  int64_t g_gu = nvfp4 ? 16 : fp8 ? w8a16_fp8_group(q.gate[0].format, q.gate[0].block_cols, H) : q.gate[0].group;
  // down's inputs are the intermediate: a rank's slice [b, b + I) of it keeps whole scale groups, int4 (int8, FP8)
  // groups split into equal smaller ones (each with its source group's scale and zero point: exact) where they must.
  const int64_t down_group = fp8 ? w8a16_fp8_group(q.down[0].format, q.down[0].block_cols, F)
                                 : q.down[0].group;  // the checkpoint's (0: all of F)
  int64_t g_dn = nvfp4 ? 16 : down_group;
  if (q.sliced() && (int4 || int8 || fp8)) g_dn = std::gcd(std::gcd(g_dn ? g_dn : F, b), I);
  if (int8) {
    // Two planes side by side: a group never spans both, so the groups must tile a row (a group of a row or more
    // is the whole row); a block whose groups do not (a partial last group) takes the FP16 path.
    g_gu = g_gu == 0 || g_gu >= H ? H : g_gu;
    g_dn = g_dn == 0 || g_dn >= I ? I : g_dn;
    if (H % g_gu != 0 || I % g_dn != 0) return Ops::load_quantized_experts(q);
  }
  if ((!nvfp4 && !int4 && !int8 && !fp8) || H % 8 != 0 || I % 8 != 0 || g_gu % 8 != 0 || E > detail::kMoeMaxExperts) {
    return Ops::load_quantized_experts(q);
  }
  if (q.sliced()) {
    const char* kind_name = int8 ? "8-bit" : fp8 ? "FP8" : "int4";
    FN_CHECK(!nvfp4 || (b % 16 == 0 && I % 16 == 0),
             "load_quantized_experts: {}: this tensor-parallel rank's slice [{}, {}) of the {}-wide intermediate cuts "
             "the NVFP4 scale blocks of 16 inputs of down_proj; use a degree whose slices are multiples of 16",
             q.name, b, b + I, F);
    FN_CHECK(nvfp4 || g_dn % 8 == 0,
             "load_quantized_experts: {}: this tensor-parallel rank's slice [{}, {}) of the {}-wide intermediate cuts "
             "the {} groups of {} inputs of down_proj into pieces of {} (the W4A16 kernels need multiples of 8); use "
             "a degree whose slices are multiples of 8 that tile the groups",
             q.name, b, b + I, F, kind_name, down_group ? down_group : F, g_dn);
  }
  if (g_dn % 8 != 0) return Ops::load_quantized_experts(q);
  use_device();
  const bool zeros = int8 || kind == QuantFormat::Gptq ||
                     ((kind == QuantFormat::CtInt4 || kind == QuantFormat::Awq) && q.gate[0].zero_point.defined());
  const W4Format f = nvfp4 ? W4Format::Nvfp4 : fp8 ? W4Format::Fp8 : W4Format::Int4;
  // Two planes: each row's inputs twice over, groups never across the planes (int8_planes).
  const int P = int8 ? 2 : 1;
  W4Packed gu(f, int(E), int(2 * I), int(P * H), int(g_gu), zeros), dn(f, int(E), int(H), int(P * I), int(g_dn), zeros);
  const Slice rows_slice{b, I, 0, H, F, H, g_gu}, cols_slice{0, H, b, I, H, F, g_dn};
  for (int64_t e = 0; e < E; ++e) {
    pack_rows(gu, e, 0, q.gate[size_t(e)], kind, rows_slice, zeros, P);
    pack_rows(gu, e, I, q.up[size_t(e)], kind, rows_slice, zeros, P);
    pack_rows(dn, e, 0, q.down[size_t(e)], kind, cols_slice, zeros, P);
  }
  RoutedExperts r;
  r.packed = std::make_shared<CudaW4Experts>(
      gu, dn, ctx_->device, P,
      int8  ? fmt::format("w8a16 as two 4-bit planes ({})",
                         kind == QuantFormat::Gptq ? "gptq, a layer with 8-bit experts" : quant_format_name(kind))
       : fp8 ? fmt::format("w8a16 fp8 e4m3 ({})", quant_format_name(kind))
            : fmt::format("w4a16 ({})", quant_format_name(kind)));
  return r;
}

void CudaOps::pack_rows(W4Packed& dst, int64_t e, int64_t row0, const QuantMatrix& m, QuantFormat kind, const Slice& sl,
                        bool zeros, int planes) {
  const char* op = "load_quantized_experts";
  const int64_t rows = sl.rows, cols = sl.cols;
  FN_CHECK(
      m.format == kind && m.rows == sl.full_rows && m.cols == sl.full_cols && m.data.defined() && m.scale.defined(),
      "{}: '{}' ({} [{}, {}]) does not fit its block: expected the format of the first expert, [{}, {}], with "
      "data and scales",
      op, m.name, int(m.format), m.rows, m.cols, sl.full_rows, sl.full_cols);
  if (kind == QuantFormat::Nvfp4 || kind == QuantFormat::CtNvfp4) {
    FN_CHECK(m.data.dtype == DType::U8 && m.scale.dtype == DType::F8_E4M3 && m.global_scale.defined() &&
                 m.global_scale.dtype == DType::F32 && shape_numel(m.global_scale.shape) == 1,
             "{}: NVFP4 weight '{}' needs U8 codes, F8_E4M3 block scales and one F32 global scale", op, m.name);
    float global = 0.f;
    std::memcpy(&global, m.global_scale.data, 4);
    // The slice's codes (two per byte) and block scales (one per 16 inputs); a column slice is copied (its start is
    // a multiple of 16: load_quantized_experts checked), a row slice is a view.
    const int64_t code_row = sl.full_cols / 2, scale_row = (sl.full_cols + 15) / 16;
    const auto* codes = static_cast<const uint8_t*>(m.data.data) + sl.r0 * code_row;
    const auto* scales = static_cast<const uint8_t*>(m.scale.data) + sl.r0 * scale_row;
    std::vector<uint8_t> codes_part, scales_part;
    if (cols != sl.full_cols) {
      codes_part.resize(size_t(rows * cols / 2));
      scales_part.resize(size_t(rows * ((cols + 15) / 16)));
      for (int64_t n = 0; n < rows; ++n) {
        std::copy_n(codes + n * code_row + sl.c0 / 2, cols / 2, codes_part.begin() + n * (cols / 2));
        std::copy_n(scales + n * scale_row + sl.c0 / 16, (cols + 15) / 16,
                    scales_part.begin() + n * ((cols + 15) / 16));
      }
      codes = codes_part.data();
      scales = scales_part.data();
    }
    const Nvfp4Source src{rows, cols, codes, scales, global, kind == QuantFormat::CtNvfp4};
    try {
      dst.set_rows(int(e), int(row0), src);
    } catch (const Error& err) {
      fail("{}: '{}': {}", op, m.name, err.what());
    }
    return;
  }
  const int64_t R = sl.full_rows, C = sl.full_cols;
  const auto sliced = [&](int64_t group) {
    return rows != R || cols != C || (group ? group : C) != (sl.group ? sl.group : cols);
  };
  if (kind == QuantFormat::CtFp8 || kind == QuantFormat::Fp8Block) {
    Fp8Plain p8 = fp8_plain(m, kind);
    FN_CHECK((p8.group ? p8.group : C) % (sl.group ? sl.group : C) == 0,
             "{}: FP8 weight '{}' has groups of {}, its block {}", op, m.name, p8.group, sl.group);
    if (sliced(p8.group)) p8 = slice_fp8(p8, sl.r0, rows, sl.c0, cols, sl.group);
    try {
      dst.set_rows(int(e), int(row0), p8);
    } catch (const Error& err) {
      fail("{}: '{}': {}", op, m.name, err.what());
    }
    return;
  }
  if (planes == 2) {
    Int8Plain p8 = int8_plain(m, kind);
    FN_CHECK((p8.group ? p8.group : C) % (sl.group ? sl.group : C) == 0,
             "{}: 8-bit weight '{}' has groups of {}, its block {}", op, m.name, p8.group, sl.group);
    if (sliced(p8.group)) p8 = slice_int8(p8, sl.r0, rows, sl.c0, cols, sl.group);
    std::vector<float> row_scale;
    try {
      const Int4Plain both = int8_planes(p8, &row_scale);
      Int4Source src = both.source();
      src.row_scale = row_scale.empty() ? nullptr : row_scale.data();
      dst.set_rows(int(e), int(row0), src);
    } catch (const Error& err) {
      fail("{}: '{}': {}", op, m.name, err.what());
    }
    return;
  }
  Int4Plain plain = int4_plain(m, kind, zeros);
  FN_CHECK((plain.group ? plain.group : C) % (sl.group ? sl.group : C) == 0,
           "{}: int4 weight '{}' has groups of {}, its block {}", op, m.name, plain.group, sl.group);
  if (sliced(plain.group)) plain = slice_int4(plain, sl.r0, rows, sl.c0, cols, sl.group);
  try {
    dst.set_rows(int(e), int(row0), plain.source());
  } catch (const Error& err) {
    fail("{}: '{}': {}", op, m.name, err.what());
  }
}

}  // namespace flashnext::cuda
