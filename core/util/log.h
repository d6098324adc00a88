// Diagnostics, off the hot path by construction. Nothing in rdmashim logs per
// call or per byte: only setup events (one line per connection at most, at
// info level) and warnings.
//
//   RDMASHIM_WARN("fd %d: ...", fd);   // printf-checked at the call site
//
// The macros test the level first (one relaxed load), so their arguments are
// not evaluated when the level is off. Warnings are rate-limited per call
// site: a peer that makes every connection fail cannot flood a program's
// stderr; what was dropped is counted on the site's next line. Info and debug
// lines are never dropped: a user asked for every one of them.
// RDMASHIM_LOG picks the level, RDMASHIM_LOG_FILE sends the lines to a file.
#pragma once

#include <atomic>
#include <cstdint>

namespace rdmashim::log {

enum Level : int { kOff = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

inline std::atomic<int> g_level{kWarn};

inline void set_level(int level) { g_level.store(level, std::memory_order_relaxed); }
// Asks the pid the lines start with now, at start-up, not in a first line
// (a signal handler's, or a vfork child's sharing our memory).
void prime_pid();
inline bool enabled(int level) { return g_level.load(std::memory_order_relaxed) >= level; }

// Lines go to stderr unless a file is set (appended to, opened per line so the
// program can never close or reuse our descriptor). nullptr: back to stderr.
void set_file(const char* path);

// One per call site: at most kBurst lines per kWindowNs, then drops (counted).
class RateLimit {
 public:
  static constexpr uint32_t kBurst = 10;
  static constexpr uint64_t kWindowNs = 10'000'000'000ull;

  // True if a line may go out at `now_ns`; *dropped then holds how many lines
  // this site dropped since the last one that went out.
  bool admit(uint64_t now_ns, uint64_t* dropped);

 private:
  std::atomic<uint64_t> window_start_{0};
  std::atomic<uint32_t> in_window_{0};
  std::atomic<uint64_t> dropped_{0};
};

// `limit` may be null (never dropped).
void write(int level, RateLimit* limit, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

}  // namespace rdmashim::log

#define RDMASHIM_LOG_AT(level, limit, ...)                                  \
  do {                                                                      \
    if (::rdmashim::log::enabled(level)) {                                  \
      ::rdmashim::log::write(level, limit, __VA_ARGS__);                    \
    }                                                                       \
  } while (0)

#define RDMASHIM_WARN(...)                                                  \
  do {                                                                      \
    static ::rdmashim::log::RateLimit rdmashim_log_site_;                   \
    RDMASHIM_LOG_AT(::rdmashim::log::kWarn, &rdmashim_log_site_, __VA_ARGS__); \
  } while (0)
#define RDMASHIM_INFO(...) RDMASHIM_LOG_AT(::rdmashim::log::kInfo, nullptr, __VA_ARGS__)
#define RDMASHIM_DEBUG(...) RDMASHIM_LOG_AT(::rdmashim::log::kDebug, nullptr, __VA_ARGS__)
