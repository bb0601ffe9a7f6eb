// The NCCL communicator (nccl_communicator.h): NCCL loaded with dlopen, one group of communicators per process-local
// tensor-parallel group.
#include "ops/cuda/nccl_communicator.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"
#include "ops/cuda/backend.h"
#include "ops/cuda/cuda_check.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define FN_HAVE_NCCL_H 1
#endif

namespace flashnext {

#ifdef FN_HAVE_NCCL_H
namespace {

/// The NCCL entry points flashnext uses, resolved from the loaded library.
struct NcclApi {
  ncclResult_t (*GetVersion)(int*);
  const char* (*GetErrorString)(ncclResult_t);
  ncclResult_t (*CommInitAll)(ncclComm_t*, int, const int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
};

/// The library, loaded once: the API, or why it could not be had.
struct NcclLibrary {
  NcclApi api{};
  std::string error;  ///< empty when loaded
};

template <class F>
bool resolve(void* lib, const char* name, F& f, std::string& error) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) error = fmt::format("the NCCL library has no symbol {}", name);
  return f != nullptr;
}

const NcclLibrary& nccl_library() {
  static const NcclLibrary lib = [] {
    NcclLibrary l;
    const char* env = std::getenv("FLASHNEXT_NCCL_LIBRARY");
    const std::vector<std::string> names =
        env && *env ? std::vector<std::string>{env} : std::vector<std::string>{"libnccl.so.2", "libnccl.so"};
    void* h = nullptr;
    std::string tried;
    for (const std::string& n : names) {
      h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h) break;
      const char* e = dlerror();
      tried += fmt::format("{}{}: {}", tried.empty() ? "" : "; ", n, e ? e : "not found");
    }
    if (!h) {
      l.error = fmt::format(
          "NCCL could not be loaded ({}); install NCCL or set FLASHNEXT_NCCL_LIBRARY to its "
          "libnccl.so.2",
          tried);
      return l;
    }
    NcclApi& a = l.api;
    std::string& e = l.error;
    (void)(resolve(h, "ncclGetVersion", a.GetVersion, e) && resolve(h, "ncclGetErrorString", a.GetErrorString, e) &&
           resolve(h, "ncclCommInitAll", a.CommInitAll, e) && resolve(h, "ncclGetUniqueId", a.GetUniqueId, e) &&
           resolve(h, "ncclCommInitRank", a.CommInitRank, e) && resolve(h, "ncclCommDestroy", a.CommDestroy, e) &&
           resolve(h, "ncclCommAbort", a.CommAbort, e) && resolve(h, "ncclAllReduce", a.AllReduce, e) &&
           resolve(h, "ncclAllGather", a.AllGather, e) && resolve(h, "ncclBroadcast", a.Broadcast, e) &&
           resolve(h, "ncclGroupStart", a.GroupStart, e) && resolve(h, "ncclGroupEnd", a.GroupEnd, e));
    return l;
  }();
  return lib;
}

const NcclApi& nccl() {
  const NcclLibrary& l = nccl_library();
  if (!l.error.empty()) fail("tensor parallel: {}", l.error);
  return l.api;
}

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("tensor parallel: NCCL error in {}: {}", what, nccl().GetErrorString(r));
}

