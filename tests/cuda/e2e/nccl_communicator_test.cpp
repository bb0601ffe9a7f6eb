// The NCCL communicator (ops/cuda/nccl_communicator.h) on one GPU: a group of one moves data as the contract says
// (all_reduce_sum the identity, all_gather_columns a copy, both the decode and the strided form), a group it cannot
// make is refused with the reason, and abort / reset behave as parallel/communicator.h says. Several ranks over
// NCCL: model_e2e_test.cpp MultiGpu* (machines with several GPUs).
#include "ops/cuda/nccl_communicator.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/cuda/cuda_ops.h"

namespace flashnext::test {
namespace {

std::vector<float> iota_values(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::vector<float> download(Ops& ops, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  ops.download(t, v.data());
  return v;
}

TEST(NcclCommunicator, GroupOfOneMovesDataAsTheContractSays) {
  std::string why;
  ASSERT_TRUE(nccl_available(&why)) << why;
  auto ops = make_cuda_ops(0);
  auto comms = make_nccl_communicators({ops});
  ASSERT_EQ(comms.size(), 1u);
  Communicator& c = *comms[0];
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.world(), 1);
  EXPECT_STREQ(c.kind(), "nccl");
  std::printf("NCCL %s\n", nccl_version().c_str());

  const std::vector<float> a = iota_values(7 * 33, -50.f);
  const Tensor t = ops->upload(a.data(), DType::F32, {7, 33});
  c.all_reduce_sum(t);
  EXPECT_EQ(download(*ops, t), a);  // the sum over one rank

  for (int64_t rows : {1, 5}) {  // the decode form (one row) and the strided copy
    const std::vector<float> b = iota_values(size_t(rows) * 13, 3.f);
    const Tensor in = ops->upload(b.data(), DType::F32, {rows, 13});
    const Tensor out = ops->zeros({rows, 13}, DType::F32);
    c.all_gather_columns(in, out);
    EXPECT_EQ(download(*ops, out), b) << rows << " rows";
  }
  // A width that does not add up to the output's: refused, naming both.
  const Tensor in = ops->zeros({2, 4}, DType::F32), out = ops->zeros({2, 6}, DType::F32);
  try {
    c.all_gather_columns(in, out);
    FAIL() << "a 4-wide part of a 6-wide output was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum to 4, the output is 6"), std::string::npos) << e.what();
  }
}

TEST(NcclCommunicator, RefusesWhatNcclCannotDo) {
  auto a = make_cuda_ops(0), b = make_cuda_ops(0);
  try {
    make_nccl_communicators({a, b});
    FAIL() << "two ranks on GPU 0 were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("both on GPU 0"), std::string::npos) << e.what();
  }
  try {
    make_nccl_communicators({make_cpu_ops(1)});
    FAIL() << "a CPU backend was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs CUDA backends"), std::string::npos) << e.what();
  }
  const Tensor host = make_cpu_ops(1)->zeros({4}, DType::F32);
  auto comms = make_nccl_communicators({a});
  EXPECT_THROW(comms[0]->all_reduce_sum(host), Error);  // a host tensor
}

TEST(NcclCommunicator, AbortFailsCollectivesUntilReset) {
  auto ops = make_cuda_ops(0);
  auto comms = make_nccl_communicators({ops});
  const std::vector<float> a = iota_values(64, 1.f);
  const Tensor t = ops->upload(a.data(), DType::F32, {64});
  comms[0]->abort();
  try {
    comms[0]->all_reduce_sum(t);
    FAIL() << "a collective ran after abort";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another rank of the group failed"), std::string::npos) << e.what();
  }
  comms[0]->reset();  // the group is made anew
  comms[0]->all_reduce_sum(t);
  EXPECT_EQ(download(*ops, t), a);
}

}  // namespace
}  // namespace flashnext::test
