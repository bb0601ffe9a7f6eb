// Stop-string matcher tests: expected emitted text worked out by hand from vLLM's semantics (stop string not
// emitted, nothing after it, possible prefixes held back until decided).
#include "engine/stop.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace flashnext {
namespace {

TEST(StopStrings, NoStopsPassThrough) {
  StopStringMatcher m({});
  auto r = m.feed("abc");
  EXPECT_EQ(r.text, "abc");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, HoldsBackAcrossTokenBoundariesThenStops) {
  StopStringMatcher m({"</s>"});
  auto r = m.feed("Hello <");
  EXPECT_EQ(r.text, "Hello ");
  EXPECT_EQ(m.held(), 1u);
  r = m.feed("/");
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.held(), 2u);
  r = m.feed("s>tail");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.matched, 0);
  EXPECT_THROW(m.feed("x"), Error);
}

TEST(StopStrings, ReleasesAHeldPrefixThatDidNotComplete) {
  StopStringMatcher m({"</s>"});
  EXPECT_EQ(m.feed("a <").text, "a ");
  auto r = m.feed("/b");
  EXPECT_EQ(r.text, "</b");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.held(), 0u);
}

TEST(StopStrings, StopInsideOnePiece) {
  StopStringMatcher m({"STOP"});
  auto r = m.feed("xx STOP yy");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "xx ");
}

TEST(StopStrings, IncludeStopString) {
  StopStringMatcher m({"STOP"}, /*include_stop=*/true);
  EXPECT_EQ(m.feed("xx ST").text, "xx ");
  auto r = m.feed("OP yy");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "STOP");
}

TEST(StopStrings, EarliestOccurrenceWins) {
  StopStringMatcher m({"cd", "b"});
  auto r = m.feed("abcd");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "a");
  EXPECT_EQ(r.matched, 1);
}

TEST(StopStrings, OverlappingPrefixes) {
  // Held "aa" is a prefix of "aab"; the next piece "aab" makes "aaaab", where "aab" starts at 2.
  StopStringMatcher m({"aab"});
  EXPECT_EQ(m.feed("aa").text, "");
  auto r = m.feed("aab");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "aa");
}

TEST(StopStrings, HoldsTheLongestPossiblePrefixOverAllStops) {
  StopStringMatcher m({"xyz", "yzw!"});
  auto r = m.feed("123xyz");  // complete "xyz"
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "123");
  StopStringMatcher m2({"xyq", "yzw!"});
  r = m2.feed("1xyzw");  // longest suffix that starts a stop string: "yzw" (of "yzw!"); "xyzw" does not start "xyq"
  EXPECT_EQ(r.text, "1x");
  EXPECT_EQ(m2.flush(), "yzw");
}

TEST(StopStrings, Utf8HoldbackKeepsCharactersWhole) {
  StopStringMatcher m({"\xC3\xA9!"});  // "é!"
  EXPECT_EQ(m.feed("caf\xC3\xA9").text, "caf");
  EXPECT_EQ(m.feed("?").text, "\xC3\xA9?");
}

TEST(StopStrings, FlushReturnsHeldText) {
  StopStringMatcher m({"###"});
  EXPECT_EQ(m.feed("done ##").text, "done ");
  EXPECT_EQ(m.flush(), "##");
}

TEST(StopStrings, EmptyStopStringIsAnError) {
  EXPECT_THROW(StopStringMatcher({"a", ""}), Error);
}

}  // namespace
}  // namespace flashnext