/// What this process's ranks of one group share: their communicators (one per GPU, made together) and whether the
/// group was aborted. A group over several processes (`unique_id` set) has `world` ranks, this process's from
/// `first_rank` on; its failure is final (the other processes would have to make the group anew at the same time).
struct NcclGroup {
  NcclGroup(std::vector<int> gpus, int world_size, int first, std::vector<uint8_t> id)
      : devices(std::move(gpus)),
        world(world_size),
        first_rank(first),
        unique_id(std::move(id)),
        comms(devices.size()) {
    init();
  }
  ~NcclGroup() {
    // At process exit the CUDA runtime may be gone before this (a model kept in a static): then leave the
    // communicators to the process's end.
    if (aborted || cudaFree(nullptr) == cudaErrorCudartUnloading) return;
    for (ncclComm_t c : comms)
      if (c) nccl().CommDestroy(c);
  }
  void init() {
    if (unique_id.empty()) {
      nccl_check(nccl().CommInitAll(comms.data(), int(comms.size()), devices.data()), "ncclCommInitAll");
      return;
    }
    ncclUniqueId id;
    std::memcpy(&id, unique_id.data(), sizeof id);
    // Every process's ranks call ncclCommInitRank with the same id; it returns once all of them did (NCCL's
    // bootstrap: a node that never comes leaves the others waiting here, see docs/ENGINE.md).
    nccl_check(nccl().GroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    cudaError_t device_error = cudaSuccess;
    for (size_t i = 0; i < comms.size() && r == ncclSuccess && device_error == cudaSuccess; ++i) {
      device_error = cudaSetDevice(devices[i]);
      if (device_error == cudaSuccess) r = nccl().CommInitRank(&comms[i], world, id, first_rank + int(i));
    }
    const ncclResult_t end = nccl().GroupEnd();  // the group is ended whatever failed inside it
    FN_CUDA_CHECK(device_error, "tensor parallel (cudaSetDevice)");
    nccl_check(r, "ncclCommInitRank");
    nccl_check(end, "ncclCommInitRank (ncclGroupEnd)");
  }
  void abort_all() {
    std::lock_guard lock(mu);
    if (aborted.exchange(true)) return;
    for (ncclComm_t& c : comms) {
      if (c) nccl().CommAbort(c);  // frees it; the collectives the GPUs wait in end
      c = nullptr;
    }
  }
  void reset() {
    std::lock_guard lock(mu);
    if (!aborted || !unique_id.empty()) return;
    init();
    aborted = false;
  }

  const std::vector<int> devices;
  const int world;
  const int first_rank;
  const std::vector<uint8_t> unique_id;  ///< empty: every rank is in this process
  std::vector<ncclComm_t> comms;
  std::mutex mu;
  std::atomic<bool> aborted{false};
};

void check_device_f32(const char* op, const Tensor& t, const char* what) {
  FN_CHECK(t.device() == Device::CUDA && t.dtype() == DType::F32,
           "tensor parallel: {}: {} {} must be an F32 CUDA tensor (the NCCL communicator)", op, what, t.str());
}

class NcclCommunicator final : public Communicator {
 public:
  /// `local`: the index of the rank among this process's ranks of the group.
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int local, std::shared_ptr<Ops> ops)
      : group_(std::move(group)), local_(local), ops_(std::move(ops)) {
    const auto& backend = dynamic_cast<const cuda::CudaOps&>(*ops_);
    device_ = backend.gpu();
    stream_ = backend.work_stream();
    widths_buf_ = ops_->empty({int64_t(world()) + 1}, DType::I64);
  }
  int rank() const override { return group_->first_rank + local_; }
  int world() const override { return group_->world; }
  const char* kind() const override { return "nccl"; }

  void all_reduce_sum(const Tensor& t) override {
    check_device_f32("all_reduce_sum", t, "tensor");
    ncclComm_t c = comm("all_reduce_sum");
    if (t.numel() == 0) return;
    nccl_check(nccl().AllReduce(t.data(), t.data(), size_t(t.numel()), ncclFloat32, ncclSum, c, stream_),
               "all_reduce_sum (ncclAllReduce)");
  }

