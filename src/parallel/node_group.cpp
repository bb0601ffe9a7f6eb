#include "parallel/node_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "core/error.h"

namespace flashnext {

namespace {

constexpr uint32_t kMagic = 0x54584e46;  // "FNXT"
constexpr uint32_t kProtocol = 1;
constexpr uint16_t kByteOrder = 0x0102;  // read back as 0x0201 by a machine of the other byte order
enum class Channel : uint8_t { Control = 1, Rank = 2 };

// Collective frames between a remote rank and its proxy on the leader.
enum class Op : uint8_t { AllReduceSum = 1, AllGatherColumns = 2 };
enum class Status : uint8_t { Ok = 0, Failed = 1 };
/// The most floats a collective may carry (16 GiB): a frame announcing more is refused before anything is allocated.
constexpr int64_t kMaxCollectiveFloats = int64_t(1) << 32;

std::span<uint8_t> bytes_of(const Tensor& t) {
  return {static_cast<uint8_t*>(t.data()), size_t(t.nbytes())};
}

}  // namespace

Link& NodeGroup::control(int node) {
  const size_t i = leader() ? size_t(node) : 0;
  FN_CHECK(i < control_.size() && control_[i], "node group: no control link to node {}", node);
  return *control_[i];
}

std::unique_ptr<Link> NodeGroup::take_rank_link(int rank) {
  FN_CHECK(rank >= 0 && rank < world_ && rank_links_[size_t(rank)],
           "node group: node {} has no collective link for rank {} (or it was taken)", node_rank_, rank);
  return std::move(rank_links_[size_t(rank)]);
}

void NodeGroup::shutdown() {
  for (auto& l : control_)
    if (l) l->shutdown();
  for (auto& l : rank_links_)
    if (l) l->shutdown();
}

std::string NodeGroup::describe(int node) const {
  const int n = ranks_per_node(), first = node * n;
  return n == 1 ? fmt::format("node {} (rank {})", node, first)
                : fmt::format("node {} (ranks {}-{})", node, first, first + n - 1);
}

void check_node_options(const NodeOptions& o, int world) {
  FN_CHECK(o.nnodes >= 1, "--nnodes must be >= 1, got {}", o.nnodes);
  FN_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank {} is outside 0..{} (--nnodes {})", o.node_rank,
           o.nnodes - 1, o.nnodes);
  FN_CHECK(world % o.nnodes == 0,
           "--tp {} does not split over --nnodes {}: every node runs the same number of ranks (--tp a multiple of "
           "--nnodes)",
           world, o.nnodes);
  FN_CHECK(o.nnodes == 1 || (o.master_port > 0 && o.master_port < 65536), "--master-port {} is outside 1..65535",
           o.master_port);
  FN_CHECK(o.nnodes == 1 || !o.master_addr.empty(), "--master-addr is empty: name node 0's host or address");
}

