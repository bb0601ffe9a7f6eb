// ops/torch_topk_order.h (the GPU's copy of torch.topk's CPU selection) against the standard library algorithms that
// torch.topk runs on the CPU (ops/cpu/topk.h): on inputs full of ties, the same items in the same places.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/cpu/topk.h"
#include "ops/torch_topk_order.h"

using flashnext::topk::Scored;

namespace {

bool greater(const std::pair<float, int64_t>& x, const std::pair<float, int64_t>& y) {
  return (std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first);
}

std::vector<float> tied_values(std::mt19937& rng, int64_t n, int kind) {
  std::vector<float> v(static_cast<size_t>(n));
  std::uniform_int_distribution<int> small(0, 2), coin(0, 1), rare(0, 199);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& x : v) {
    switch (kind) {
      case 0: x = float(small(rng)); break;                          // three values: ties everywhere
      case 1: x = coin(rng) ? 0.f : std::fabs(nd(rng)); break;       // relu-like: half exact zeros
      case 2: x = rare(rng) == 0 ? std::nanf("") : float(small(rng)); break;  // with NaNs (sort first)
      default: x = coin(rng) ? -0.f : 0.f; break;                    // signed zeros compare equal
    }
  }
  return v;
}

}  // namespace

TEST(TorchTopkOrder, SameItemsInTheSamePlacesAsTheStandardLibrary) {
  std::mt19937 rng(1234);
  int heap_cases = 0, select_cases = 0;
  for (int c = 0; c < 4000; ++c) {
    const int64_t n = c < 40 ? c + 1 : std::uniform_int_distribution<int64_t>(1, 3000)(rng);
    // Half the cases with k * 64 <= n (partial_sort's heap selection), half anywhere (mostly nth_element).
    const int64_t k = std::uniform_int_distribution<int64_t>(1, c % 2 ? std::max<int64_t>(1, n / 64) : n)(rng);
    const std::vector<float> v = tied_values(rng, n, c % 4);
    std::vector<std::pair<float, int64_t>> ref(static_cast<size_t>(n));
    std::vector<Scored> got(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) ref[size_t(j)] = {v[size_t(j)], j}, got[size_t(j)] = {v[size_t(j)], int32_t(j)};
    flashnext::topk::torch_topk_select(got.data(), n, k);
    const bool heap = k * 64 <= n;
    if (heap) {
      ++heap_cases;
      std::partial_sort(ref.begin(), ref.begin() + k, ref.end(), greater);  // selection, then a sort of the first k
    } else {
      ++select_cases;
      std::nth_element(ref.begin(), ref.begin() + k - 1, ref.end(), greater);
    }
    // The first k: the same set (partial_sort has also sorted them); nth_element: the same arrangement everywhere.
    std::vector<int64_t> want_set, got_set;
    for (int64_t j = 0; j < k; ++j) want_set.push_back(ref[size_t(j)].second), got_set.push_back(got[size_t(j)].index);
    std::sort(want_set.begin(), want_set.end());
    std::sort(got_set.begin(), got_set.end());
    ASSERT_EQ(got_set, want_set) << "case " << c << ": n " << n << " k " << k << " kind " << c % 4;
    for (int64_t j = heap ? k : 0; j < n; ++j)
      ASSERT_EQ(got[size_t(j)].index, ref[size_t(j)].second) << "case " << c << ": item " << j << ", n " << n;
    // And the same set as the oracle's torch_topk (which the CPU backend uses).
    std::vector<std::pair<float, int64_t>> queue;
    std::vector<int64_t> oracle(static_cast<size_t>(k));
    flashnext::cpu::torch_topk(v.data(), n, k, queue, oracle.data());
    std::sort(oracle.begin(), oracle.end());
    ASSERT_EQ(got_set, oracle) << "case " << c;
  }
  EXPECT_GT(heap_cases, 100);
  EXPECT_GT(select_cases, 100);
}

TEST(TorchTopkOrder, DeepRecursionFallsBackToHeapSelection) {
  // Many equal items make every partition cut at the front: introselect exhausts its 2 log2(n) levels and finishes
  // with a heap selection, as std::nth_element does.
  for (int64_t n : {int64_t(64), int64_t(1000), int64_t(4097)}) {
    std::vector<std::pair<float, int64_t>> ref(static_cast<size_t>(n));
    std::vector<Scored> got(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      const float x = j % 5 == 0 ? 1.f : 0.f;
      ref[size_t(j)] = {x, j};
      got[size_t(j)] = {x, int32_t(j)};
    }
    const int64_t k = n / 2;
    flashnext::topk::torch_topk_select(got.data(), n, k);
    std::nth_element(ref.begin(), ref.begin() + k - 1, ref.end(), greater);
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(got[size_t(j)].index, ref[size_t(j)].second) << "n " << n << " item " << j;
  }
}
