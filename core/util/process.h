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

// Whether this process may upgrade connections to a fast transport at all.
inline bool upgrades_allowed() {
  const Config& c = config();
  if (c.disabled || c.transport == TransportChoice::kTcp) return false;
  return c.fork_generation < 0 || c.fork_generation == fork_generation();
}

}  // namespace rdmashim