std::shared_ptr<NodeGroup> rendezvous(const NodeOptions& o, int world, const std::string& fingerprint,
                                      std::vector<uint8_t> payload) {
  check_node_options(o, world);
  auto g = std::make_shared<NodeGroup>();
  g->nnodes_ = o.nnodes;
  g->node_rank_ = o.node_rank;
  g->world_ = world;
  g->rank_links_.resize(size_t(world));
  if (o.nnodes == 1) {
    g->payload_ = std::move(payload);
    return g;
  }
  const int per_node = world / o.nnodes;
  const std::string me = fmt::format("node {} of {}", o.node_rank, o.nnodes);

  if (o.node_rank > 0) {  // follower: one control link, then one link per own rank
    const std::string what = fmt::format("{}: rendezvous with node 0 at {}:{}", me, o.master_addr, o.master_port);
    auto hello = [&](Channel channel, int rank) {
      WireWriter w;
      w.put(kMagic).put(kProtocol).put(kByteOrder).put(uint8_t(channel)).put(int32_t(o.node_rank)).put(int32_t(rank));
      w.put(fingerprint);
      return w.bytes();
    };
    // Node 0 listens until every node came: a refused connection after it started means it is gone or complete
    // (another process with this --node-rank took the place).
    const std::string hint = fmt::format(
        "is node 0 running with --nnodes {} --master-port {}, and no other process started with --node-rank {}?",
        o.nnodes, o.master_port, o.node_rank);
    std::uint8_t ok = 0;
    std::string error;
    try {
      g->control_.push_back(Link::connect(o.master_addr, o.master_port, o.timeout_s, what));
      g->control_[0]->send(hello(Channel::Control, -1));
      for (int r = g->first_rank(); r < g->first_rank() + per_node; ++r) {
        g->rank_links_[size_t(r)] = Link::connect(o.master_addr, o.master_port, o.timeout_s, what);
        g->rank_links_[size_t(r)]->send(hello(Channel::Rank, r));
      }
      FN_CHECK(g->control_[0]->wait_readable(o.timeout_s), "{}: node 0 did not answer within {} s", what, o.timeout_s);
      const std::vector<uint8_t> answer = g->control_[0]->recv(1 << 20);
      WireReader rd(answer, what);
      ok = rd.get<uint8_t>();
      error = rd.get_string();
      g->payload_ = rd.get_vector<uint8_t>();
      rd.finish();
    } catch (const Error& e) {  // no flashnext node 0 there, or it went away: say what to check
      g->shutdown();
      fail("{} ({})", e.what(), hint);
    }
    if (!ok) fail("{}: node 0 refused this node: {}", me, error);
    return g;
  }

  // Leader: accept every other node's control link and rank links, check them, then answer every node.
  g->payload_ = std::move(payload);
  g->control_.resize(size_t(o.nnodes));
  Listener listener(o.master_port);
  const int expected = (o.nnodes - 1) * (1 + per_node);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.timeout_s);
  std::string error;  // the first problem found; every node is told
  std::vector<std::unique_ptr<Link>> strays;
  for (int got = 0; got < expected;) {
    if (!error.empty())  // a misconfigured node: the links on their way still come (and are told), then the answer
      deadline = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::duration<double>(2.0));
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    std::unique_ptr<Link> link;
    try {
      if (left <= 0) throw Error("timeout");
      link = listener.accept(left, me);
    } catch (const Error&) {
      if (!error.empty()) break;
      std::string missing;
      for (int n = 1; n < o.nnodes; ++n) {
        bool complete = g->control_[size_t(n)] != nullptr;
        for (int r = n * per_node; r < (n + 1) * per_node; ++r) complete = complete && g->rank_links_[size_t(r)];
        if (!complete) missing += (missing.empty() ? "" : ", ") + g->describe(n);
      }
      g->shutdown();
      fail(
          "{}: rendezvous on port {}: within {} s these nodes did not connect (all of their links): {}; start them "
          "with --nnodes {} --node-rank R --master-addr <this host> --master-port {}",
          me, o.master_port, o.timeout_s, missing, o.nnodes, o.master_port);
    }
    // What a connection says first: a node's hello, within a few seconds (a port probe that says nothing or
    // something else is dropped, not counted: a real node may still come).
    const std::string from = fmt::format("{}: rendezvous: connection from {}", me, link->peer());
    Channel channel{};
    int node = -1, rank = -1;
    std::string theirs;
    try {
      FN_CHECK(link->wait_readable(std::min(5.0, std::max(0.1, left))), "{}: said nothing", from);
      const std::vector<uint8_t> hello = link->recv(1 << 20);
      WireReader rd(hello, from);
      const uint32_t magic = rd.get<uint32_t>(), protocol = rd.get<uint32_t>();
      const uint16_t order = rd.get<uint16_t>();
      FN_CHECK(magic == kMagic && protocol == kProtocol && order == kByteOrder,
               "{} is not a flashnext node of this version (protocol {}, byte order mark {:#x})", from, protocol,
               order);
      channel = Channel(rd.get<uint8_t>());
      node = rd.get<int32_t>(), rank = rd.get<int32_t>();
      theirs = rd.get_string();
      rd.finish();
    } catch (const Error& e) {
      spdlog::warn("{} (ignored)", e.what());
      continue;
    }
    if (node < 1 || node >= o.nnodes) {
      if (error.empty())
        error = fmt::format("a node started with --node-rank {} connected ({}); --nnodes {} allows 1..{}", node,
                            link->peer(), o.nnodes, o.nnodes - 1);
      strays.push_back(std::move(link));
      continue;
    }
    if (theirs != fingerprint && error.empty())
      error = fmt::format("node {} was started with other settings than node 0: node {}: {}; node 0: {}", node, node,
                          theirs, fingerprint);
    std::unique_ptr<Link>* slot = nullptr;
    if (channel == Channel::Control) {
      slot = &g->control_[size_t(node)];
    } else if (rank >= node * per_node && rank < (node + 1) * per_node) {
      slot = &g->rank_links_[size_t(rank)];
    }
    if (!slot || *slot) {
      if (error.empty())
        error = fmt::format("two nodes were started with --node-rank {} (the second from {})", node, link->peer());
      strays.push_back(std::move(link));
      continue;
    }
    *slot = std::move(link);
    ++got;
  }
  for (int n = 1; n < o.nnodes; ++n) {
    WireWriter w;
    w.put(uint8_t(error.empty())).put(error).put(g->payload_);
    if (g->control_[size_t(n)]) g->control_[size_t(n)]->send(w.bytes());
  }
  for (auto& s : strays) {  // a duplicate node's control link learns why too (its rank links just close)
    try {
      WireWriter w;
      w.put(uint8_t(0)).put(error).put(std::vector<uint8_t>{});
      s->send(w.bytes());
    } catch (const Error&) {
    }
  }
  if (!error.empty()) {
    g->shutdown();
    fail("{}: {}", me, error);
  }
  return g;
}

