// A communicator for ranks whose tensors live on a device backend that has no collective library of its own here:
// several ranks sharing one GPU (the CUDA sharding math tested on a one-GPU machine), or GPUs until the NCCL
// communicator exists (issue 15). Each collective downloads the rank's tensor (Ops::download, which waits for the
// rank's queue), combines the host copies through the CPU communicator (make_cpu_communicators: rank-order float32
// sums, the same values on every rank), and copies the result back into the rank's tensor. Correct, and slow: two
// host round trips per collective.
#pragma once

#include <memory>
#include <vector>

#include "ops/ops.h"
#include "parallel/communicator.h"

namespace flashnext {

/// One communicator per rank, rank r going through ops[r] (any backend; CPU tensors are combined directly). Throws
/// Error for an empty list or a null backend. The collectives throw Error as the CPU communicator's do (shapes,
/// dtypes, a failed rank).
std::vector<std::shared_ptr<Communicator>> make_staged_communicators(const std::vector<std::shared_ptr<Ops>>& ops);

/// The same over given host communicators (host[r] for ops[r]): the node communicators of a group over several
/// processes (parallel/node_group.h), so that ranks on one GPU in several processes can work together. Throws Error
/// when the lists differ in length or are empty.
std::vector<std::shared_ptr<Communicator>> make_staged_communicators(const std::vector<std::shared_ptr<Ops>>& ops,
                                                                     std::vector<std::shared_ptr<Communicator>> host);

}  // namespace flashnext
