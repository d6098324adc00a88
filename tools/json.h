// The one string escaper behind every JSON the tools print (stat, doctor,
// the ping-pongs, rdma_send/rdma_recv). Whatever the bytes (a program named
// pp"x\y, control characters, invalid UTF-8 from /proc/PID/comm), the
// output is one valid JSON string.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace rdmashim::tools {

// Length of the valid UTF-8 sequence at s[i] (1..4), or 0 if it is not one.
inline size_t utf8_sequence(std::string_view s, size_t i) {
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = at(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((at(i + k) & 0xc0) != 0x80) return 0;
  if (n == 2 && c < 0xc2) return 0;                                    // overlong
  if (n == 3 && c == 0xe0 && at(i + 1) < 0xa0) return 0;               // overlong
  if (n == 3 && c == 0xed && at(i + 1) >= 0xa0) return 0;              // surrogate
  if (n == 4 && ((c == 0xf0 && at(i + 1) < 0x90) || c > 0xf4 || (c == 0xf4 && at(i + 1) >= 0x90))) return 0;
  return n;
}

// `text` as a JSON string literal, quotes included. Invalid UTF-8 bytes
// become U+FFFD rather than invalid JSON.
inline std::string json_quote(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char esc[8];
          snprintf(esc, sizeof esc, "\\u%04x", c);
          out += esc;
        } else if (size_t n = utf8_sequence(text, i); n > 0) {
          out.append(text.substr(i, n));
          i += n;
          continue;
        } else {
          out += "\\ufffd";
        }
    }
    ++i;
  }
  return out + "\"";
}

}  // namespace rdmashim::tools