namespace {

/// The leader's proxies of the remote ranks: a thread per remote rank that plays it in the CPU group.
class Proxies {
 public:
  Proxies(std::shared_ptr<NodeGroup> group, std::vector<std::shared_ptr<Communicator>> comms)
      : group_(std::move(group)), comms_(std::move(comms)) {
    const int per_node = group_->ranks_per_node();
    for (int r = per_node; r < group_->world(); ++r) {
      links_.push_back(group_->take_rank_link(r));
      threads_.emplace_back([this, r, link = links_.back().get()] { run(r, *comms_[size_t(r)], *link); });
    }
  }
  ~Proxies() {
    // A proxy waits either on its link or in the group's barrier (its rank's node ran a step that node 0 did not):
    // both are ended, and the one in the barrier still tells its rank why before the links close.
    for (auto& c : comms_) c->abort("node 0 closed the group");
    for (auto& l : links_) l->stop_reading();
    for (auto& t : threads_) t.join();
    for (auto& l : links_) l->shutdown();
  }

 private:
  void run(int rank, Communicator& comm, Link& link) {
    const std::string who = fmt::format("rank {} (node {})", rank, rank / group_->ranks_per_node());
    for (;;) {
      Tensor in, out;
      Op op{};
      try {
        const std::vector<uint8_t> header = link.recv(1 << 16);
        WireReader rd(header, "tensor parallel: " + who);
        op = Op(rd.get<uint8_t>());
        const std::vector<int64_t> shape = rd.get_vector<int64_t>();
        const int64_t out_width = rd.get<int64_t>();
        rd.finish();
        FN_CHECK((op == Op::AllReduceSum || op == Op::AllGatherColumns) && shape.size() <= 8,
                 "tensor parallel: {} sent an unknown collective", who);
        // Sizes a step can have (at most kMaxCollectiveFloats floats in and out), before anything is allocated.
        int64_t n = 1;
        for (int64_t d : shape) {
          FN_CHECK(d >= 0 && (d == 0 || n <= kMaxCollectiveFloats / d), "tensor parallel: {} sent a collective of {}",
                   who, fmt::join(shape, " x "));
          n *= d;
        }
        FN_CHECK(
            out_width >= 0 && (op == Op::AllReduceSum ||
                               (shape.size() == 2 && (shape[0] == 0 || out_width <= kMaxCollectiveFloats / shape[0]))),
            "tensor parallel: {} sent a gather of {} into {} columns", who, fmt::join(shape, " x "), out_width);
        in = host_f32(Shape(shape.begin(), shape.end()));
        link.recv_into(bytes_of(in));
        if (op == Op::AllGatherColumns) {
          FN_CHECK(in.rank() == 2, "tensor parallel: {}: all_gather_columns of {}", who, in.str());
          out = host_f32({in.dim(0), out_width});
        }
      } catch (const std::exception& e) {  // the rank's node failed or left (or sent nonsense): the group fails
        comm.abort(fmt::format("{} left the group ({})", who, e.what()));
        return;
      }
      try {
        if (op == Op::AllReduceSum) {
          comm.all_reduce_sum(in);
          out = in;
        } else {
          comm.all_gather_columns(in, out);
        }
      } catch (const std::exception& e) {  // the group failed: tell the rank why, and stop
        try {
          WireWriter w;
          w.put(uint8_t(Status::Failed)).put(std::string(e.what()));
          link.send(w.bytes());
        } catch (const Error&) {
        }
        return;
      }
      try {
        WireWriter w;
        w.put(uint8_t(Status::Ok)).put(std::string());
        link.send(w.bytes());
        link.send(bytes_of(out));
      } catch (const Error& e) {
        comm.abort(fmt::format("{} left the group ({})", who, e.what()));
        return;
      }
    }
  }