  void all_gather_columns(const Tensor& in, const Tensor& out) override {
    check_device_f32("all_gather_columns", in, "input");
    check_device_f32("all_gather_columns", out, "output");
    FN_CHECK(in.rank() == 2 && out.rank() == 2 && in.dim(0) == out.dim(0) && in.data() != out.data(),
             "tensor parallel: all_gather_columns: input {} and output {} must be [rows, width] with equal rows, "
             "not the same memory",
             in.str(), out.str());
    ncclComm_t c = comm("all_gather_columns");
    const std::vector<int64_t>& w = widths(in.dim(1), out.dim(1), c);
    const int64_t rows = in.dim(0), W = out.dim(1);
    if (rows == 0 || W == 0) return;
    const bool equal = std::all_of(w.begin(), w.end(), [&](int64_t x) { return x == w[0]; });
    if (equal && rows == 1) {  // a decode step's logits: the parts side by side are the output
      nccl_check(nccl().AllGather(in.data(), out.data(), size_t(w[0]), ncclFloat32, c, stream_),
                 "all_gather_columns (ncclAllGather)");
      return;
    }
    // The parts one after another ([rows, w_r] each, in rank order), then each into its columns.
    const Tensor scratch = ops_->empty({rows * W}, DType::F32);
    float* base = static_cast<float*>(scratch.data());
    if (equal) {
      nccl_check(nccl().AllGather(in.data(), base, size_t(rows * w[0]), ncclFloat32, c, stream_),
                 "all_gather_columns (ncclAllGather)");
    } else {
      nccl_check(nccl().GroupStart(), "all_gather_columns (ncclGroupStart)");
      int64_t offset = 0;
      ncclResult_t r = ncclSuccess;
      for (int k = 0; k < world() && r == ncclSuccess; ++k) {
        r = nccl().Broadcast(in.data(), base + offset, size_t(rows * w[size_t(k)]), ncclFloat32, k, c, stream_);
        offset += rows * w[size_t(k)];
      }
      nccl_check(nccl().GroupEnd(), "all_gather_columns (ncclGroupEnd)");
      nccl_check(r, "all_gather_columns (ncclBroadcast)");
    }
    int64_t col = 0, offset = 0;
    for (int k = 0; k < world(); ++k) {
      const int64_t wk = w[size_t(k)];
      if (wk > 0)
        FN_CUDA_CHECK(
            cudaMemcpy2DAsync(static_cast<float*>(out.data()) + col, size_t(W) * 4, base + offset, size_t(wk) * 4,
                              size_t(wk) * 4, size_t(rows), cudaMemcpyDeviceToDevice, stream_),
            "tensor parallel: all_gather_columns (column copy)");
      col += wk;
      offset += rows * wk;
    }
  }

  void abort() override { group_->abort_all(); }
  void reset() override { group_->reset(); }

 private:
  /// This rank's communicator with its GPU current; throws Error once the group was aborted.
  ncclComm_t comm(const char* op) {
    FN_CHECK(!group_->aborted, "tensor parallel: {}: another rank of the group failed (the step was abandoned){}", op,
             group_->unique_id.empty() ? "" : "; a group over several nodes is not made anew: restart every node");
    FN_CUDA_CHECK(cudaSetDevice(device_), "tensor parallel (cudaSetDevice)");
    return group_->comms[size_t(local_)];
  }

  /// Every rank's width for an all_gather_columns into an output `out_width` wide: exchanged the first time (every
  /// rank makes the same calls in the same order, so all of them exchange together), remembered after.
  const std::vector<int64_t>& widths(int64_t mine, int64_t out_width, ncclComm_t c) {
    auto it = widths_.find(out_width);
    if (it == widths_.end()) {
      std::vector<int64_t> all(size_t(world()) + 1);
      all[0] = mine;
      int64_t* d = static_cast<int64_t*>(widths_buf_.data());
      FN_CUDA_CHECK(cudaMemcpyAsync(d, all.data(), 8, cudaMemcpyHostToDevice, stream_),
                    "tensor parallel: all_gather_columns (width upload)");
      nccl_check(nccl().AllGather(d, d + 1, 1, ncclInt64, c, stream_), "all_gather_columns (width exchange)");
      FN_CUDA_CHECK(cudaMemcpyAsync(all.data(), d + 1, 8 * size_t(world()), cudaMemcpyDeviceToHost, stream_),
                    "tensor parallel: all_gather_columns (width download)");
      FN_CUDA_CHECK(cudaStreamSynchronize(stream_), "tensor parallel: all_gather_columns (width exchange)");
      all.resize(size_t(world()));
      int64_t sum = 0;
      for (int64_t x : all) sum += x;
      FN_CHECK(sum == out_width, "tensor parallel: all_gather_columns: the ranks' widths sum to {}, the output is {}",
               sum, out_width);
      it = widths_.emplace(out_width, std::move(all)).first;
    }
    FN_CHECK(it->second[size_t(rank())] == mine,
             "tensor parallel: all_gather_columns: rank {} gives {} columns of a {}-wide output, {} before", rank(),
             mine, out_width, it->second[size_t(rank())]);
    return it->second;
  }

