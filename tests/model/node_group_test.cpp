// Tensor parallelism over several processes (issue 15; parallel/node_group.h): the rendezvous, the collectives
// between nodes and the model whose ranks live in several nodes, each node a thread of this test standing for a
// process (the links are real TCP connections over loopback). The leader's CPU group sums every rank's values in
// rank order, so TP N over nodes gives the same bits as TP N in one process; a node that fails or leaves fails the
// group with an Error on every node, never a hang.
#include "parallel/node_group.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>

#include "batched_greedy.h"
#include "core/error.h"
#include "engine/speculative.h"
#include "fixture.h"
#include "parallel/rank_threads.h"

namespace flashnext::test {
namespace {

constexpr const char* kTinyA = "tests/data/fixtures/tiny-a/model";

/// A free TCP port (bound and let go; the rendezvous binds it again at once).
int free_port() {
  return Listener(0).port();
}

/// The rendezvous of every node of a group at once (one thread each); the groups in node order. Rethrows the first
/// node's Error.
std::vector<std::shared_ptr<NodeGroup>> make_groups(int world, int nnodes, const std::string& fingerprint = "test") {
  const int port = free_port();
  std::vector<std::shared_ptr<NodeGroup>> groups(static_cast<size_t>(nnodes));
  std::vector<std::string> errors(static_cast<size_t>(nnodes));
  std::vector<std::thread> threads;
  for (int n = 0; n < nnodes; ++n)
    threads.emplace_back([&, n] {
      try {
        groups[size_t(n)] = rendezvous({nnodes, n, "127.0.0.1", port, 20}, world, fingerprint);
      } catch (const Error& e) {
        errors[size_t(n)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw Error(e);
  return groups;
}

/// Runs job(node, local rank index, communicator) for every rank of every node at once: per node a RankThreads over
/// its communicators, as a process would. Returns each node's Error message ("" when it ran through).
std::vector<std::string> run_nodes(const std::vector<std::shared_ptr<NodeGroup>>& groups,
                                   const std::function<void(int, int, Communicator&)>& job) {
  std::vector<std::vector<std::shared_ptr<Communicator>>> comms;
  for (const auto& g : groups) comms.push_back(make_node_communicators(g));
  std::vector<std::string> errors(groups.size());
  std::vector<std::thread> threads;
  for (size_t n = 0; n < groups.size(); ++n)
    threads.emplace_back([&, n] {
      RankThreads rt(int(comms[n].size()), comms[n], 20);
      try {
        rt.run([&](int i) { job(int(n), i, *comms[n][size_t(i)]); });
      } catch (const Error& e) {
        errors[n] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ------------------------------------------------------------------------------------------ collectives

// all_reduce_sum over nodes adds the ranks' values in rank order, as the CPU group of one process does (magnitudes
// far apart, so that another order would show in the rounding), and every rank of every node gets the sum;
// all_gather_columns places uneven widths in rank order.
TEST(NodeCommunicator, AllReduceAndAllGatherMatchOneProcess) {
  for (auto [world, nnodes] : {std::pair{2, 2}, {4, 2}, {3, 3}}) {
    auto groups = make_groups(world, nnodes);
    const int per = world / nnodes;
    const int64_t n = 1001;
    auto value = [](int r, int64_t i) {
      return float((r % 2 ? -1 : 1) * std::pow(10.0, double((i + 3 * r) % 9) - 4) * (1 + 0.37 * r));
    };
    std::vector<std::vector<float>> got(static_cast<size_t>(world)), gathered(static_cast<size_t>(world));
    const int64_t rows = 3;
    auto width = [](int r) { return int64_t(r % 3 + 1); };
    int64_t total = 0;
    for (int r = 0; r < world; ++r) total += width(r);
    const auto errors = run_nodes(groups, [&](int node, int i, Communicator& comm) {
      const int r = node * per + i;
      ASSERT_EQ(comm.rank(), r);
      ASSERT_EQ(comm.world(), world);
      auto ops = make_cpu_ops(1);
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k) v[size_t(k)] = value(r, k);
      Tensor t = ops->upload(v.data(), DType::F32, {n});
      comm.all_reduce_sum(t);
      got[size_t(r)].resize(size_t(n));
      ops->download(t, got[size_t(r)].data());
      std::vector<float> part(size_t(rows * width(r)));
      for (int64_t a = 0; a < rows; ++a)
        for (int64_t b = 0; b < width(r); ++b) part[size_t(a * width(r) + b)] = float(100 * r + 10 * a + b);
      Tensor in = ops->upload(part.data(), DType::F32, {rows, width(r)}), out = ops->empty({rows, total});
      comm.all_gather_columns(in, out);
      gathered[size_t(r)].resize(size_t(rows * total));
      ops->download(out, gathered[size_t(r)].data());
    });
    for (const auto& e : errors) EXPECT_EQ(e, "");
    for (int r = 0; r < world; ++r) {
      for (int64_t k = 0; k < n; ++k) {
        float want = value(0, k);
        for (int q = 1; q < world; ++q) want += value(q, k);
        ASSERT_EQ(got[size_t(r)][size_t(k)], want) << "world " << world << " rank " << r << " element " << k;
      }
      for (int64_t a = 0; a < rows; ++a) {
        int64_t col = 0;
        for (int q = 0; q < world; ++q)
          for (int64_t b = 0; b < width(q); ++b, ++col)
            ASSERT_EQ(gathered[size_t(r)][size_t(a * total + col)], float(100 * q + 10 * a + b))
                << "world " << world << " rank " << r;
      }
    }
  }
}

// A rank of node 1 fails before its collective: the leader's rank leaves its collective with an Error naming the
// rank and node that left, and the group stays failed (a later collective throws at once, no waiting).
TEST(NodeCommunicator, AFollowerThatFailsFailsTheLeaderAndTheGroupStaysFailed) {
  auto groups = make_groups(2, 2);
  std::vector<std::vector<std::shared_ptr<Communicator>>> comms;
  for (const auto& g : groups) comms.push_back(make_node_communicators(g));
  std::string leader_error, follower_error;
  auto ops = make_cpu_ops(1);
  std::thread follower([&] {
    RankThreads rt(1, comms[1], 20);
    try {
      rt.run([&](int) { throw Error("node 1 broke"); });
    } catch (const Error& e) {
      follower_error = e.what();
    }
  });
  {
    RankThreads rt(1, comms[0], 20);
    Tensor t = ops->zeros({8});
    try {
      rt.run([&](int) { comms[0][0]->all_reduce_sum(t); });
    } catch (const Error& e) {
      leader_error = e.what();
    }
    follower.join();
    EXPECT_EQ(follower_error, "node 1 broke");
    EXPECT_TRUE(contains(leader_error, "rank 1 (node 1) left the group")) << leader_error;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      rt.run([&](int) { comms[0][0]->all_reduce_sum(t); });
      ADD_FAILURE() << "a collective of a failed group returned";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "left the group")) << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  }
}

// The leader's rank fails: the follower's collective throws with the leader's reason.
TEST(NodeCommunicator, TheLeadersFailureReachesTheFollowerWithItsReason) {
  auto groups = make_groups(2, 2);
  const auto errors = run_nodes(groups, [&](int node, int, Communicator& comm) {
    if (node == 0) throw Error("the leader broke");
    auto ops = make_cpu_ops(1);
    Tensor t = ops->zeros({4});
    comm.all_reduce_sum(t);
  });
  EXPECT_EQ(errors[0], "the leader broke");
  EXPECT_TRUE(contains(errors[1], "the leader broke")) << errors[1];
}

// Node 0's communicators go away while node 1's rank waits in a collective (node 1 ran a step node 0 did not): the
// proxy leaves the group's barrier, node 1's collective fails with the reason, and nothing hangs.
TEST(NodeCommunicator, NodeZeroLeavingEndsAFollowersCollective) {
  auto groups = make_groups(2, 2);
  auto leader = make_node_communicators(groups[0]);
  auto follower = make_node_communicators(groups[1]);
  std::string error;
  std::thread t([&] {
    auto ops = make_cpu_ops(1);
    Tensor x = ops->zeros({16});
    try {
      follower[0]->all_reduce_sum(x);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // node 1's tensor reaches its proxy
  leader.clear();                                               // node 0's ranks and proxies go away
  t.join();
  EXPECT_TRUE(contains(error, "node 0 closed the group")) << error;
}

// A collective header that announces an impossible size fails the group with an Error naming the rank (nothing is
// allocated for it, no crash).
TEST(NodeCommunicator, ANonsenseHeaderFailsTheGroupNamingTheRank) {
  auto groups = make_groups(2, 2);
  auto leader = make_node_communicators(groups[0]);
  std::unique_ptr<Link> link = groups[1]->take_rank_link(1);  // node 1's rank link, written by hand
  WireWriter w;
  w.put(uint8_t(1)).put(std::vector<int64_t>{-1}).put(int64_t(0));
  link->send(w.bytes());
  auto ops = make_cpu_ops(1);
  Tensor x = ops->zeros({4});
  try {
    leader[0]->all_reduce_sum(x);
    FAIL() << "a collective with a nonsense peer returned";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "rank 1 (node 1) left the group") && contains(e.what(), "-1")) << e.what();
  }
}

// ------------------------------------------------------------------------------------------ rendezvous

// Connections that are not nodes (a port probe that says nothing, one that sends junk and closes) are dropped; the
// group is made with the real node.
TEST(Rendezvous, PortProbesAreIgnored) {
  const int port = free_port();
  std::shared_ptr<NodeGroup> g0, g1;
  std::string e0, e1;
  std::thread leader([&] {
    try {
      g0 = rendezvous({2, 0, "127.0.0.1", port, 30}, 2, "x");
    } catch (const Error& e) {
      e0 = e.what();
    }
  });
  auto silent = Link::connect("127.0.0.1", port, 10, "probe");
  {
    auto junk = Link::connect("127.0.0.1", port, 10, "probe");
    const std::vector<uint8_t> bytes{1, 2, 3};
    junk->send(bytes);
  }
  std::thread follower([&] {
    try {
      g1 = rendezvous({2, 1, "127.0.0.1", port, 30}, 2, "x");
    } catch (const Error& e) {
      e1 = e.what();
    }
  });
  leader.join();
  follower.join();
  EXPECT_EQ(e0, "");
  EXPECT_EQ(e1, "");
  EXPECT_TRUE(g0 && g1);
}

TEST(Rendezvous, OtherSettingsOnANodeFailBothEndsNamingBoth) {
  const int port = free_port();
  std::string e0, e1;
  std::thread t([&] {
    try {
      rendezvous({2, 1, "127.0.0.1", port, 20}, 2, "--tp 2, model B");
    } catch (const Error& e) {
      e1 = e.what();
    }
  });
  try {
    rendezvous({2, 0, "127.0.0.1", port, 20}, 2, "--tp 2, model A");
  } catch (const Error& e) {
    e0 = e.what();
  }
  t.join();
  for (const std::string& e : {e0, e1}) {
    EXPECT_TRUE(contains(e, "node 1 was started with other settings than node 0")) << e;
    EXPECT_TRUE(contains(e, "model A") && contains(e, "model B")) << e;
  }
}

TEST(Rendezvous, NodesThatDoNotComeAreNamedAfterTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    rendezvous({3, 0, "127.0.0.1", free_port(), 0.5}, 6, "x");
    FAIL() << "the rendezvous returned without the other nodes";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "node 1 (ranks 2-3), node 2 (ranks 4-5)")) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  try {
    rendezvous({2, 1, "127.0.0.1", free_port(), 0.5}, 2, "x");
    FAIL() << "a follower without a leader returned";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "could not connect to 127.0.0.1:")) << e.what();
  }
}

TEST(Rendezvous, BadOptionsNameTheFlag) {
  auto message = [](NodeOptions o, int world) {
    try {
      check_node_options(o, world);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_TRUE(contains(message({2, 2, "h", 1}, 4), "--node-rank 2 is outside 0..1"));
  EXPECT_TRUE(contains(message({3, 0, "h", 1}, 4), "--tp 4 does not split over --nnodes 3"));
  EXPECT_TRUE(contains(message({2, 0, "h", 70000}, 4), "--master-port 70000"));
  EXPECT_TRUE(contains(message({0, 0, "h", 1}, 4), "--nnodes must be >= 1"));
  EXPECT_EQ(message({2, 1, "h", 29500}, 4), "");
}

// ------------------------------------------------------------------------------------------ the model over nodes

/// A model over `nnodes` nodes: the leader here, every follower loaded and following in a thread of its own.
struct NodeModels {
  NodeModels(const std::string& dir, int tp, int nnodes, bool load_mtp = false) {
    groups = make_groups(tp, nnodes);
    errors->resize(size_t(nnodes));
    for (int n = 1; n < nnodes; ++n)
      threads.emplace_back([this, dir, tp, n, load_mtp] {
        try {
          ModelOptions o;
          o.tp = tp;
          o.threads = 1;
          o.load_mtp = load_mtp;
          o.nodes = groups[size_t(n)];
          auto m = Model::load(source_path(dir), o);
          EXPECT_FALSE(m->leads());
          m->follow();
        } catch (const Error& e) {
          (*errors)[size_t(n)] = e.what();
        }
      });
    ModelOptions o;
    o.tp = tp;
    o.threads = 1;
    o.load_mtp = load_mtp;
    o.nodes = groups[0];
    leader = Model::load(source_path(dir), o);
  }
  /// Ends the group (the followers' follow() returns) and waits for the followers.
  void end() {
    leader.reset();
    for (auto& t : threads) t.join();
    threads.clear();
  }
  ~NodeModels() {
    if (!threads.empty()) end();
  }
  std::vector<std::shared_ptr<NodeGroup>> groups;
  std::unique_ptr<Model> leader;
  std::vector<std::thread> threads;
  /// Per node: the Error its follow() ended with ("" when it ended normally); outlives the group.
  std::shared_ptr<std::vector<std::string>> errors = std::make_shared<std::vector<std::string>>();
};

/// A model of this process over `tp` ranks (threads).
std::unique_ptr<Model> one_process(const std::string& dir, int tp, bool load_mtp = false) {
  ModelOptions o;
  o.tp = tp;
  o.threads = 1;
  o.load_mtp = load_mtp;
  return Model::load(source_path(dir), o);
}

class TpOverNodes : public ::testing::TestWithParam<std::pair<int, int>> {};

// tiny-a over nodes: a 300-token prompt fed in chunks of 70 (the private cache grows on every node alike) gives the
// bits of the same TP degree in one process, and TP 1's logits within the TP bound with its greedy tokens; batched
// steps of the eight tiny-a prompts in a shared pool, with chunked prefills beside decodes, give TP 1's tokens; a
// copied sequence continues like its original on every node; the followers end when the leader's model goes.
TEST_P(TpOverNodes, GivesTheBitsOfOneProcess) {
  const auto [tp, nnodes] = GetParam();
  NodeModels nodes(kTinyA, tp, nnodes);
  Model& model = *nodes.leader;
  EXPECT_TRUE(model.leads());
  EXPECT_EQ(model.tp(), tp);
  EXPECT_STREQ(model.communicator_kind().c_str(), "cpu nodes");
  auto here = one_process(kTinyA, tp);
  Model& one = shared_model(kTinyA);

  std::vector<int32_t> prompt(300);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37 + 11) % 1000);
  const auto a = forward_in_chunks(model, prompt, 70), b = forward_in_chunks(*here, prompt, 70),
             c = forward_in_chunks(one, prompt, 70);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b) << "TP " << tp << " over " << nnodes << " nodes differs from TP " << tp << " in one process";
  const double rel = max_abs_diff(a.data(), c.data(), a.size()) / max_abs(c);
  std::printf("[ nodes    ] tiny-a tp %d over %d nodes: |TP - TP1| / max|TP1| %.3g\n", tp, nnodes, rel);
  EXPECT_LE(rel, 1e-5);
  EXPECT_EQ(greedy(model, prompt, 6), greedy(one, prompt, 6));

  BatchPlan plan;
  plan.block_size = 16;
  plan.chunk = 40;
  plan.start = {0, 0, 1, 2, 0, 3, 1, 0};
  const auto prompts = tiny_a_batch_prompts();
  EXPECT_EQ(batched_greedy(model, prompts, 6, plan), batched_greedy(one, prompts, 6, plan));

  auto cache = model.new_cache(64, 16, 2);
  SequenceState s = model.new_sequence(cache, 0), t = model.new_sequence(cache, 1);
  for (int32_t i = 0; i < 20; ++i) s.block_table.push_back(i), t.block_table.push_back(63 - i);
  model.forward(s, prompts[2], LogitsMode::Last);
  model.copy_sequence(s, t);
  SequenceState u = model.clone_sequence(s);
  const int32_t next = 7;
  const auto ls = model.forward(s, std::span<const int32_t>(&next, 1), LogitsMode::Last);
  EXPECT_EQ(model.forward(t, std::span<const int32_t>(&next, 1), LogitsMode::Last), ls);
  EXPECT_EQ(model.forward(u, std::span<const int32_t>(&next, 1), LogitsMode::Last), ls);

  nodes.end();
  for (const auto& e : *nodes.errors) EXPECT_EQ(e, "");
}

INSTANTIATE_TEST_SUITE_P(Degrees, TpOverNodes, ::testing::Values(std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 4}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.first) + "_nodes" +
                                  std::to_string(info.param.second);
                         });

// The MTP layer over nodes (speculative decoding's drafts, issue 21): tiny-mtp's prompt through the trunk, the MTP
// rows of the whole prompt, three greedy drafts chained from the last row (each from the layer's own state) and a
// slot copy of the sequence give the bits of the same TP degree in one process; the other nodes hold no hidden rows
// (rank 0's, their ranks add zeros).
TEST(TpOverNodesMtp, DraftsGiveTheBitsOfOneProcess) {
  const std::string dir = "tests/data/fixtures/tiny-mtp/model";
  std::vector<int32_t> prompt(29), next(29);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37 + 11) % 500);
  for (size_t i = 0; i < next.size(); ++i) next[i] = i + 1 < prompt.size() ? prompt[i + 1] : 7;
  // Logits of the MTP rows and of each draft step, and the drafts, of a sequence in a shared pool.
  auto run = [&](Model& model, std::vector<int32_t>& drafts) {
    const int64_t V = model.config().vocab_size;
    auto cache = model.new_cache(16, 8, 2);
    SequenceState seq = model.new_sequence(cache, 0);
    for (int32_t b = 0; b < 8; ++b) seq.block_table.push_back(15 - b);
    Tensor wide;
    const BatchItem item{&seq, prompt, LogitsMode::Last};
    model.forward_batch({&item, 1}, nullptr, {}, &wide);
    Model::MtpOutput out = model.mtp_forward(seq, wide, next, LogitsMode::All);
    std::vector<float> logits = model.download(out.logits);
    const int64_t T = int64_t(prompt.size());
    Tensor state = out.wide.rows(T - 1, T);
    int32_t d = int32_t(std::max_element(logits.end() - V, logits.end()) - (logits.end() - V));
    for (int k = 0; k < 3; ++k) {
      drafts.push_back(d);
      Model::MtpOutput o = model.mtp_forward(seq, state, {&d, 1});
      const std::vector<float> row = model.download(o.logits);
      logits.insert(logits.end(), row.begin(), row.end());
      d = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
      state = o.wide;
    }
    return logits;
  };
  for (auto [tp, nnodes] : {std::pair{2, 2}, std::pair{4, 2}}) {
    SCOPED_TRACE(fmt::format("tp {} over {} nodes", tp, nnodes));
    NodeModels nodes(dir, tp, nnodes, /*load_mtp=*/true);
    ASSERT_TRUE(nodes.leader->has_mtp());
    auto here = one_process(dir, tp, /*load_mtp=*/true);
    std::vector<int32_t> drafts, want_drafts;
    const std::vector<float> got = run(*nodes.leader, drafts), want = run(*here, want_drafts);
    EXPECT_TRUE(got == want) << "MTP logits over nodes differ from one process";
    EXPECT_EQ(drafts, want_drafts);
    nodes.end();
    for (const auto& e : *nodes.errors) EXPECT_EQ(e, "");
  }
}

