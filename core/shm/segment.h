// The shared-memory segment behind one upgraded same-host connection: a
// sealed memfd holding a control page and two rings. The server creates it;
// the client attaches to it after receiving it over the rendezvous socket.
// Everything in it is the peer's to write: what it publishes is validated
// before use (RingChannel), and nothing in it decides whether we block or
// spin (our locks and sleeper count live in LocalState, local_state.h).
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

// What one side publishes. Written only by that side; read by both, and
// to the other side only ever a hint.
struct alignas(64) SideState {
  ProducerCursor produced;            // bytes written into the other side's rx ring, and map
  Cursor consumed;                    // bytes consumed from this side's rx ring
  // Threads of this side about to sleep on its doorbell: bits 0-15 count
  // those waiting for data (the peer's tail), bits 16-31 those waiting for
  // space (the peer's head); bits 32-63 count sleeps, so the peer rings once
  // per sleep however often it publishes meanwhile. The peer rings only for
  // a sleeper that waits for what it published.
  alignas(64) std::atomic<uint64_t> sleepers{0};
  std::atomic<uint32_t> attached{0};  // 1 once this side mapped the segment
  // Datagrams this side wrote to the other's doorbell: the other drains
  // what it is owed (a ring that landed after its sleeper left would
  // otherwise stay queued, and under edge-triggered epoll pile up).
  std::atomic<uint64_t> rings{0};
  // The CPU this side's last waiter spun on, plus one (0: not known). Two
  // peers the scheduler put on one core each spin against the other's turn:
  // a spinner that sees the other's CPU equal to its own yields at every
  // turn instead. Added in padding (an older peer leaves it 0: no version).
  std::atomic<int32_t> cpu{0};
};

struct SegmentHeader {
  uint64_t magic;      // kSegmentMagic
  uint32_t version;    // kSegmentVersion
  uint32_t ring_size;  // bytes per ring
  alignas(64) SideState side[2];
};

constexpr uint64_t kSegmentMagic = 0x676573'6873616d'64ull;  // "dmashseg", loosely
// 2: ProducerCursor::map; 3: sleepers split by direction; 4: locks and
// sharing state out of the segment, sleepers count sleeps, socket doorbells.
constexpr uint32_t kSegmentVersion = 4;
constexpr size_t kHeaderBytes = 4096;

static_assert(sizeof(SideState) == 192);
static_assert(offsetof(SideState, sleepers) == 128);
static_assert(offsetof(SideState, attached) == 136);
static_assert(offsetof(SideState, rings) == 144);
static_assert(offsetof(SideState, cpu) == 152);
static_assert(offsetof(SegmentHeader, side) == 64);
static_assert(sizeof(SegmentHeader) <= kHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "cursors must be lock-free to be shared");

constexpr size_t segment_bytes(size_t ring_size) { return kHeaderBytes + 2 * ring_size; }

// A new descriptor for the memfd behind our own mapping [start, start+bytes),
// through /proc/self/map_files: needs CAP_CHECKPOINT_RESTORE (or
// CAP_SYS_ADMIN); -1 without. Lets a connection drop a memfd it needs only
// to follow exec, where the process could get it back.
int open_own_mapping(const void* start, size_t bytes);

class Segment {
 public:
  // Creates, seals and maps a fresh segment.
  // Returns nullptr with *err set (a negative errno) on failure.
  static std::unique_ptr<Segment> create(size_t ring_size, int* err);
  // Maps a segment received from the peer after checking everything about
  // it: the memfd's seals and size, and the header. Takes ownership of it in
  // every case. `received`: it was just received (at the lowest free number)
  // and is moved out of the program's way (fds::keep); inherited across
  // exec, it already was.
  static std::unique_ptr<Segment> attach(UniqueFd memfd, size_t ring_size, int* err, bool received = true);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  SegmentHeader* header() const { return header_; }
  unsigned char* rx_ring(Side s) const {
    return reinterpret_cast<unsigned char*>(header_) + kHeaderBytes + static_cast<size_t>(s) * ring_size_;
  }
  size_t ring_size() const { return ring_size_; }
  // -1 once closed: the mapping is all a connection needs, except to follow exec.
  int memfd() const { return memfd_.get(); }
  void close_memfd();
  int reopen_memfd();

 private:
  Segment() = default;
  int open_from_mapping() const;
  bool keep_memfd();  // fds::keep
  SegmentHeader* header_ = nullptr;
  size_t ring_size_ = 0;
  UniqueFd memfd_;
};

}  // namespace rdmashim::shm
