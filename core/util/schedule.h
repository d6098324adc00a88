// Test-only perturbation points for the interleaving harness
// (tests/interleave/). With RDMASHIM_TEST_SCHEDULE=<seed> every
// RDMASHIM_SCHED_POINT(kName) does, chosen by a PRNG seeded by that seed and
// the thread's ordinal in its process: nothing, sched_yield(), or a sleep of
// 0-200 us (the per-call ring and wait points only one time in eight). Unset (the only setting outside tests) a point costs one relaxed
// load and a branch predicted not taken; errno is never changed.
//
// Each point sits at a step where another thread or the peer may overtake us:
// the handshake, the switch of a direction, a ring write or read that wraps,
// publishing cursors, arming a sleep, shutdown and close.
#pragma once

#include <atomic>
#include <cstdint>

#include "util/misc.h"

namespace rdmashim::sched {

enum Point : uint8_t {
  // Handshake (core/conn/handshake.cc).
  kHandshakeSendHello,    // client: Hello built, not sent
  kHandshakeDetectHello,  // server: the head of the stream peeked (Hello or not)
  kHandshakeSendAck,      // server: transport offered, Ack not sent
  kHandshakeAckSent,      // server: Ack sent, tx still undecided
  kHandshakeAwaitAck,     // client: the head of the stream peeked (Ack or not)
  kHandshakeAttach,       // client: about to accept and map the segment
  // Switching a direction.
  kSwitchSend,      // a Switch or Plain frame about to go out
  kSwitchSent,      // sent; our tx not yet marked as on the ring
  kSwitchReceived,  // the peer's Switch read; our rx not yet on the ring
  kPlainReceived,   // the peer's Plain read
  // Ring (core/ring/ring_channel.cc).
  kRingWrapWrite,    // between the two pieces of a write that wraps
  kRingWrapRead,     // between the two pieces of a read that wraps
  kRingPublishTail,  // bytes copied, tail not yet published
  kRingPublishHead,  // bytes consumed, head (credit) not yet published
  // Reserved for elastic rings (a ring that grows or shrinks while in use):
  // place these at the step where the new ring is announced and where the
  // old one is retired.
  kRingGrow,
  kRingShrink,
  // Readiness and waiting (core/conn/readiness.cc).
  kReadinessConsume,  // poll/epoll about to consume our own setup bytes
  kWaitArmed,         // sleeper announced, ring not yet re-checked
  // Shutdown and close (core/conn/connection.cc, preload/hooks_socket.cc).
  kShutdownFin,        // the kernel's shutdown() about to run
  kCloseDrain,         // last close: draining control frames
  kCloseReal,          // last close: the kernel's close() about to run
  // Leaving a ring (core/conn/downgrade.cc).
  kDowngradeSend,      // our ring writes done, the Downgrade frame not sent
  kDowngradeReceived,  // the peer's Downgrade read; our rx not yet off the ring
  // Reading (core/conn/data_path.cc); last, so the older points keep their values.
  kReadEmpty,  // a non-blocking read found the ring and the TCP side empty, EAGAIN not yet returned
  kPointCount
};

const char* point_name(Point p);

// 0: the configuration was not read yet, 1: off, 2: on. Set by config().
inline std::atomic<uint8_t> g_state{0};
inline constexpr uint8_t kUnknown = 0, kOff = 1, kOn = 2;

void perturb(Point p);  // reads the configuration if need be; no-op when off

// With RDMASHIM_TEST_SCHEDULE=<seed>,downgrade=<n>: true with probability 1/n,
// from this thread's schedule PRNG (so a seed replays its downgrades too).
// Only called where point() would perturb (the schedule is on).
bool downgrade_now();

inline bool on() { return RDMASHIM_UNLIKELY(g_state.load(std::memory_order_relaxed) != kOff); }

inline void point(Point p) {
  if (RDMASHIM_UNLIKELY(g_state.load(std::memory_order_relaxed) != kOff)) perturb(p);
}

}  // namespace rdmashim::sched

#define RDMASHIM_SCHED_POINT(name) ::rdmashim::sched::point(::rdmashim::sched::name)
