#include "parallel/staged_communicator.h"

#include "core/error.h"

namespace flashnext {
namespace {

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::shared_ptr<Communicator> host, std::shared_ptr<Ops> ops)
      : host_(std::move(host)), ops_(std::move(ops)) {}
  int rank() const override { return host_->rank(); }
  int world() const override { return host_->world(); }
  const char* kind() const override { return "staged through host memory"; }

  void all_reduce_sum(const Tensor& t) override {
    if (t.device() == Device::CPU) return host_->all_reduce_sum(t);
    Tensor h = to_host(t, "all_reduce_sum");
    host_->all_reduce_sum(h);
    back_to_device(h, t);
  }

  void all_gather_columns(const Tensor& in, const Tensor& out) override {
    if (in.device() == Device::CPU && out.device() == Device::CPU) return host_->all_gather_columns(in, out);
    FN_CHECK(out.device() == in.device(),
             "tensor parallel: all_gather_columns: input {} and output {} on other devices", in.str(), out.str());
    Tensor hi = to_host(in, "all_gather_columns"), ho = host_f32(out.shape());
    host_->all_gather_columns(hi, ho);
    back_to_device(ho, out);
  }

  void abort() override { host_->abort(); }
  void abort(const std::string& reason) override { host_->abort(reason); }
  void reset() override { host_->reset(); }

 private:
  Tensor to_host(const Tensor& t, const char* op) {
    FN_CHECK(t.dtype() == DType::F32, "tensor parallel: {}: {} must be F32", op, t.str());
    Tensor h = host_f32(t.shape());
    ops_->download(t, h.data());  // waits for the rank's queue
    return h;
  }
  /// dst (on the rank's device) = h, through an upload and a copy on the rank's queue.
  void back_to_device(const Tensor& h, const Tensor& dst) {
    const Tensor up = ops_->upload(h.data(), DType::F32, dst.shape());
    ops_->copy_rows(up, 0, dst, 0, dst.rank() ? dst.dim(0) : 1);
  }

  std::shared_ptr<Communicator> host_;
  std::shared_ptr<Ops> ops_;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_staged_communicators(const std::vector<std::shared_ptr<Ops>>& ops) {
  FN_CHECK(!ops.empty(), "tensor parallel: a staged communicator group needs at least one rank");
  return make_staged_communicators(ops, make_cpu_communicators(int(ops.size())));
}

std::vector<std::shared_ptr<Communicator>> make_staged_communicators(const std::vector<std::shared_ptr<Ops>>& ops,
                                                                     std::vector<std::shared_ptr<Communicator>> host) {
  FN_CHECK(!ops.empty() && ops.size() == host.size(),
           "tensor parallel: a staged communicator group of {} backends over {} host communicators", ops.size(),
           host.size());
  std::vector<std::shared_ptr<Communicator>> out;
  for (size_t r = 0; r < ops.size(); ++r) {
    FN_CHECK(ops[r] != nullptr, "tensor parallel: rank {} has no backend", r);
    out.push_back(std::make_shared<StagedCommunicator>(host[r], ops[r]));
  }
  return out;
}

}  // namespace flashnext
