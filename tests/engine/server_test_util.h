// Helpers of the server request tests (server_schema_test, server_request_policy_test, server_responses_test).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "server/api_error.h"
#include "server/openai_schema.h"

namespace flashnext::server::test {

/// The vocabulary size the request tests check token ids against.
inline constexpr int64_t kVocab = 1000;

/// A minimal valid chat body (model "m", one user message "hi") with the members of `extra` set on top.
inline json chat_body(const json& extra = json::object()) {
  json body = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  return body;
}

/// Runs `f`, expects ApiError(400) whose param is `param` and whose message contains `needle`.
template <class F>
void expect_400(F&& f, const std::string& param, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected 400 on " << param;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.param(), param) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

}  // namespace flashnext::server::test
