// top-k exactly as PyTorch's CPU torch.topk(largest=True, sorted=True) selects it, ties included.
//
// PyTorch (aten/src/ATen/native/TopKImpl.h, `topk_impl_loop`) fills a vector of (value, index) pairs in index
// order and runs std::partial_sort over the first k when k * 64 <= n, else std::nth_element at k-1 followed by
// std::sort of the first k-1, with the comparator "a.value > b.value (NaN counts as largest)". Which of several
// equal values end up among the first k therefore depends on those libstdc++ algorithms, not on a stable rule;
// calling the same algorithms with the same comparator on the same input reproduces the selection bit for bit.
// This matters for the QSA indexer, where relu makes exact-zero block scores (and so ties) common.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace flashnext::cpu {

/// Indices of the k largest of values[0..n) in torch.topk order. `queue` is scratch space (reused across calls).
inline void torch_topk(const float* values, int64_t n, int64_t k, std::vector<std::pair<float, int64_t>>& queue,
                       int64_t* out_indices) {
  if (k <= 0) return;
  queue.resize(size_t(n));
  for (int64_t j = 0; j < n; ++j) queue[size_t(j)] = {values[j], j};
  auto greater = [](const std::pair<float, int64_t>& x, const std::pair<float, int64_t>& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first);
  };
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), greater);
  } else {
    std::nth_element(queue.begin(), queue.begin() + k - 1, queue.end(), greater);
    std::sort(queue.begin(), queue.begin() + k - 1, greater);
  }
  for (int64_t j = 0; j < k; ++j) out_indices[j] = queue[size_t(j)].second;
}

}  // namespace flashnext::cpu
