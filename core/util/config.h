// Process-wide settings, read once from RDMASHIM_* environment variables.
// Every variable is documented in the README's table; bad values are reported
// once and replaced by the default, never fatal.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmashim {

enum class TransportChoice { kAuto, kShm, kVerbs, kTcp };

struct Config {
  TransportChoice transport = TransportChoice::kAuto;  // RDMASHIM_TRANSPORT
  uint32_t setup_timeout_ms = 2000;                    // RDMASHIM_SETUP_TIMEOUT_MS
  uint32_t spin_us = 50;                               // RDMASHIM_SPIN_US
  size_t ring_size = 1024 * 1024;                      // RDMASHIM_RING_SIZE (power of two)
  int log_level = 1;                                   // RDMASHIM_LOG: 0 off .. 3 debug
  int fork_generation = -1;                            // RDMASHIM_FORKGEN (-1: any)
  bool disabled = false;                               // RDMASHIM_DISABLE=1
};

// Parsed on first use; immutable afterwards.
const Config& config();

// Parses a decimal unsigned value with an optional k/m/g suffix (binary units).
// Returns false on anything else: no silent atoi() garbage.
bool parse_size(const char* text, uint64_t* out);

}  // namespace rdmashim
