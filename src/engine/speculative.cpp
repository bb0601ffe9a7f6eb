#include "engine/speculative.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "core/error.h"

namespace flashnext {

SpeculativeConfig SpeculativeConfig::parse(std::string_view spec) {
  SpeculativeConfig c;
  if (spec.empty() || spec == "none") return c;
  const size_t colon = spec.find(':');
  const std::string_view method = spec.substr(0, colon);
  if (method == "mtp") {
    c.method = Method::Mtp;
  } else if (method == "ngram") {
    c.method = Method::Ngram;
  } else {
    fail("--speculative {}: unknown proposer '{}' (expected mtp:K or ngram:K, K in 1..{})", spec, method, kMaxDrafts);
  }
  FN_CHECK(colon != std::string_view::npos, "--speculative {}: give the number of drafts, e.g. {}:3 (K in 1..{})", spec,
           method, kMaxDrafts);
  const std::string_view num = spec.substr(colon + 1);
  int k = 0;
  const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), k);
  FN_CHECK(ec == std::errc() && end == num.data() + num.size() && k >= 1 && k <= kMaxDrafts,
           "--speculative {}: K must be an integer in 1..{}, got '{}'", spec, kMaxDrafts, num);
  c.k = k;
  return c;
}

std::string SpeculativeConfig::str() const {
  switch (method) {
    case Method::Ngram:
      return fmt::format("ngram:{}", k);
    case Method::Mtp:
      return fmt::format("mtp:{}", k);
    case Method::Custom:
      return fmt::format("custom:{}", k);
    default:
      return "none";
  }
}

std::vector<int32_t> ngram_propose(std::span<const int32_t> context, int k, int max_n, int min_n) {
  const int64_t size = int64_t(context.size());
  if (k <= 0) return {};
  for (int n = max_n; n >= std::max(1, min_n); --n) {
    if (size < n + 1) continue;
    const std::span<const int32_t> suffix = context.subspan(size_t(size - n));
    // The most recent earlier occurrence: start i < size - n, the match ends before the suffix's last token.
    for (int64_t i = size - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + i)) continue;
      const int64_t from = i + n, to = std::min(size, from + k);
      return {context.begin() + from, context.begin() + to};
    }
  }
  return {};
}

std::vector<int32_t> chain_mtp_drafts(Model& model, SequenceState& seq, const Model::MtpOutput& out, int max_drafts) {
  SequenceState* const one[1] = {&seq};
  return chain_mtp_drafts_batch(model, one, {&out, 1}, {&max_drafts, 1})[0];
}

