// Diagnostics on stderr, off the hot path by construction: the level check is
// one relaxed atomic load, and nothing in rdmashim logs per call or per byte.
// Only setup events (one line per connection at most, at info level) and
// warnings are ever written. RDMASHIM_LOG picks the level.
#pragma once

#include <atomic>

namespace rdmashim::log {

inline std::atomic<int> g_level{1};  // 0 off, 1 warn, 2 info, 3 debug

inline void set_level(int level) { g_level.store(level, std::memory_order_relaxed); }
inline bool enabled(int level) { return g_level.load(std::memory_order_relaxed) >= level; }

void write(int level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace rdmashim::log

// Macros only so the arguments are not evaluated when the level is off.
#define RDMASHIM_LOG_AT(level, ...)                                          \
  do {                                                                       \
    if (::rdmashim::log::enabled(level)) ::rdmashim::log::write(level, __VA_ARGS__); \
  } while (0)

namespace rdmashim::log {
template <typename... A>
inline void warn(const char* fmt, A... a) { RDMASHIM_LOG_AT(1, fmt, a...); }
template <typename... A>
inline void info(const char* fmt, A... a) { RDMASHIM_LOG_AT(2, fmt, a...); }
template <typename... A>
inline void debug(const char* fmt, A... a) { RDMASHIM_LOG_AT(3, fmt, a...); }
}  // namespace rdmashim::log
