// Tensor parallelism over several processes ("nodes"; docs/ENGINE.md "Tensor parallelism", several nodes).
//
// The same command runs on every node with `--tp N --nnodes M --node-rank R --master-addr A --master-port P`
// (torchrun's names). Each node drives N/M consecutive ranks: node R holds ranks R*N/M .. (R+1)*N/M - 1. Node 0
// (the leader) runs the command itself (generate, serve, ...); the other nodes (followers) load their ranks and then
// repeat the leader's model calls on them (Model::follow), so that their collectives meet the leader's.
//
// rendezvous(): node 0 listens on port P; every other node connects to A:P, once for its control link (the model
// calls it receives) and once per rank for the collectives, and states the settings it was started with (a
// fingerprint: TP degree, node count, device, model geometry). Node 0 checks every node's node rank (in range,
// not taken twice) and fingerprint against its own and answers each node either with the payload (the NCCL unique
// id of a CUDA group; nothing for the CPU) or with the error, which both ends then throw. Nodes that do not all
// arrive within the timeout fail the rendezvous with an Error naming them.
//
// Collectives of host tensors (make_node_communicators): the leader's CPU group (parallel/communicator.h, rank-order
// sums) has all N ranks; the leader's own ranks take part directly, and a proxy thread per remote rank receives that
// rank's tensor over its link, takes its place in the group and sends the result back. So the sums are the same
// float32 operations, in the same order, as with every rank in one process. A failure is final for the group: a step
// that fails on one node fails on every node (the other nodes' collectives throw with the reason, or with the link
// that broke), and later steps fail at once; restart every node.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/tcp_link.h"

namespace flashnext {

/// Where this process sits in a group of nodes.
struct NodeOptions {
  int nnodes = 1;                         ///< processes of the group (1: no other process)
  int node_rank = 0;                      ///< this one's index; 0 is the leader
  std::string master_addr = "127.0.0.1";  ///< the leader's host name or address (followers connect to it)
  int master_port = 29500;                ///< the port the leader listens on
  double timeout_s = 300;                 ///< how long the rendezvous waits for the other nodes
};

/// The links of one node, made by rendezvous().
class NodeGroup {
 public:
  int nnodes() const { return nnodes_; }
  int node_rank() const { return node_rank_; }
  bool leader() const { return node_rank_ == 0; }
  /// Ranks of the whole group (the TP degree) and of each node.
  int world() const { return world_; }
  int ranks_per_node() const { return world_ / nnodes_; }
  /// This node's first rank.
  int first_rank() const { return node_rank_ * ranks_per_node(); }
  /// What the leader handed every node at the rendezvous (the NCCL unique id of a CUDA group; may be empty).
  const std::vector<uint8_t>& payload() const { return payload_; }
  /// Leader: the control link of follower node `node` (1 .. nnodes-1). Follower: its link to the leader (node 0).
  Link& control(int node);
  /// The collective link of rank `rank`: on the leader one per rank of the other nodes, on a follower one per own
  /// rank. Taken once (by the communicator that uses it). Throws Error for a rank without one or taken already.
  std::unique_ptr<Link> take_rank_link(int rank);
  /// Shuts every link down (a follower blocked in a call wakes with an Error, its process ends).
  void shutdown();
  /// "node 1 (ranks 2-3)".
  std::string describe(int node) const;

 private:
  friend std::shared_ptr<NodeGroup> rendezvous(const NodeOptions&, int, const std::string&, std::vector<uint8_t>);
  int nnodes_ = 1, node_rank_ = 0, world_ = 1;
  std::vector<uint8_t> payload_;
  std::vector<std::unique_ptr<Link>> control_;     ///< leader: per node (index 0 unused); follower: [0] = leader
  std::vector<std::unique_ptr<Link>> rank_links_;  ///< per global rank (null where none)
};

/// Checks `options` against `world` (the TP degree): nnodes >= 1, node_rank in [0, nnodes), nnodes dividing world,
/// a port in range. Throws Error naming the flag (--nnodes, --node-rank, --master-port, --tp).
void check_node_options(const NodeOptions& options, int world);

/// Makes the group's links (see the file comment). `fingerprint`: this node's settings, which every node must share;
/// `payload`: what the leader hands the other nodes (ignored on followers). With nnodes 1: a group of one node
/// without links. Throws Error for bad options (check_node_options), a port that cannot be listened on, a leader that
/// cannot be reached or nodes that do not arrive within options.timeout_s, a node rank given twice, a fingerprint
/// that differs from the leader's (on both ends, naming both), and a connection that is not a flashnext node.
std::shared_ptr<NodeGroup> rendezvous(const NodeOptions& options, int world, const std::string& fingerprint,
                                      std::vector<uint8_t> payload = {});

/// The communicators of this node's ranks (ranks_per_node of them, in rank order) for host tensors (CPU backends),
/// over the group's rank links (see the file comment). The leader starts one proxy thread per remote rank; they end
/// when the group fails or the links close. Communicator::kind() is "cpu nodes". Throws Error when the group has one
/// node (use make_cpu_communicators) or a rank link was taken already.
std::vector<std::shared_ptr<Communicator>> make_node_communicators(const std::shared_ptr<NodeGroup>& group);

}  // namespace flashnext