std::vector<std::vector<int32_t>> chain_mtp_drafts_batch(Model& model, std::span<SequenceState* const> seqs,
                                                         std::span<const Model::MtpOutput> outs,
                                                         std::span<const int> max_drafts) {
  FN_CHECK(outs.size() == seqs.size() && max_drafts.size() == seqs.size(),
           "chain_mtp_drafts_batch: {} sequences, {} outputs, {} draft counts", seqs.size(), outs.size(),
           max_drafts.size());
  const size_t n = seqs.size();
  const int64_t V = model.config().vocab_size, max_pos = model.config().max_position_embeddings;
  std::vector<std::vector<int32_t>> drafts(n);
  std::vector<int64_t> committed(n);
  std::vector<Tensor> wide(n);
  // The greedy token of each [1, V] logits row (torch.argmax: the first largest), rows gathered into one download.
  auto argmax_rows = [&](const std::vector<Tensor>& rows) {
    std::vector<float> host;
    if (rows.size() == 1) {
      host = model.download(rows[0]);
    } else {
      Ops& ops = model.ops();
      Tensor all = ops.empty({int64_t(rows.size()), V});
      for (size_t k = 0; k < rows.size(); ++k) ops.copy_rows(rows[k], 0, all, int64_t(k), 1);
      host = model.download(all);
    }
    std::vector<int32_t> ids;
    for (size_t k = 0; k < rows.size(); ++k) {
      const auto row = host.begin() + std::ptrdiff_t(k) * V;
      ids.push_back(int32_t(std::max_element(row, row + V) - row));
    }
    return ids;
  };
  std::vector<Tensor> rows;
  std::vector<size_t> who;
  for (size_t i = 0; i < n; ++i) {
    committed[i] = seqs[i]->mtp_length;
    if (max_drafts[i] <= 0) continue;
    const int64_t r = outs[i].wide.dim(0);
    wide[i] = outs[i].wide.rows(r - 1, r);
    const int64_t l = outs[i].logits.dim(0);
    rows.push_back(outs[i].logits.rows(l - 1, l));
    who.push_back(i);
  }
  // seq.mtp_length is put back afterwards, also when a step throws.
  struct PutBack {
    std::span<SequenceState* const> seqs;
    const std::vector<int64_t>& committed;
    ~PutBack() {
      for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->mtp_length = committed[i];
    }
  } put_back{seqs, committed};
  // One draft position of every sequence still drafting per pass.
  while (!who.empty()) {
    const std::vector<int32_t> ids = argmax_rows(rows);
    std::vector<Model::MtpItem> items;
    std::vector<size_t> next;
    for (size_t k = 0; k < who.size(); ++k) {
      const size_t i = who[k];
      drafts[i].push_back(ids[k]);
      if (int(drafts[i].size()) < max_drafts[i] && seqs[i]->mtp_length < max_pos) {
        items.push_back({seqs[i], wide[i], {&drafts[i].back(), 1}, LogitsMode::Last});
        next.push_back(i);
      }
    }
    rows.clear();
    if (!items.empty()) {
      const std::vector<Model::MtpOutput> step = model.mtp_forward_batch(items);
      for (size_t k = 0; k < next.size(); ++k) {
        wide[next[k]] = step[k].wide;
        rows.push_back(step[k].logits);
      }
    }
    who = std::move(next);
  }
  return drafts;
}

SpeculativeDecoder::SpeculativeDecoder(Model& model, SpeculativeConfig config) : model_(model), config_(config) {
  FN_CHECK(config_.enabled(), "SpeculativeDecoder: no proposer given (--speculative)");
  FN_CHECK(config_.k >= 1 && config_.k <= SpeculativeConfig::kMaxDrafts, "--speculative {}: K must be in 1..{}",
           config_.str(), SpeculativeConfig::kMaxDrafts);
  FN_CHECK(config_.method != SpeculativeConfig::Method::Mtp || model_.has_mtp(),
           "--speculative {}: the model was loaded without its MTP layer (the checkpoint needs mtp.* tensors)",
           config_.str());
}

SpeculativeDecoder::SpeculativeDecoder(Model& model, int k, Proposer proposer)
    : SpeculativeDecoder(model, SpeculativeConfig{SpeculativeConfig::Method::Custom, k}) {
  FN_CHECK(bool(proposer), "SpeculativeDecoder: no proposer given");
  custom_ = std::move(proposer);
}

std::vector<float> SpeculativeDecoder::prefill(SequenceState& seq, std::span<const int32_t> prompt) {
  const bool mtp = config_.method == SpeculativeConfig::Method::Mtp;
  const BatchItem item{&seq, prompt, LogitsMode::Last};
  Tensor wide;
  std::vector<float> logits = model_.download(model_.forward_batch({&item, 1}, nullptr, {}, mtp ? &wide : nullptr));
  if (mtp) {
    mtp_hidden_ = wide;
    mtp_next_.assign(prompt.begin() + 1, prompt.end());
  }
  return logits;
}

