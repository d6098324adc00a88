// Fork generations: 0 in the process that loaded rdmashim, +1 in each child.
// RDMASHIM_FORKGEN=N restricts upgrades to generation N (the seed project's
// knob); without it every generation upgrades, lazily, at its first I/O.
#pragma once

#include <atomic>

#include "util/config.h"

namespace rdmashim {

inline std::atomic<int> g_fork_generation{0};

inline int fork_generation() { return g_fork_generation.load(std::memory_order_relaxed); }
inline void note_fork_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

// Seccomp sandboxes (see docs/ARCHITECTURE.md, "System calls on the
// program's behalf"): a filter was in force when we loaded (kInherited) or
// the program is installing one now (kInstalling: PR_SET_SECCOMP through
// prctl; PR_SET_NO_NEW_PRIVS, which may precede a filter, counts as kInherited). Either way rdmashim makes no call of its own
// that it can avoid (no spinning: the spin loops yield the core); after
// kInstalling it starts no new upgrade either.
enum class Sandbox : int { kNone, kInherited, kInstalling };
inline std::atomic<int> g_sandbox{0};
inline Sandbox sandbox() { return static_cast<Sandbox>(g_sandbox.load(std::memory_order_relaxed)); }
inline void note_sandbox(Sandbox s) {
  int v = static_cast<int>(s), cur = g_sandbox.load(std::memory_order_relaxed);
  while (cur < v && !g_sandbox.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

// Whether this process may upgrade connections to a fast transport at all.
inline bool upgrades_allowed() {
  if (sandbox() == Sandbox::kInstalling) return false;
  const Config& c = config();
  if (c.disabled || c.transport == TransportChoice::kTcp) return false;
  return c.fork_generation < 0 || c.fork_generation == fork_generation();
}

}  // namespace rdmashim
