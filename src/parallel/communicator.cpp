#include "parallel/communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace flashnext {

Tensor host_f32(const Shape& shape) {
  std::shared_ptr<float[]> data(new float[size_t(std::max<int64_t>(1, shape_numel(shape)))]);
  return Tensor(std::shared_ptr<void>(data, data.get()), data.get(), DType::F32, shape, Device::CPU);
}

void check_host_f32(const char* op, const Tensor& t, const char* what) {
  FN_CHECK(t.device() == Device::CPU && t.dtype() == DType::F32,
           "tensor parallel: {}: {} {} must be an F32 CPU tensor (the host collectives read host memory)", op, what,
           t.str());
}

void check_host_gather(const Tensor& in, const Tensor& out) {
  check_host_f32("all_gather_columns", in, "input");
  check_host_f32("all_gather_columns", out, "output");
  FN_CHECK(in.rank() == 2 && out.rank() == 2 && in.dim(0) == out.dim(0),
           "tensor parallel: all_gather_columns: input {} and output {} must be [rows, width] with equal rows",
           in.str(), out.str());
}

namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  const char* kind() const override { return "single"; }
  void all_reduce_sum(const Tensor&) override {}
  void all_gather_columns(const Tensor& in, const Tensor& out) override {
    FN_CHECK(in.shape() == out.shape() && in.dtype() == out.dtype() && in.device() == Device::CPU,
             "tensor parallel: all_gather_columns of a group of one: in {} and out {} must be equal CPU tensors",
             in.str(), out.str());
    std::memcpy(out.data(), in.data(), in.nbytes());
  }
};

/// What the ranks of one CPU group share: the tensors each rank passed to the collective in progress and a reusable
/// barrier that an abort breaks.
struct CpuGroup {
  CpuGroup(int n, const CpuGroupOptions& o) : world(n), options(o), slots(size_t(n), nullptr) {}
  const int world;
  const CpuGroupOptions options;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string reason;                ///< why it was aborted (empty: not said)
  std::vector<const Tensor*> slots;  ///< per rank: its tensor of the collective in progress

  [[noreturn]] void throw_aborted() const {
    if (reason.empty()) throw Error("tensor parallel: another rank of the group failed (the step was abandoned)");
    throw Error(reason.starts_with("tensor parallel: ") ? reason : "tensor parallel: " + reason);
  }
  void abort(const std::string& why) {
    std::lock_guard lock(mu);
    aborted = true;
    if (reason.empty()) reason = why;
    cv.notify_all();
  }

  /// Blocks until every rank arrived (or the group is aborted: throws Error).
  void barrier() {
    std::unique_lock lock(mu);
    if (aborted) throw_aborted();
    const uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    if (generation == gen) throw_aborted();
  }
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<CpuGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return group_->world; }
  const char* kind() const override { return "cpu threads"; }

  void all_reduce_sum(const Tensor& t) override {
    check_host_f32("all_reduce_sum", t, "tensor");
    CpuGroup& g = *group_;
    g.slots[size_t(rank_)] = &t;
    g.barrier();
    for (int k = 0; k < g.world; ++k)  // every rank checks every shape, so all of them throw together
      FN_CHECK(g.slots[size_t(k)]->shape() == g.slots[0]->shape(),
               "tensor parallel: all_reduce_sum: rank {} passed {}, rank 0 {}", k, g.slots[size_t(k)]->str(),
               g.slots[0]->str());
    // Rank r sums the elements of its slice over all ranks in rank order and writes the sum into every rank's
    // tensor: the slices are disjoint, so no element is read after another rank wrote it.
    const int64_t n = t.numel(), begin = n * rank_ / g.world, end = n * (rank_ + 1) / g.world;
    for (int64_t i = begin; i < end; ++i) {
      float s = g.slots[0]->data_as<const float>()[i];
      for (int k = 1; k < g.world; ++k) s += g.slots[size_t(k)]->data_as<const float>()[i];
      for (int k = 0; k < g.world; ++k) g.slots[size_t(k)]->data_as<float>()[i] = s;
    }
    g.barrier();  // nobody returns (and reuses its tensor) while another rank still writes into it
  }

  void all_gather_columns(const Tensor& in, const Tensor& out) override {
    check_host_gather(in, out);
    CpuGroup& g = *group_;
    g.slots[size_t(rank_)] = &in;
    g.barrier();
    int64_t width = 0;
    for (int k = 0; k < g.world; ++k) {
      const Tensor& part = *g.slots[size_t(k)];
      FN_CHECK(part.rank() == 2 && part.dim(0) == in.dim(0),
               "tensor parallel: all_gather_columns: rank {} passed {}, rank {} {}", k, part.str(), rank_, in.str());
      width += part.dim(1);
    }
    FN_CHECK(width == out.dim(1), "tensor parallel: all_gather_columns: the ranks' widths sum to {}, the output {}",
             width, out.str());
    const int64_t rows = out.dim(0);
    int64_t col = 0;
    for (int k = 0; k < g.world; ++k) {
      const Tensor& part = *g.slots[size_t(k)];
      const int64_t w = part.dim(1);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(out.data_as<float>() + r * width + col, part.data_as<const float>() + r * w, size_t(w) * 4);
      col += w;
    }
    g.barrier();  // the inputs stay untouched until every rank copied them
  }

  void abort() override { group_->abort(""); }
  void abort(const std::string& reason) override { group_->abort(reason); }
  void reset() override {
    std::lock_guard lock(group_->mu);
    if (group_->options.final_failures) return;
    group_->aborted = false;
    group_->reason.clear();
    group_->arrived = 0;
  }

 private:
  std::shared_ptr<CpuGroup> group_;
  int rank_;
};

}  // namespace

std::shared_ptr<Communicator> make_single_communicator() {
  return std::make_shared<SingleCommunicator>();
}

std::vector<std::shared_ptr<Communicator>> make_cpu_communicators(int world) {
  return make_cpu_communicators(world, CpuGroupOptions{});
}

std::vector<std::shared_ptr<Communicator>> make_cpu_communicators(int world, const CpuGroupOptions& options) {
  FN_CHECK(world >= 1, "tensor parallel: a group needs at least one rank, got {}", world);
  auto group = std::make_shared<CpuGroup>(world, options);
  std::vector<std::shared_ptr<Communicator>> out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_shared<CpuCommunicator>(group, r));
  return out;
}

}  // namespace flashnext
