// Client side: destinations whose recent connections were short start on
// plain TCP. An upgrade costs about 100 system calls and two mappings per
// connection (discovery, the Hello/Ack, a segment and its handover) and pays
// only once bytes move on the ring; a connect, one exchange and close (an
// HTTP/1.0 request, a health check, a connection-per-request client) never
// gets there, and was 3-4x slower than plain TCP. So each process remembers,
// per destination (address and port), how its last connections ended: when
// the last kShortStreak ones each closed within RDMASHIM_SHORT_CONN_MS of
// their connect, the last of them within kMemoryNs, the next connection
// skips everything (no discovery, no Hello: to the server it is a plain
// client) and costs what TCP costs. A connection that lives longer takes
// kShortLongPenalty off the streak at its close (so two in a row end even a
// long streak, while one late close on a loaded machine does not), and a
// second of quiet ends it: a pool of long-lived connections opened later
// upgrades again.
//
// Lock-free to read and never blocking: a slot is claimed with a try-lock,
// and a caller that loses the race just takes the full path (or forgets one
// sample), so the table is safe in a forked child and in a signal handler.
#pragma once

#include <sys/socket.h>

#include <cstdint>

namespace rdmashim::discovery {

inline constexpr unsigned kShortStreak = 2;               // short closes in a row before skipping
inline constexpr unsigned kShortMaxStreak = 8;            // a streak counts up to this
inline constexpr unsigned kShortLongPenalty = 4;          // what a long close takes off it
inline constexpr uint64_t kShortMemoryNs = 1'000'000'000;  // a streak older than this is forgotten

// Whether a connection to `peer` made at `now` (now_ns()) should stay plain
// because its destination's recent connections were short. False when the
// policy is off (RDMASHIM_SHORT_CONN_MS=0) or the address is not INET.
bool skip_short(const sockaddr* peer, socklen_t len, uint64_t now);

// A client connection to `peer` made at `connected_ns` closed at `now`.
void note_closed(const sockaddr* peer, socklen_t len, uint64_t connected_ns, uint64_t now);

// Tests: forget everything.
void forget_short_for_tests();

}  // namespace rdmashim::discovery
