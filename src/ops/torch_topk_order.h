// torch.topk's CPU selection (ops/cpu/topk.h) as plain code that also runs in a CUDA kernel: which k of n scored
// items torch.topk(largest=True) returns, ties included, so that the GPU can choose the QSA indexer's blocks as the
// reference does without a round trip to the host.
//
// PyTorch's CPU top-k (aten TopKImpl.h) runs, over (value, index) pairs in index order with the comparator "a.value >
// b.value, NaN largest", std::partial_sort of the first k when k * 64 <= n, else std::nth_element at k - 1. Which of
// several equal values land among the first k is decided by how libstdc++ implements those two algorithms: heap
// selection (make a max-heap under the comparator over the first k, then for each later item that compares before
// the top, pop the top into its place and sift down), and introselect (while more than 3 items remain: a median of
// three of items 1, mid and last-1 moved to the front as pivot, an unguarded Hoare partition, recursion into the side
// holding the nth; heap selection once 2 * floor(log2 n) levels are spent; insertion sort for the last few). The
// functions below follow those steps one for one; tests/model/torch_topk_order_test.cpp checks them against the
// standard library's algorithms on inputs full of ties, item for item.
#pragma once

#include "ops/cuda/cuda_stdint.h"

#if defined(__CUDACC__)
#define FN_TOPK_HD __host__ __device__
#else
#define FN_TOPK_HD
#endif

namespace flashnext::topk {

/// One candidate: its score and its position in the input.
struct Scored {
  float value;
  int32_t index;
};

/// The comparator of torch's CPU top-k: a before b when a is larger, NaN counting as the largest.
FN_TOPK_HD inline bool before(const Scored& a, const Scored& b) {
  const bool a_nan = a.value != a.value, b_nan = b.value != b.value;
  return (a_nan && !b_nan) || a.value > b.value;
}

FN_TOPK_HD inline void swap_items(Scored* a, Scored* b) {
  const Scored t = *a;
  *a = *b;
  *b = t;
}

/// Sift-up of a heap push: moves `value` from `hole` towards `top` past every parent that sorts before it.
FN_TOPK_HD inline void heap_sift_up(Scored* first, int64_t hole, int64_t top, Scored value) {
  int64_t parent = (hole - 1) / 2;
  while (hole > top && before(first[parent], value)) {
    first[hole] = first[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  first[hole] = value;
}

/// Re-heaps [first, first + len) after the item at `hole` was taken out: the hole walks down to a leaf along the
/// children that do not sort before their sibling, then `value` sifts up from there.
FN_TOPK_HD inline void heap_adjust(Scored* first, int64_t hole, int64_t len, Scored value) {
  const int64_t top = hole;
  int64_t child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (before(first[child], first[child - 1])) --child;
    first[hole] = first[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    first[hole] = first[child - 1];
    hole = child - 1;
  }
  heap_sift_up(first, hole, top, value);
}

/// Builds the heap over [first, first + len): every parent from the last one down to the root re-heaped in turn.
FN_TOPK_HD inline void heap_make(Scored* first, int64_t len) {
  if (len < 2) return;
  for (int64_t parent = (len - 2) / 2;; --parent) {
    heap_adjust(first, parent, len, first[parent]);
    if (parent == 0) return;
  }
}

/// Heap selection: the first `middle` items end up holding the `middle` that sort first (partial_sort's selection).
FN_TOPK_HD inline void heap_select(Scored* first, int64_t middle, int64_t n) {
  heap_make(first, middle);
  for (int64_t i = middle; i < n; ++i) {
    if (before(first[i], first[0])) {  // pop the top into i's place, i's item into the heap
      const Scored value = first[i];
      first[i] = first[0];
      heap_adjust(first, 0, middle, value);
    }
  }
}

FN_TOPK_HD inline void insertion_sort(Scored* first, int64_t n) {
  for (int64_t i = 1; i < n; ++i) {
    const Scored value = first[i];
    if (before(value, first[0])) {
      for (int64_t j = i; j > 0; --j) first[j] = first[j - 1];
      first[0] = value;
    } else {
      int64_t j = i;
      while (before(value, first[j - 1])) {
        first[j] = first[j - 1];
        --j;
      }
      first[j] = value;
    }
  }
}

/// The median of items 1, mid and n-1 moved to the front, then an unguarded partition of [1, n) around it; returns
/// the cut.
FN_TOPK_HD inline int64_t partition_pivot(Scored* first, int64_t n) {
  Scored* a = first + 1;
  Scored* b = first + n / 2;
  Scored* c = first + (n - 1);
  if (before(*a, *b)) {
    if (before(*b, *c))
      swap_items(first, b);
    else if (before(*a, *c))
      swap_items(first, c);
    else
      swap_items(first, a);
  } else if (before(*a, *c)) {
    swap_items(first, a);
  } else if (before(*b, *c)) {
    swap_items(first, c);
  } else {
    swap_items(first, b);
  }
  int64_t lo = 1, hi = n;
  while (true) {
    while (before(first[lo], first[0])) ++lo;
    --hi;
    while (before(first[0], first[hi])) --hi;
    if (!(lo < hi)) return lo;
    swap_items(first + lo, first + hi);
    ++lo;
  }
}

/// floor(log2(n)) for n >= 1.
FN_TOPK_HD inline int floor_log2(int64_t n) {
  int l = 0;
  while (n > 1) n >>= 1, ++l;
  return l;
}

/// Introselect: [0, n) reordered so that item `nth` is the one that sorts there, those before it do not sort after
/// it (nth_element's arrangement, item for item).
FN_TOPK_HD inline void introselect(Scored* items, int64_t nth, int64_t n) {
  if (n == 0 || nth == n) return;
  int64_t lo = 0, hi = n;
  int depth = 2 * floor_log2(n);
  while (hi - lo > 3) {
    if (depth == 0) {
      heap_select(items + lo, nth - lo + 1, hi - lo);
      swap_items(items + lo, items + nth);
      return;
    }
    --depth;
    const int64_t cut = lo + partition_pivot(items + lo, hi - lo);
    if (cut <= nth)
      lo = cut;
    else
      hi = cut;
  }
  insertion_sort(items + lo, hi - lo);
}

/// Reorders items[0, n) (in index order on entry) so that items[0, k) are the k items torch.topk(largest=True) on
/// the CPU returns, as a set (their order there is not torch's sorted order). 1 <= k <= n.
FN_TOPK_HD inline void torch_topk_select(Scored* items, int64_t n, int64_t k) {
  if (k <= 0 || k > n) return;
  if (k * 64 <= n)
    heap_select(items, k, n);  // partial_sort: its final sort_heap only orders the first k
  else
    introselect(items, k - 1, n);  // nth_element at k - 1 (the sort of the first k - 1 that follows only orders)
}

}  // namespace flashnext::topk
