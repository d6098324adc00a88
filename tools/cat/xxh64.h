// XXH64 (Yann Collet's xxHash, 64-bit variant), streaming, written from the
// published specification: the --verify checksum of rdma_send/rdma_recv.
// Not cryptographic; it catches corruption and truncation, not an attacker.
// Runs at memory speed (~10+ GB/s on one core here), so --verify costs
// little next to the copy itself. Results match `xxhsum -H64` (seed 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rdmashim::cat {

class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0) { reset(seed); }

  void reset(uint64_t seed = 0) {
    seed_ = seed;
    v_[0] = seed + kP1 + kP2;
    v_[1] = seed + kP2;
    v_[2] = seed;
    v_[3] = seed - kP1;
    total_ = 0;
    used_ = 0;
  }

  void update(const void* data, size_t len) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += len;
    if (used_ + len < 32) {
      memcpy(buf_ + used_, p, len);
      used_ += static_cast<uint32_t>(len);
      return;
    }
    if (used_ > 0) {
      size_t take = 32 - used_;
      memcpy(buf_ + used_, p, take);
      stripes(buf_, 32);
      p += take;
      len -= take;
      used_ = 0;
    }
    size_t whole = len & ~size_t{31};
    if (whole > 0) stripes(p, whole);
    p += whole;
    len -= whole;
    memcpy(buf_, p, len);
    used_ = static_cast<uint32_t>(len);
  }

  uint64_t digest() const {
    uint64_t h;
    if (total_ >= 32) {
      h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
      for (uint64_t v : v_) h = merge(h, v);
    } else {
      h = seed_ + kP5;
    }
    h += total_;
    const unsigned char* p = buf_;
    uint32_t left = used_;
    while (left >= 8) {
      h ^= round(0, load64(p));
      h = rotl(h, 27) * kP1 + kP4;
      p += 8;
      left -= 8;
    }
    if (left >= 4) {
      h ^= static_cast<uint64_t>(load32(p)) * kP1;
      h = rotl(h, 23) * kP2 + kP3;
      p += 4;
      left -= 4;
    }
    while (left > 0) {
      h ^= *p * kP5;
      h = rotl(h, 11) * kP1;
      ++p;
      --left;
    }
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

  uint64_t bytes() const { return total_; }

  static uint64_t of(const void* data, size_t len, uint64_t seed = 0) {
    Xxh64 x(seed);
    x.update(data, len);
    return x.digest();
  }

 private:
  static constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
  static constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
  static constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
  static constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
  static constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t load64(const unsigned char* p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;  // little-endian host (checked in stream_format.h)
  }
  static uint32_t load32(const unsigned char* p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
  }
  static uint64_t round(uint64_t acc, uint64_t input) {
    acc += input * kP2;
    acc = rotl(acc, 31);
    return acc * kP1;
  }
  static uint64_t merge(uint64_t h, uint64_t v) {
    h ^= round(0, v);
    return h * kP1 + kP4;
  }
  // len is a multiple of 32.
  void stripes(const unsigned char* p, size_t len) {
    uint64_t a = v_[0], b = v_[1], c = v_[2], d = v_[3];
    const unsigned char* end = p + len;
    while (p < end) {
      a = round(a, load64(p));
      b = round(b, load64(p + 8));
      c = round(c, load64(p + 16));
      d = round(d, load64(p + 24));
      p += 32;
    }
    v_[0] = a;
    v_[1] = b;
    v_[2] = c;
    v_[3] = d;
  }

  uint64_t seed_ = 0;
  uint64_t v_[4] = {};
  uint64_t total_ = 0;
  unsigned char buf_[32] = {};
  uint32_t used_ = 0;
};

}  // namespace rdmashim::cat
