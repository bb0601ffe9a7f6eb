// The NCCL communicator: the collectives of a tensor-parallel group whose ranks are CUDA backends on distinct GPUs of
// this process, or of several processes (a group made with ncclCommInitRank from a unique id handed out at the
// rendezvous, parallel/node_group.h) (parallel/communicator.h has the contract; docs/ENGINE.md "Tensor parallelism"
// the design).
//
// Each collective is enqueued on the rank's work stream (CudaOps::work_stream), after the ops that made its input
// and before those that read its output, and returns without waiting: the host of a rank runs ahead as it does
// without tensor parallelism. all_reduce_sum is ncclAllReduce (in place, float32 sum; NCCL's ring and tree
// algorithms give every rank the same bits, so every rank routes and samples alike, although the order of the sum
// is NCCL's, not the CPU communicator's rank order). all_gather_columns gathers the ranks' [rows, w_r] parts into a
// [world, rows, w_max] scratch (ncclAllGather when the widths are equal, one ncclBroadcast per rank in a group when
// they differ) and copies each part into its columns of the output; the widths are exchanged once per output width
// (one ncclAllGather of int64 and a wait) and remembered.
//
// NCCL is loaded at run time (dlopen of libnccl.so.2, or the file FLASHNEXT_NCCL_LIBRARY names), so a binary runs
// on a machine without NCCL and only `--tp N --device cuda` needs it. Shapes are not compared across ranks (that
// would cost a host barrier per collective): the model makes them equal by construction, and the CPU communicator's
// tests check it. abort() aborts every communicator of the group (ncclCommAbort), which ends the collectives the
// other ranks' GPUs wait in; reset() makes the group anew (ncclCommInitAll).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "parallel/communicator.h"

namespace flashnext {

/// Whether NCCL can be loaded; when not, `why` (if given) says what was tried and why it failed.
bool nccl_available(std::string* why = nullptr);

/// The loaded NCCL's version ("2.28.3"). Throws Error when NCCL cannot be loaded.
std::string nccl_version();

/// One communicator per rank, rank r on the GPU of ops[r] (CUDA backends, make_cuda_ops), a group made with
/// ncclCommInitAll. A group of one is valid (every collective then goes through NCCL all the same). Throws Error for
/// an empty list, a backend that is not CUDA, two ranks on one GPU (NCCL refuses that: use
/// parallel/staged_communicator.h), NCCL that cannot be loaded (naming the file and FLASHNEXT_NCCL_LIBRARY), and an
/// NCCL error (its message).
std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<std::shared_ptr<Ops>>& ops);

/// A new NCCL unique id (ncclGetUniqueId, its bytes) for a group over several processes: node 0 makes it and hands
/// it to the other nodes at the rendezvous (parallel/node_group.h). Throws Error as make_nccl_communicators does.
std::vector<uint8_t> nccl_unique_id();

/// This process's communicators of a group of `world` ranks spread over several processes: ops[i] (its own GPU) is
/// rank first_rank + i, made with ncclCommInitRank from `unique_id` (every process of the group calls this with the
/// same id; the call returns once all of them did). A failure of such a group is final (reset() does not make it
/// anew; later collectives throw Error). An empty `unique_id` with world = ops.size() and first_rank 0 is the group of
/// one process above. Throws Error as that one does, and for an id of the wrong size or ranks outside the world.
std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<std::shared_ptr<Ops>>& ops,
                                                                   const std::vector<uint8_t>& unique_id, int world,
                                                                   int first_rank);

}  // namespace flashnext
