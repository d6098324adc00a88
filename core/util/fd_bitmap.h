// One bit per descriptor number, lock-free, over the kernel's default
// nr_open (128 KiB of zero pages until used); numbers beyond it are never
// set. Statically allocated, usable from any hook at any time (no
// constructor runs: the words start zero).
#pragma once

#include <atomic>
#include <cstdint>

namespace rdmashim {

class FdBitmap {
 public:
  static constexpr unsigned kBits = 1u << 20;

  void set(int fd) {
    if (tracked(fd)) words_[fd / 64].fetch_or(bit(fd), std::memory_order_relaxed);
  }
  // Clears without a write when already clear (a cache line other threads read stays shared).
  void clear(int fd) {
    if (tracked(fd) && (words_[fd / 64].load(std::memory_order_relaxed) & bit(fd))) {
      words_[fd / 64].fetch_and(~bit(fd), std::memory_order_relaxed);
    }
  }
  bool has(int fd) const { return tracked(fd) && (words_[fd / 64].load(std::memory_order_relaxed) & bit(fd)); }
  // Whether the word holding fd has no bit set (scans skip 64 at a time).
  bool word_empty(unsigned fd) const { return fd >= kBits || words_[fd / 64].load(std::memory_order_relaxed) == 0; }
  void clear_range(unsigned first, unsigned last) {
    for (unsigned w = first / 64; w < kBits / 64 && w <= last / 64; ++w) {
      uint64_t mask = ~uint64_t{0};
      if (w == first / 64) mask &= ~uint64_t{0} << (first % 64);
      if (w == last / 64 && last % 64 != 63) mask &= (uint64_t{1} << (last % 64 + 1)) - 1;
      if (words_[w].load(std::memory_order_relaxed) & mask) words_[w].fetch_and(~mask, std::memory_order_relaxed);
    }
  }

 private:
  static bool tracked(int fd) { return fd >= 0 && static_cast<unsigned>(fd) < kBits; }
  static uint64_t bit(int fd) { return uint64_t{1} << (fd % 64); }
  std::atomic<uint64_t> words_[kBits / 64]{};
};

}  // namespace rdmashim
