// OutputProcessor: stop rules and streamed text with the real Qwen3 tokenizer of the bundled model. Expected texts
// come from tests/data/fixtures/tiny-b/tokenizer_cases.json (ids and decoded text produced by the reference
// tokenizer) and from the vLLM rules in engine/output.h.
#include "engine/output.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace flashnext {
namespace {

using json = nlohmann::json;

constexpr TokenId kImEnd = 151645;               // <|im_end|>, the tiny-b EOS
constexpr TokenId kHello = 9707, kWorld = 1879;  // "Hello", " world" (encode case 0)
constexpr int64_t kVocab = 151936, kContext = 8192;

class Output : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = new Tokenizer(Tokenizer::load(FLASHNEXT_SOURCE_DIR "/models/tiny-b-random"));
    std::ifstream in(FLASHNEXT_SOURCE_DIR "/tests/data/fixtures/tiny-b/tokenizer_cases.json");
    cases_ = new json(json::parse(in));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete cases_;
  }
  GenerationConfig gen() const {
    GenerationConfig g;
    g.eos_token_ids = {kImEnd};
    return g;
  }
  static Tokenizer* tok_;
  static json* cases_;
};
Tokenizer* Output::tok_ = nullptr;
json* Output::cases_ = nullptr;

TEST_F(Output, EosStopsAndIsNotEmitted) {
  auto g = gen();
  SamplingParams p;
  OutputProcessor out(*tok_, g, p, kVocab, 10, kContext);
  EXPECT_EQ(out.append(kHello).text, "Hello");
  auto d = out.append(kImEnd);
  EXPECT_EQ(d.finish, FinishReason::Stop);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(out.text(), "Hello");
  EXPECT_EQ(out.stop_token(), kImEnd);
  EXPECT_EQ(out.token_ids(), (std::vector<TokenId>{kHello, kImEnd}));
  EXPECT_THROW(out.append(kHello), Error);
}

TEST_F(Output, IgnoreEosKeepsGoingAndSkipsSpecialText) {
  auto g = gen();
  SamplingParams p;
  p.ignore_eos = true;
  OutputProcessor out(*tok_, g, p, kVocab, 10, kContext);
  auto d = out.append(kImEnd);
  EXPECT_FALSE(d.finished());
  EXPECT_EQ(d.text, "");  // special tokens are skipped in the text
  EXPECT_EQ(out.append(kHello).text, "Hello");
}

TEST_F(Output, StopTokenIds) {
  auto g = gen();
  SamplingParams p;
  p.stop_token_ids = {kWorld};
  OutputProcessor out(*tok_, g, p, kVocab, 10, kContext);
  out.append(kHello);
  auto d = out.append(kWorld);
  EXPECT_EQ(d.finish, FinishReason::Stop);
  EXPECT_EQ(out.text(), "Hello");
}

TEST_F(Output, MaxTokensAndContextLength) {
  auto g = gen();
  SamplingParams p;
  p.max_tokens = 2;
  OutputProcessor out(*tok_, g, p, kVocab, 10, kContext);
  EXPECT_FALSE(out.append(kHello).finished());
  auto d = out.append(kWorld);
  EXPECT_EQ(d.finish, FinishReason::Length);
  EXPECT_EQ(out.text(), "Hello world");

  p.max_tokens = 100;
  OutputProcessor edge(*tok_, g, p, kVocab, kContext - 1, kContext);  // room for exactly one token
  EXPECT_EQ(edge.append(kHello).finish, FinishReason::Length);
  EXPECT_THROW(OutputProcessor(*tok_, g, p, kVocab, kContext, kContext), Error);
}

TEST_F(Output, StopStringSplitAcrossTokensIsHeldBackThenCut) {
  auto g = gen();
  SamplingParams p;
  p.stop = {"o w"};
  OutputProcessor out(*tok_, g, p, kVocab, 10, kContext);
  EXPECT_EQ(out.append(kHello).text, "Hell");  // "o" could start "o w"
  auto d = out.append(kWorld);
  EXPECT_EQ(d.finish, FinishReason::Stop);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(out.text(), "Hell");
  EXPECT_EQ(out.stop_string(), "o w");
}

TEST_F(Output, HeldTextIsReleasedAtLengthAndAtEos) {
  auto g = gen();
  SamplingParams p;
  p.stop = {"Hello!"};
  p.max_tokens = 1;
  OutputProcessor out(*tok_, g, p, kVocab, 10, kContext);
  auto d = out.append(kHello);
  EXPECT_EQ(d.finish, FinishReason::Length);
  EXPECT_EQ(d.text, "Hello");

  p.max_tokens = 10;
  OutputProcessor eos(*tok_, g, p, kVocab, 10, kContext);
  EXPECT_EQ(eos.append(kHello).text, "");
  EXPECT_EQ(eos.append(kImEnd).text, "Hello");
}

// Property over every encode case: streaming a case's ids emits exactly its decoded text; with a stop string taken
// from the middle of the text, exactly the text before its first occurrence; every delta is valid UTF-8.
TEST_F(Output, StreamsTheReferenceTextOfEveryEncodeCase) {
  auto g = gen();
  for (const auto& c : (*cases_)["encode"]) {
    const std::string decoded = c["decoded"];
    const auto ids = c["ids"].get<std::vector<TokenId>>();
    if (std::find(ids.begin(), ids.end(), kImEnd) != ids.end()) continue;  // special tokens: covered above
    SCOPED_TRACE(decoded);
    SamplingParams p;
    p.max_tokens = int64_t(ids.size());
    OutputProcessor all(*tok_, g, p, kVocab, 1, kContext);
    std::string streamed;
    for (TokenId id : ids) {
      auto d = all.append(id);
      streamed += d.text;
      EXPECT_TRUE(unicode::is_valid_utf8(d.text)) << "token " << id;
    }
    EXPECT_EQ(all.finish_reason(), FinishReason::Length);
    EXPECT_EQ(streamed, decoded);

    // A stop string of up to 3 characters from the middle of the text (whole UTF-8 characters).
    size_t mid = decoded.size() / 2;
    while (mid > 0 && (uint8_t(decoded[mid]) & 0xC0) == 0x80) --mid;
    size_t end = mid;
    for (int n = 0; n < 3 && end < decoded.size(); ++n) {
      ++end;
      while (end < decoded.size() && (uint8_t(decoded[end]) & 0xC0) == 0x80) ++end;
    }
    const std::string stop = decoded.substr(mid, end - mid);
    p.stop = {stop};
    OutputProcessor cut(*tok_, g, p, kVocab, 1, kContext);
    for (TokenId id : ids) {
      if (cut.append(id).finished()) break;
    }
    EXPECT_EQ(cut.finish_reason(), FinishReason::Stop) << stop;
    EXPECT_EQ(cut.text(), decoded.substr(0, decoded.find(stop))) << stop;
  }
}

}  // namespace
}  // namespace flashnext