// A follower that goes away (its links shut, as when its process dies): the leader's next step fails with an Error
// naming node 1, at once and again for every later call (no hang), and the follower's loop ends with an Error.
TEST(TpOverNodesFailure, ALostFollowerFailsTheLeadersCallsNamingIt) {
  NodeModels nodes(kTinyA, 2, 2);
  Model& model = *nodes.leader;
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5};
  SequenceState s = model.new_sequence();
  model.forward(s, prompt, LogitsMode::Last);
  nodes.groups[1]->shutdown();
  nodes.threads[0].join();
  nodes.threads.clear();
  EXPECT_TRUE(contains((*nodes.errors)[1], "node 1: node 0 is gone") || contains((*nodes.errors)[1], "shut down"))
      << (*nodes.errors)[1];
  // The leader sees it before its next call (serve's /health asks Model::failure).
  EXPECT_TRUE(contains(model.failure(), "node 1 (rank 1) of the group is gone")) << model.failure();
  for (int attempt = 0; attempt < 2; ++attempt) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      SequenceState fresh = model.new_sequence();
      model.forward(fresh, prompt, LogitsMode::Last);
      ADD_FAILURE() << "a step without node 1 returned";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "node 1")) << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  }
}

// Node 0's command fails (an error goes up while its model ends): the followers end with an Error saying so, not as
// if the group had ended normally.
TEST(TpOverNodesFailure, AnErrorOnNodeZeroEndsTheFollowersWithAnError) {
  std::shared_ptr<std::vector<std::string>> errors;
  try {
    NodeModels nodes(kTinyA, 2, 2);
    errors = nodes.errors;
    SequenceState s = nodes.leader->new_sequence();
    nodes.leader->forward(s, std::vector<int32_t>{1, 2, 3}, LogitsMode::Last);
    throw Error("node 0's command failed");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "node 0's command failed");
  }
  ASSERT_TRUE(errors);
  EXPECT_TRUE(contains((*errors)[1], "node 1: node 0 ended with an error")) << (*errors)[1];
}

