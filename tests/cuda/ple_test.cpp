// PLE kernels against CPU loops of MODEL.md's PLE. Tolerances: gathered rows exact (every FP16/BF16/FP8 value
// times the scale used here is exact in FP16); gate outputs p, pn atol 3e-3 rtol 1e-2 (the kernel rounds kn, qn
// and p to FP16 like the reference's bf16 tensors); conv residual atol 3e-3 rtol 4e-3; conv state exact.
#include "ops/cuda/ple.h"

#include <gtest/gtest.h>

#include <cstring>

#include "cuda_test_util.h"

namespace flashnext::cuda::test {
namespace {

// OCP E4M3 (fn) decoding written from the spec: bias 7, subnormals 2^-6 * m/8, no infinities.
float e4m3(uint8_t v) {
  const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  const float mag = e == 0 ? std::ldexp(float(m) / 8.f, -6) : std::ldexp(1.f + float(m) / 8.f, e - 7);
  return s ? -mag : mag;
}

TEST(PleGather, DeviceAndPinnedHostTablesOfEachType) {
  const int heads = 16, dim = 160, T = 5;
  const int64_t total = 1000, per_shard = 384;  // 3 shards, the last shorter
  std::mt19937 rng(3);
  for (PleTableType type : {PleTableType::F16, PleTableType::BF16, PleTableType::F8E4M3}) {
    for (bool pinned : {false, true}) {
      const size_t rb = ple_row_bytes(type, dim);
      std::vector<uint8_t> host(total * rb);
      for (auto& b : host) b = uint8_t(rng());
      if (type == PleTableType::F8E4M3)
        for (auto& b : host)
          if ((b & 0x7f) == 0x7f) b = 0;  // no NaN codes
      if (type != PleTableType::F8E4M3)   // 16-bit: keep values small and finite (clear the top exponent bits)
        for (size_t i = 1; i < host.size(); i += 2) host[i] &= type == PleTableType::F16 ? 0xbb : 0xbe;
      std::vector<DeviceMemory> dev;
      std::vector<PinnedMemory> pin;
      std::vector<const void*> addr;
      for (int64_t r0 = 0; r0 < total; r0 += per_shard) {
        const size_t bytes = size_t(std::min(per_shard, total - r0)) * rb;
        if (pinned) {
          pin.emplace_back(bytes, "PLE test shard");
          std::memcpy(pin.back().host(), host.data() + r0 * rb, bytes);
          addr.push_back(pin.back().device());
        } else {
          dev.emplace_back(bytes, "PLE test shard");
          copy_to_device(dev.back().get(), host.data() + r0 * rb, bytes, "shard");
          addr.push_back(dev.back().get());
        }
      }
      const float scale = type == PleTableType::F8E4M3 ? 0.25f : 1.f;
      PleTable table(addr, per_shard, total, dim, type, scale);
      std::vector<int64_t> rows(size_t(T) * heads);
      for (auto& r : rows) r = int64_t(rng() % total);
      rows[0] = total - 1;
      rows[1] = per_shard;  // first row of the second shard
      auto drows = to_device(rows);
      DeviceArray<__half> out(size_t(T) * heads * dim, "out");
      ple_gather(table, drows.get(), T, heads, out.get(), nullptr, nullptr);
      sync();
      std::vector<float> ref(out.size());
      for (size_t i = 0; i < rows.size(); ++i)
        for (int d = 0; d < dim; ++d) {
          const uint8_t* src = host.data() + rows[i] * rb;
          float v;
          if (type == PleTableType::F8E4M3) {
            v = e4m3(src[d]) * scale;
          } else {
            uint16_t bits;
            std::memcpy(&bits, src + 2 * d, 2);
            if (type == PleTableType::BF16) {
              uint32_t u = uint32_t(bits) << 16;
              std::memcpy(&v, &u, 4);
            } else {
              __half_raw raw;
              raw.x = bits;
              v = __half2float(__half(raw));
            }
          }
          ref[i * dim + d] = __half2float(__float2half_rn(v));  // FP16 output of the exact value
        }
      expect_close(host_half(out.get(), ref.size()), ref, 0.f, 0.f,
                   std::string("ple_gather ") + (pinned ? "pinned host " : "device ") + std::to_string(int(type)));
      // A row outside the table is reported and read as zeros.
      std::vector<int64_t> bad = {total};
      auto dbad = to_device(bad);
      DeviceArray<int32_t> status(1, "status");
      cudaMemset(status.get(), 0, 4);
      ple_gather(table, dbad.get(), 1, 1, out.get(), status.get(), nullptr);
      EXPECT_THROW(ple_check_status(status.get(), nullptr), Error);
    }
  }
}

TEST(PleGather, PinnedAllocationFailureSaysHowMuchIsNeeded) {
  const size_t absurd = size_t(1) << 52;  // 4 PiB
  try {
    PinnedMemory m(absurd, "PLE table");
    FAIL() << "a 4 PiB pinned allocation succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("4503599627370496 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("are needed"), std::string::npos) << msg;
  }
}

TEST(PleGate, MatchesReference) {
  for (auto [T, S, H] : std::vector<std::array<int, 3>>{{3, 4, 2560}, {2, 2, 33}, {1, 1, 1}}) {
    const int W = S * H;
    auto key = rand_f16_values(size_t(T) * W, 1, -2.f, 2.f), x = rand_f16_values(size_t(T) * W, 2, -2.f, 2.f);
    auto val = rand_f16_values(size_t(T) * H, 3, -1.f, 1.f);
    auto wk = rand_f16_values(W, 4, -0.3f, 0.3f), wq = rand_f16_values(W, 5, -0.3f, 0.3f),
         wc = rand_f16_values(W, 6, -0.3f, 0.3f);
    auto dk = dev_half(key), dx = dev_half(x), dv = dev_half(val), dwk = dev_half(wk), dwq = dev_half(wq),
         dwc = dev_half(wc);
    DeviceArray<__half> p(size_t(T) * W, "p"), pn(size_t(T) * W, "pn");
    ple_gate(dk.get(), dv.get(), dx.get(), dwk.get(), dwq.get(), dwc.get(), T, S, H, 1e-6f, p.get(), pn.get(), nullptr);
    sync();
    std::vector<float> rp(size_t(T) * W), rpn(size_t(T) * W);
    auto norm = [&](const float* in, const std::vector<float>& w, int b, std::vector<double>& out) {
      double ss = 0;
      for (int i = 0; i < H; ++i) ss += double(in[b * H + i]) * in[b * H + i];
      const double r = 1 / std::sqrt(ss / H + 1e-6);
      out.resize(H);
      for (int i = 0; i < H; ++i) out[i] = in[b * H + i] * r * (1 + w[b * H + i]);
    };
    for (int t = 0; t < T; ++t) {
      for (int b = 0; b < S; ++b) {
        std::vector<double> kn, qn;
        norm(&key[size_t(t) * W], wk, b, kn);
        norm(&x[size_t(t) * W], wq, b, qn);
        double s = 0;
        for (int i = 0; i < H; ++i) s += kn[i] * qn[i];
        s /= std::sqrt(double(H));
        s = (s > 0 ? 1 : s < 0 ? -1 : 0) * std::sqrt(std::max(std::fabs(s), 1e-6));
        const double g = 1 / (1 + std::exp(-s));
        for (int i = 0; i < H; ++i) rp[size_t(t) * W + b * H + i] = float(g * val[size_t(t) * H + i]);
      }
      for (int b = 0; b < S; ++b) {
        std::vector<double> n;
        norm(&rp[size_t(t) * W], wc, b, n);
        for (int i = 0; i < H; ++i) rpn[size_t(t) * W + b * H + i] = float(n[i]);
      }
    }
    expect_close(host_half(p.get(), rp.size()), rp, 3e-3f, 1e-2f, "ple_gate p");
    expect_close(host_half(pn.get(), rpn.size()), rpn, 3e-3f, 1e-2f, "ple_gate pn");
  }
}

TEST(PleConv, PrefillVarlenThenDecodeMatchReference) {
  const int C = 50, K = 4, dil = 3, tail = (K - 1) * dil;
  const std::vector<int> lens = {1, 2, 10, 4};
  std::vector<int32_t> cu = {0};
  for (int l : lens) cu.push_back(cu.back() + l);
  const int nseq = int(lens.size());
  const std::vector<int32_t> slots = {2, 0, 3, 1};
  auto w = rand_f16_values(size_t(C) * K, 10, -1.f, 1.f);
  auto st = rand_f16_values(size_t(nseq) * tail * C, 11, -1.f, 1.f);
  auto dw = dev_half(w), dst = dev_half(st);
  std::vector<float> stref = st;
  auto dslots = to_device(slots);
  for (int step = 0; step < 3; ++step) {  // step 0: prefill; steps 1, 2: decode (one token per sequence)
    std::vector<int32_t> scu = {0};
    for (int s = 0; s < nseq; ++s) scu.push_back(scu.back() + (step == 0 ? lens[s] : 1));
    const int T = scu.back();
    auto x = rand_f16_values(size_t(T) * C, 20 + step, -2.f, 2.f), p = rand_f16_values(size_t(T) * C, 30 + step),
         pn = rand_f16_values(size_t(T) * C, 40 + step);
    auto dx = dev_half(x), dp = dev_half(p), dpn = dev_half(pn);
    auto dcu = to_device(scu);
    ple_conv(dx.get(), dp.get(), dpn.get(), dcu.get(), nseq, T, dst.get(), dslots.get(), dw.get(), C, K, dil, nullptr);
    sync();
    std::vector<float> ref = x;
    for (int s = 0; s < nseq; ++s) {
      float* sref = &stref[size_t(slots[s]) * tail * C];
      for (int c = 0; c < C; ++c) {
        std::vector<float> hist;
        for (int j = 0; j < tail; ++j) hist.push_back(sref[size_t(j) * C + c]);
        for (int t = scu[s]; t < scu[s + 1]; ++t) hist.push_back(pn[size_t(t) * C + c]);
        for (int t = scu[s]; t < scu[s + 1]; ++t) {
          const int h = tail + (t - scu[s]);
          double acc = 0;
          for (int k = 0; k < K; ++k) acc += double(w[size_t(c) * K + k]) * hist[h - (K - 1 - k) * dil];
          ref[size_t(t) * C + c] += p[size_t(t) * C + c] + silu(float(acc));
        }
        for (int j = 0; j < tail; ++j) sref[size_t(j) * C + c] = hist[hist.size() - tail + j];
      }
    }
    expect_close(host_half(dx.get(), ref.size()), ref, 3e-3f, 4e-3f, "ple_conv residual step " + std::to_string(step));
    expect_close(host_half(dst.get(), stref.size()), stref, 0.f, 0.f, "ple_conv state step " + std::to_string(step));
  }
}

}  // namespace
}  // namespace flashnext::cuda::test
