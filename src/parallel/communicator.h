// Collectives of a tensor-parallel group (docs/ENGINE.md "Tensor parallelism").
//
// A group of `world` ranks runs one model split across them (loader/sharding.h says what each rank holds); a rank
// computes its part of a step and the ranks combine partial results through a Communicator: all_reduce_sum after
// every row-parallel product (GDN out_proj, QSA o_proj, the MoE block), after the vocabulary-parallel embedding and
// the row-sharded PLE gather, and all_gather_columns for the vocabulary-parallel lm_head. Every call is collective:
// all ranks of the group make the same calls in the same order with tensors of matching shapes.
//
// Implementations:
// - CPU (make_cpu_communicators): the ranks are threads of one process over host tensors; reductions sum the ranks'
//   values in rank order 0, 1, ..., N-1 for every element, so the result does not depend on thread timing and is the
//   same on every rank.
// - NCCL (ops/cuda, a CUDA build): one communicator per GPU, collectives enqueued on the rank's CUDA stream.
// - Several processes (nodes; parallel/node_group.h): each process drives only its own ranks. Over host tensors the
//   CPU group of the first node stands for every rank, the ranks of the other nodes played by proxy threads that
//   carry their tensors over TCP (the same rank-order sums as in one process); CUDA ranks use an NCCL communicator
//   made from a unique id handed out at the rendezvous.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/tensor.h"

namespace flashnext {

/// One rank's end of a tensor-parallel group. Not thread-safe: each rank calls its own communicator from one thread.
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This rank's index in [0, world).
  virtual int rank() const = 0;
  /// Ranks in the group (1: no tensor parallelism; every collective is then the identity).
  virtual int world() const = 0;
  /// A short description ("cpu threads", "nccl").
  virtual const char* kind() const = 0;

  /// In place: t = sum over ranks of t. F32, contiguous, the same shape on every rank. Throws Error for a tensor of
  /// another dtype or device, for mismatched shapes across ranks, and when another rank of the group failed (abort).
  virtual void all_reduce_sum(const Tensor& t) = 0;

  /// out [rows, sum_r w_r] = the ranks' in_r [rows, w_r] side by side in rank order (columns of rank r start at
  /// w_0 + ... + w_{r-1}). F32; widths may differ between ranks, rows may not. `out` must not alias `in`. Throws
  /// Error as all_reduce_sum does, and when out's width is not the sum of the ranks' widths.
  virtual void all_gather_columns(const Tensor& in, const Tensor& out) = 0;

  /// Wakes every rank blocked in (or later entering) a collective of this group with an Error: called by a rank whose
  /// step failed, so that the others do not wait for it forever. The group stays failed until reset().
  virtual void abort() {}
  /// abort() saying why: the Error that the other ranks' collectives throw carries `reason` where the implementation
  /// can pass it on (the CPU group; the first reason wins).
  virtual void abort(const std::string& reason) {
    (void)reason;
    abort();
  }
  /// Clears a failure (called once no rank is inside a collective, after the failed step was abandoned).
  virtual void reset() {}
};

/// The communicator of a group of one: rank 0 of 1, every collective the identity (all_gather_columns copies).
std::shared_ptr<Communicator> make_single_communicator();

/// A group of `world` ranks that are threads of this process, over CPU tensors (the CPU oracle's tensor
/// parallelism). Element i of all_reduce_sum is ((t_0[i] + t_1[i]) + t_2[i]) + ... in float32, the same on every
/// rank whatever the threads' timing. Throws Error for world < 1.
std::vector<std::shared_ptr<Communicator>> make_cpu_communicators(int world);

/// Options of a CPU group whose ranks are not all threads of this process (parallel/node_group.h).
struct CpuGroupOptions {
  /// A failure is final: once aborted, every collective throws Error (with the abort's reason) and reset() does not
  /// clear it (a step abandoned across processes cannot be resumed by the ranks of one of them).
  bool final_failures = false;
};

/// A host F32 tensor of `shape` that owns its memory (uninitialised): the staging buffers of the collectives.
Tensor host_f32(const Shape& shape);

/// Throws Error unless `t` is an F32 CPU tensor (what the host collectives read and write), naming `op` and `what`.
void check_host_f32(const char* op, const Tensor& t, const char* what);

/// The checks of a host all_gather_columns: `in` and `out` F32 CPU tensors, both [rows, width] with equal rows.
/// Throws Error naming them.
void check_host_gather(const Tensor& in, const Tensor& out);

/// make_cpu_communicators with `options`.
std::vector<std::shared_ptr<Communicator>> make_cpu_communicators(int world, const CpuGroupOptions& options);

}  // namespace flashnext