  std::shared_ptr<NodeGroup> group_;
  std::vector<std::shared_ptr<Communicator>> comms_;  ///< the whole CPU group, every rank's
  std::vector<std::unique_ptr<Link>> links_;
  std::vector<std::thread> threads_;
};

/// A leader rank: its place in the CPU group, and a share of the proxies (which end with the last of them).
class LeaderCommunicator final : public Communicator {
 public:
  LeaderCommunicator(std::shared_ptr<Communicator> inner, std::shared_ptr<Proxies> proxies)
      : inner_(std::move(inner)), proxies_(std::move(proxies)) {}
  int rank() const override { return inner_->rank(); }
  int world() const override { return inner_->world(); }
  const char* kind() const override { return "cpu nodes"; }
  void all_reduce_sum(const Tensor& t) override { inner_->all_reduce_sum(t); }
  void all_gather_columns(const Tensor& in, const Tensor& out) override { inner_->all_gather_columns(in, out); }
  void abort() override { inner_->abort(); }
  void abort(const std::string& reason) override { inner_->abort(reason); }
  void reset() override { inner_->reset(); }

 private:
  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<Proxies> proxies_;
};

/// A follower rank: every collective goes to its proxy on the leader and back.
class RemoteCommunicator final : public Communicator {
 public:
  RemoteCommunicator(int rank, int world, std::unique_ptr<Link> link)
      : rank_(rank), world_(world), link_(std::move(link)) {}
  ~RemoteCommunicator() override { link_->shutdown(); }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  const char* kind() const override { return "cpu nodes"; }

  void all_reduce_sum(const Tensor& t) override {
    check_host_f32("all_reduce_sum", t, "tensor");
    exchange(Op::AllReduceSum, t, 0, t);
  }
  void all_gather_columns(const Tensor& in, const Tensor& out) override {
    check_host_gather(in, out);
    exchange(Op::AllGatherColumns, in, out.dim(1), out);
  }
  void abort() override {
    std::lock_guard lock(mu_);
    failed_ = true;
    link_->shutdown();  // wakes this rank if it waits for the leader; the leader's proxy sees the link close
  }
  void abort(const std::string&) override { abort(); }

 private:
  void exchange(Op op, const Tensor& in, int64_t out_width, const Tensor& out) {
    {
      std::lock_guard lock(mu_);
      if (failed_)
        fail("tensor parallel: rank {}: the group across nodes failed in an earlier step; restart every node", rank_);
    }
    WireWriter w;
    w.put(uint8_t(op)).put(std::vector<int64_t>(in.shape().begin(), in.shape().end())).put(out_width);
    try {
      link_->send(w.bytes());
      link_->send(bytes_of(in));
      const std::vector<uint8_t> status = link_->recv(1 << 20);
      WireReader rd(status, fmt::format("tensor parallel: rank {}: node 0", rank_));
      const auto s = Status(rd.get<uint8_t>());
      const std::string why = rd.get_string();
      if (s != Status::Ok) fail("node 0 ended the step: {}", why);
      link_->recv_into(bytes_of(out));
    } catch (const Error& e) {
      {
        std::lock_guard lock(mu_);
        failed_ = true;
      }
      link_->shutdown();
      fail("tensor parallel: rank {}: {}", rank_, e.what());
    }
  }

  const int rank_, world_;
  std::unique_ptr<Link> link_;
  std::mutex mu_;
  bool failed_ = false;
};

}  // namespace

std::vector<std::shared_ptr<Communicator>> make_node_communicators(const std::shared_ptr<NodeGroup>& group) {
  FN_CHECK(group && group->nnodes() > 1, "make_node_communicators: a group of one node (use make_cpu_communicators)");
  std::vector<std::shared_ptr<Communicator>> out;
  if (group->leader()) {
    auto all = make_cpu_communicators(group->world(), CpuGroupOptions{.final_failures = true});
    auto proxies = std::make_shared<Proxies>(group, all);
    for (int r = 0; r < group->ranks_per_node(); ++r)
      out.push_back(std::make_shared<LeaderCommunicator>(all[size_t(r)], proxies));
    return out;
  }
  for (int r = group->first_rank(); r < group->first_rank() + group->ranks_per_node(); ++r)
    out.push_back(std::make_shared<RemoteCommunicator>(r, group->world(), group->take_rank_link(r)));
  return out;
}

}  // namespace flashnext
