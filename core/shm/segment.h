// The shared-memory segment behind one upgraded same-host connection: a
// sealed memfd holding a control page and two rings, plus one eventfd
// doorbell per side. The server creates it; the client attaches to it after
// receiving the descriptors over the rendezvous socket.
//
// The memfd is sparse: a page costs memory once written, and the producer
// punches pages of a drained ring back out (ShmLink::release_tx).
//
// Layout (offsets in bytes, R = ring size):
//      0  SegmentHeader (one 4 KiB page)
//   4096  client's rx ring  (server -> client bytes), R bytes
// 4096+R  server's rx ring  (client -> server bytes), R bytes
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "util/unique_fd.h"

namespace rdmashim::shm {

enum Side : int { kClient = 0, kServer = 1 };

// A cursor alone on its cache line, so producer and consumer never share one.
struct alignas(64) Cursor {
  std::atomic<uint64_t> value{0};
};

// The producer's cursor and, on the same line (read together), its map
// word: log2(lap) << 32 | base mod R; byte p lies at (p - base) & (lap - 1).
// 0 (before the first write) means the whole ring from base 0.
struct alignas(64) ProducerCursor {
  std::atomic<uint64_t> value{0};
  std::atomic<uint64_t> map{0};
};

// What one side publishes. Written only by that side (except `sleepers`,
// which only that side changes too); read by both.
struct alignas(64) SideState {
  ProducerCursor produced;            // bytes written into the other side's rx ring, and map
  Cursor consumed;                    // bytes consumed from this side's rx ring
  // Threads of this side about to sleep on its doorbell: the low 16 bits
  // count those waiting for data (the peer's tail), the high 16 bits those
  // waiting for space (the peer's head). The peer rings only for a sleeper
  // that waits for what it published.
  alignas(64) std::atomic<uint32_t> sleepers{0};
  std::atomic<uint32_t> attached{0};  // 1 once this side mapped the segment
  // After fork, several processes may use this side: they serialize each
  // direction through these locks (a holder's pid, 0 when free).
  std::atomic<uint32_t> users{1};
  std::atomic<int32_t> rx_owner{0};
  std::atomic<int32_t> tx_owner{0};
  // Which of this side's directions passed their Switch, in whichever process
  // did it: its siblings follow without seeing the frame themselves.
  std::atomic<uint32_t> rx_switched{0};
  std::atomic<uint32_t> tx_switched{0};
  // Bumped by any process of this side that changed the socket's options
  // (O_NONBLOCK, timeouts, SO_RCVLOWAT): its siblings re-read their caches.
  std::atomic<uint32_t> options_gen{0};
  // Set once a second process used this side: a process left alone again
  // still re-reads the cursors its siblings moved.
  std::atomic<uint32_t> ever_shared{0};
  // The peer's Downgrade for this side's rx, read by whichever process of
  // this side: its ring stream ends at rx_left_at - 1 (0: not left). Only
  // this side's siblings read it (padding before: zero in older segments).
  std::atomic<uint64_t> rx_left_at{0};
};

struct SegmentHeader {
  uint64_t magic;      // kSegmentMagic
  uint32_t version;    // kSegmentVersion
  uint32_t ring_size;  // bytes per ring
  alignas(64) SideState side[2];
};

constexpr uint64_t kSegmentMagic = 0x676573'6873616d'64ull;  // "dmashseg", loosely
constexpr uint32_t kSegmentVersion = 3;  // 2: ProducerCursor::map; 3: sleepers split by direction
constexpr size_t kHeaderBytes = 4096;

static_assert(sizeof(SideState) == 192);
static_assert(offsetof(SideState, users) == 136);
static_assert(offsetof(SideState, options_gen) == 156);
static_assert(offsetof(SideState, rx_left_at) == 168);
static_assert(offsetof(SideState, ever_shared) == 160);
static_assert(offsetof(SegmentHeader, side) == 64);
static_assert(sizeof(SegmentHeader) <= kHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "cursors must be lock-free to be shared");

constexpr size_t segment_bytes(size_t ring_size) { return kHeaderBytes + 2 * ring_size; }

class Segment {
 public:
  // Creates, seals and maps a fresh segment and both doorbells.
  // Returns nullptr with *err set (a negative errno) on failure.
  static std::unique_ptr<Segment> create(size_t ring_size, int* err);
  // Maps a segment received from the peer after checking everything about it:
  // the memfd's seals and size, the header, and that the doorbells are eventfds.
  // Takes ownership of the descriptors in every case.
  static std::unique_ptr<Segment> attach(UniqueFd memfd, UniqueFd doorbell_client, UniqueFd doorbell_server,
                                         size_t ring_size, int* err);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  SegmentHeader* header() const { return header_; }
  unsigned char* rx_ring(Side s) const {
    return reinterpret_cast<unsigned char*>(header_) + kHeaderBytes + static_cast<size_t>(s) * ring_size_;
  }
  size_t ring_size() const { return ring_size_; }
  int memfd() const { return memfd_.get(); }
  int doorbell(Side s) const { return doorbell_[s].get(); }

 private:
  Segment() = default;
  SegmentHeader* header_ = nullptr;
  size_t ring_size_ = 0;
  UniqueFd memfd_;
  UniqueFd doorbell_[2];
};

}  // namespace rdmashim::shm
