// Registered buffers that connections hand back, kept for the next one
// (registering pins and maps pages: milliseconds per MiB on some providers).
// Bounded in bytes and in count: an idle process keeps at most `cap` bytes
// registered for connections that are gone. Not thread-safe (Device locks).
#pragma once

#include <cstddef>
#include <vector>

struct ibv_mr;

namespace rdmashim::verbs {

// A registered buffer.
struct Buffer {
  void* data = nullptr;
  size_t size = 0;
  ibv_mr* mr = nullptr;
  bool remote = false;  // registered for remote writes (a receive ring)
};

class RegPool {
 public:
  static constexpr size_t kMaxEntries = 16;  // some providers allow about a hundred MRs
  explicit RegPool(size_t cap_bytes) : cap_(cap_bytes) {}

  // A pooled buffer of exactly this size and kind, if any.
  bool take(size_t size, bool remote, Buffer* out);
  // Keeps b, evicting the oldest entries to stay within the bounds; what
  // must be deregistered now is appended to *drop (b itself if it is larger
  // than the whole cap).
  void give_back(const Buffer& b, std::vector<Buffer>* drop);
  // Gives up the oldest entry (to deregister: room for a live connection).
  bool evict_oldest(Buffer* out);
  size_t bytes() const { return bytes_; }
  size_t count() const { return pool_.size(); }
  size_t cap() const { return cap_; }

 private:
  size_t cap_;
  size_t bytes_ = 0;
  std::vector<Buffer> pool_;  // oldest first
};

}  // namespace rdmashim::verbs