std::vector<int32_t> SpeculativeDecoder::propose(SequenceState& seq, std::span<const int32_t> context, int max_drafts) {
  max_drafts = std::min(max_drafts, config_.k);
  if (config_.method == SpeculativeConfig::Method::Ngram) return ngram_propose(context, max_drafts);
  if (config_.method == SpeculativeConfig::Method::Custom) {
    std::vector<int32_t> d = max_drafts > 0 ? custom_(context, max_drafts) : std::vector<int32_t>{};
    if (int(d.size()) > max_drafts) d.resize(size_t(std::max(max_drafts, 0)));
    return d;
  }
  // MTP: catch up over the positions the trunk fed since the last draft (their next tokens end with the context's
  // last token), which gives the first draft; then chain the MTP layer on its own wide state.
  FN_CHECK(mtp_hidden_.defined() && !context.empty(), "SpeculativeDecoder: propose before prefill");
  std::vector<int32_t> next = mtp_next_;
  next.push_back(context.back());
  Model::MtpOutput out = model_.mtp_forward(seq, mtp_hidden_, next, LogitsMode::Last);
  mtp_hidden_ = Tensor();
  mtp_next_.clear();
  return chain_mtp_drafts(model_, seq, out, max_drafts);
}

std::vector<int32_t> SpeculativeDecoder::step(SequenceState& seq, std::span<const int32_t> context,
                                              const ChooseToken& choose) {
  FN_CHECK(!context.empty(), "SpeculativeDecoder::step: empty context");
  const bool mtp = config_.method == SpeculativeConfig::Method::Mtp;
  const int64_t V = model_.config().vocab_size;
  // The verify feeds 1 + K tokens; keep it inside the context length.
  const int64_t room = model_.config().max_position_embeddings - seq.length - 1;
  drafts_ = propose(seq, context, int(std::clamp<int64_t>(room, 0, config_.k)));
  const std::vector<int32_t>& drafts = drafts_;
  std::vector<int32_t> feed{context.back()};
  feed.insert(feed.end(), drafts.begin(), drafts.end());

  std::optional<Model::StateSnapshot> snap;
  StateInputs kept;
  if (!drafts.empty()) snap = model_.snapshot_state(seq);
  Tensor wide;
  const BatchItem item{&seq, feed, LogitsMode::All, drafts.empty() ? nullptr : &kept};
  std::vector<float> logits = model_.download(model_.forward_batch({&item, 1}, nullptr, {}, mtp ? &wide : nullptr));

  // Accept the longest prefix of drafts that the target chooses itself, then its token after that prefix.
  std::vector<int32_t> out;
  size_t accepted = 0;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    const int32_t tok = choose(std::span<float>(logits.data() + int64_t(i) * V, size_t(V)));
    out.push_back(tok);
    if (i < drafts.size() && tok == drafts[i]) {
      ++accepted;
      continue;
    }
    break;
  }
  ++stats_.steps;
  stats_.drafted += int64_t(drafts.size());
  stats_.accepted += int64_t(accepted);
  stats_.emitted += int64_t(out.size());
  last_out_ = out.size();
  last_accepted_ = accepted;

  if (accepted < drafts.size()) {  // rollback: the state from before the verify, advanced over the accepted tokens
    ++stats_.rollbacks;
    model_.restore_state(seq, *snap);
    const int64_t keep = int64_t(accepted) + 1;
    if (kept.kept()) {
      model_.replay_state(seq, kept, keep);
      if (mtp) wide = wide.rows(0, keep);  // the verify's rows of the accepted positions (causal: the same rows)
    } else {                               // over several nodes: feed them again
      ++stats_.refeeds;
      const BatchItem again{&seq, std::span<const int32_t>(feed.data(), size_t(keep)), LogitsMode::Last};
      model_.forward_batch({&again, 1}, nullptr, {}, mtp ? &wide : nullptr);
    }
  }
  if (mtp) {
    mtp_hidden_ = wide;  // rows of the accepted positions: [context.back(), accepted drafts]
    mtp_next_.assign(drafts.begin(), drafts.begin() + int64_t(accepted));
  }
  return out;
}

SpeculativeStats SpeculativeDecoder::stats_using(size_t used) const {
  SpeculativeStats st = stats_;
  if (used >= last_out_) return st;
  st.emitted -= int64_t(last_out_ - used);
  st.accepted -= int64_t(last_accepted_ - std::min(last_accepted_, used));
  return st;
}

}  // namespace flashnext
