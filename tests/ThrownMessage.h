// What a test's call throws: the tests of bad input check that the error names what is wrong.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include <gtest/gtest.h>

namespace flextile::testing {

// The message of the exception of type E that `call` throws, or `ifNone` when it returns. An
// exception of another type propagates and fails the test with its own message.
template <class E = std::exception, class Call>
std::string thrownMessage(Call&& call, const std::string& ifNone = "") {
  try {
    std::forward<Call>(call)();
  } catch (const E& e) {
    return e.what();
  }
  return ifNone;
}

// The same for a call that must throw: a test failure, and "", when it returns.
template <class E = std::exception, class Call>
std::string requiredMessage(Call&& call) {
  try {
    std::forward<Call>(call)();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception, but the call returned";
  return "";
}

// A call that must throw an error whose message contains `text`.
template <class Call>
void expectErrorNaming(Call&& call, const std::string& text) {
  const std::string message = requiredMessage(std::forward<Call>(call));
  EXPECT_NE(message.find(text), std::string::npos) << message;
}

}  // namespace flextile::testing
