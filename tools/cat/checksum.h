// The --verify checksum of rdma_send/rdma_recv: XXH64 (seed 0) from Debian's
// libxxhash, inlined (XXH_INLINE_ALL: a build dependency only, nothing to
// link). Not cryptographic; it catches corruption and truncation, not an
// attacker. Runs at memory speed, so --verify costs little next to the copy.
// Results match `xxhsum -H64`.
#pragma once

#include <cstddef>
#include <cstdint>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace rdmashim::cat {

// Streaming XXH64; the state lives inline (no allocation).
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0) { reset(seed); }
  void reset(uint64_t seed = 0) { XXH64_reset(&state_, seed); }
  void update(const void* data, size_t len) { XXH64_update(&state_, data, len); }
  uint64_t digest() const { return XXH64_digest(&state_); }

  static uint64_t of(const void* data, size_t len, uint64_t seed = 0) { return XXH64(data, len, seed); }

 private:
  XXH64_state_t state_;
};

}  // namespace rdmashim::cat