// State snapshots over nodes (generate's and logits' speculative rollback): snapshot, a detour of other tokens,
// restore, then the real tokens give the logits of feeding the real tokens directly and of one process, on every
// node's ranks; a snapshot that is dropped is let go of on the other nodes with the next call. Then speculative
// decoding with the MTP layer (mtp:3, rollbacks included) over nodes gives plain greedy decoding's tokens and one
// process's acceptance figures.
TEST(TpOverNodesSpeculative, SnapshotsAndDraftsGiveTheBitsOfOneProcess) {
  const std::string dir = "tests/data/fixtures/tiny-mtp/model";
  std::vector<int32_t> prompt(23);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 37 + 11) % 400);
  const std::vector<int32_t> real{5, 77, 300, 12, 9, 41}, detour{100, 101, 102, 103, 104, 105, 106};
  auto rollback = [&](Model& model) {
    SequenceState a = model.new_sequence();
    model.forward(a, prompt, LogitsMode::Last);
    Model::StateSnapshot snap = model.snapshot_state(a);
    { const Model::StateSnapshot dropped = model.snapshot_state(a); }  // released with the next call
    model.forward(a, detour, LogitsMode::Last);
    model.restore_state(a, snap);
    return model.forward(a, real);
  };
  auto speculate = [&](Model& model, SpeculativeStats* stats) {
    SpeculativeDecoder sd(model, SpeculativeConfig::parse("mtp:3"));
    SequenceState seq = model.new_sequence();
    std::vector<int32_t> context = prompt, out;
    auto choose = [](std::span<float> r) { return int32_t(std::max_element(r.begin(), r.end()) - r.begin()); };
    std::vector<float> first = sd.prefill(seq, prompt);
    out.push_back(choose(first));
    context.push_back(out.back());
    while (out.size() < 24)
      for (int32_t t : sd.step(seq, context, choose)) out.push_back(t), context.push_back(t);
    out.resize(24);
    *stats = sd.stats();
    return out;
  };
  NodeModels nodes(dir, 2, 2, /*load_mtp=*/true);
  auto here = one_process(dir, 2, /*load_mtp=*/true);
  EXPECT_TRUE(rollback(*nodes.leader) == rollback(*here));
  SequenceState direct = here->new_sequence();
  here->forward(direct, prompt, LogitsMode::Last);
  EXPECT_TRUE(rollback(*nodes.leader) == here->forward(direct, real));
  SpeculativeStats got, want;
  EXPECT_EQ(speculate(*nodes.leader, &got), speculate(*here, &want));
  EXPECT_EQ(got.accepted, want.accepted);
  EXPECT_EQ(got.rollbacks, want.rollbacks);
  EXPECT_GT(got.rollbacks, 0);
  EXPECT_EQ(got.refeeds, got.rollbacks);  // over the nodes a rollback feeds the accepted tokens again
  EXPECT_EQ(want.refeeds, 0);             // one process replays them (Model::replay_state)
  std::vector<int32_t> plain = prompt;
  SequenceState p = here->new_sequence();
  std::vector<float> row = here->forward(p, prompt, LogitsMode::Last);
  std::vector<int32_t> greedy;
  while (greedy.size() < 24) {
    greedy.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
    row = here->forward(p, std::span<const int32_t>(&greedy.back(), 1), LogitsMode::Last);
  }
  SpeculativeStats unused;
  EXPECT_EQ(speculate(*nodes.leader, &unused), greedy);
  nodes.end();
  for (const auto& e : *nodes.errors) EXPECT_EQ(e, "");
}

}  // namespace
}  // namespace flashnext::test
