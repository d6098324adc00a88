// tools/json.h: every string becomes one valid JSON string literal.
#include <gtest/gtest.h>

#include <string>

#include "json.h"

namespace rdmashim::tools {
namespace {

TEST(JsonQuote, EscapesQuotesBackslashesAndControls) {
  EXPECT_EQ(json_quote("pp\"x\\y"), "\"pp\\\"x\\\\y\"");
  EXPECT_EQ(json_quote("a\nb\tc\rd"), "\"a\\nb\\tc\\rd\"");
  EXPECT_EQ(json_quote(std::string("\x01\x1f\x7f", 3)), "\"\\u0001\\u001f\\u007f\"");
  EXPECT_EQ(json_quote(std::string("a\0b", 3)), "\"a\\u0000b\"");
  EXPECT_EQ(json_quote(""), "\"\"");
}

TEST(JsonQuote, KeepsValidUtf8AndReplacesInvalidBytes) {
  EXPECT_EQ(json_quote("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80"), "\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80\"");
  EXPECT_EQ(json_quote("\xff"), "\"\\ufffd\"");
  EXPECT_EQ(json_quote("\xc3"), "\"\\ufffd\"");            // truncated sequence
  EXPECT_EQ(json_quote("\xc0\xaf"), "\"\\ufffd\\ufffd\"");  // overlong '/'
  EXPECT_EQ(json_quote("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // surrogate
}

}  // namespace
}  // namespace rdmashim::tools
