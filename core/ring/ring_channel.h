// The byte-stream ring protocol, one instance per upgraded connection, both
// directions. Single producer and single consumer per direction; callers
// serialize concurrent senders (and receivers) themselves.
//
// Positions are 64-bit byte counts that never wrap; the ring offset is
// (position - base) & (lap - 1); base 0 and lap = size unless the link is
// elastic (Link::elastic). The producer may write while tail - head < lap,
// and never more than Link::tx_limit (laps grow up to it).
//
// Elastic laps: a lap starts at 1 MiB (cache-hot, as the fixed rings were)
// and restarts at the ring's start whenever the consumer drained everything.
// When the writer finds the lap full and the reader does not drain, the lap
// doubles (up to size): the producer copies the wrapped part of the pending
// bytes past the old lap so every pending byte reads the same under either
// map, and publishes the new map. A reader that copied under the old map
// re-reads the map and copies again if it changed (the old place of the
// wrapped part may be overwritten once the lap grew).
// Everything the peer publishes is validated before use, so a broken or
// hostile peer yields an error, never an out-of-bounds access.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "link/link.h"

namespace rdmashim {

class RingChannel {
 public:
  explicit RingChannel(Link& link);

  // Copies as much of iov as fits (skipping the first `skip` bytes of it);
  // returns the count (0: ring full) or -EPROTO if the peer's cursor is bad.
  // A full lap grows only with may_grow.
  ssize_t write(const iovec* iov, int iovcnt, size_t skip = 0, bool may_grow = true);
  // Room in the current lap (the whole ring on fixed links); -EPROTO.
  ssize_t lap_room();
  // Copies out up to the iov's capacity; returns the count (0: ring empty) or
  // -EPROTO. With peek the bytes stay in the ring.
  ssize_t read(const iovec* iov, int iovcnt, bool peek = false);
  // Discards up to n readable bytes (MSG_TRUNC-style reads); returns the count.
  ssize_t discard(size_t n);

  // Bytes ready to read / space free to write (capped by the link's
  // put_room), refreshed from the link.
  // Negative -EPROTO if the peer's cursor is bad.
  ssize_t readable();
  ssize_t writable();

  // Lock-free answers for readiness checks from any thread: whether a read
  // (a write) would find bytes (room) now. Never used to move data.
  bool readable_hint() const { return link_.peer_tail() != link_.own_head(); }
  bool writable_hint() const { return link_.own_tail() - link_.peer_head() < limit_ && link_.put_room() > 0; }
  // Bytes waiting to be read / produced but not yet consumed by the peer,
  // at most our own limit (the peer's cursor is unchecked here: FIONREAD must not
  // tell the program to allocate more than TCP could have buffered).
  uint64_t unread_hint() const { return clamp(link_.peer_tail() - link_.own_head()); }
  uint64_t unacked_hint() const { return clamp(link_.own_tail() - link_.peer_head()); }
  // Re-reads our own positions from what we published: another process
  // (a fork sharing this connection) may have moved them.
  void resync_rx();
  void resync_tx();
  uint64_t clamp(uint64_t n) const { return n > limit_ ? limit_ : n; }

  // Elastic links. The producer hands back the pages it wrote since the last
  // time, if the consumer drained everything (caller holds the send side);
  // true if nothing is left to give back. pending says there is something.
  static constexpr size_t kReleaseMinBytes = 64 * 1024;
  bool release_pending() const { return elastic_ && tx_dirty_ > kReleaseMinBytes; }
  // The link has registered memory to maintain (Link::maintain), and whether
  // it has something to do now: the connection is in the idle registry
  // while it does.
  bool maintained() const { return maintained_; }
  bool maintenance_wanted() const { return maintained_ && link_.maintenance_wanted(); }
  bool release_tx();
  // The consumer, once the producer is gone for good: our whole rx ring.
  void release_rx();

  uint64_t tx_position() const { return tx_tail_; }
  uint64_t rx_position() const { return rx_head_; }
  Link& link() { return link_; }

 private:
  Link& link_;
  const uint64_t size_;
  const uint64_t mask_;
  const uint64_t limit_;     // Link::tx_limit: our stream never holds more of the ring
  uint64_t tx_tail_ = 0;     // bytes we produced
  uint64_t tx_head_ = 0;     // latest credit seen from the peer
  uint64_t rx_head_ = 0;     // bytes we consumed
  uint64_t rx_tail_ = 0;     // latest production seen from the peer
  uint64_t tx_base_ = 0;     // where our current lap began (elastic links)
  uint64_t tx_lap_;          // its length
  uint64_t tx_dirty_ = 0;    // bytes from the ring's start we may have written since the last release
  const bool elastic_;
  const bool maintained_;
  const uint64_t first_lap_;

  void publish_map();
  void restart_lap();  // consumer drained: a first lap from our tail
  void grow_lap();
};

}  // namespace rdmashim