  std::shared_ptr<NcclGroup> group_;
  int local_;
  std::shared_ptr<Ops> ops_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  Tensor widths_buf_;                               ///< device I64 [1 + world]: this rank's width, then all
  std::map<int64_t, std::vector<int64_t>> widths_;  ///< output width -> every rank's part width
};

}  // namespace

bool nccl_available(std::string* why) {
  const NcclLibrary& l = nccl_library();
  if (why) *why = l.error;
  return l.error.empty();
}

std::string nccl_version() {
  int v = 0;
  nccl_check(nccl().GetVersion(&v), "ncclGetVersion");
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

std::vector<uint8_t> nccl_unique_id() {
  ncclUniqueId id;
  nccl_check(nccl().GetUniqueId(&id), "ncclGetUniqueId");
  const auto* p = reinterpret_cast<const uint8_t*>(&id);
  return std::vector<uint8_t>(p, p + sizeof id);
}

std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<std::shared_ptr<Ops>>& ops) {
  return make_nccl_communicators(ops, {}, int(ops.size()), 0);
}

std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<std::shared_ptr<Ops>>& ops,
                                                                   const std::vector<uint8_t>& unique_id, int world,
                                                                   int first_rank) {
  FN_CHECK(!ops.empty(), "tensor parallel: an NCCL group needs at least one rank");
  FN_CHECK(unique_id.empty()
               ? world == int(ops.size()) && first_rank == 0
               : unique_id.size() == sizeof(ncclUniqueId) && first_rank >= 0 && first_rank + int(ops.size()) <= world,
           "tensor parallel: an NCCL group of {} ranks with {} of them here from rank {} and a unique id of {} bytes "
           "(ncclGetUniqueId makes {})",
           world, ops.size(), first_rank, unique_id.size(), sizeof(ncclUniqueId));
  std::vector<int> gpus;
  for (size_t r = 0; r < ops.size(); ++r) {
    const auto* backend = dynamic_cast<const cuda::CudaOps*>(ops[r].get());
    FN_CHECK(backend != nullptr, "tensor parallel: rank {} runs on {}, the NCCL communicator needs CUDA backends", r,
             ops[r] ? ops[r]->name() : std::string("no backend"));
    for (size_t k = 0; k < r; ++k)
      FN_CHECK(gpus[k] != backend->gpu(),
               "tensor parallel: ranks {} and {} are both on GPU {}; NCCL needs one GPU per rank (ranks sharing a GPU "
               "use the staged communicator, parallel/staged_communicator.h)",
               k, r, backend->gpu());
    gpus.push_back(backend->gpu());
  }
  nccl();  // a clear error before anything is made when NCCL is missing
  auto group = std::make_shared<NcclGroup>(gpus, world, first_rank, unique_id);
  std::vector<std::shared_ptr<Communicator>> out;
  for (size_t r = 0; r < ops.size(); ++r) out.push_back(std::make_shared<NcclCommunicator>(group, int(r), ops[r]));
  return out;
}

#else  // no nccl.h at build time

bool nccl_available(std::string* why) {
  if (why) *why = "this build has no NCCL support (nccl.h was not found when it was compiled)";
  return false;
}
std::string nccl_version() {
  fail("tensor parallel: this build has no NCCL support (nccl.h was not found when it was compiled)");
}
std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<std::shared_ptr<Ops>>&) {
  fail("tensor parallel: this build has no NCCL support (nccl.h was not found when it was compiled)");
}
std::vector<uint8_t> nccl_unique_id() {
  fail("tensor parallel: this build has no NCCL support (nccl.h was not found when it was compiled)");
}
std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<std::shared_ptr<Ops>>&,
                                                                   const std::vector<uint8_t>&, int, int) {
  fail("tensor parallel: this build has no NCCL support (nccl.h was not found when it was compiled)");
}

#endif

}  // namespace flashnext
