// An established fast path for one connection: the link its ring runs over
// and what is needed to hand it over. Created by the server side when it
// answers a Hello, attached to by the client when it reads the Ack.
#pragma once

#include <string>

#include "link/link.h"

namespace rdmashim {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual Link& link() = 0;
  // The local side is ready to read its rx ring; the peer may switch.
  virtual void mark_attached() = 0;
  // The peer is ready to read the ring we write; we may switch.
  virtual bool peer_attached() const = 0;

  // Sharing one side between processes (after fork). shared() is true while
  // more than one process uses it; operations then hold the direction's
  // cross-process lock and re-read the cursors from the transport.
  enum class Dir { kRx, kTx };
  virtual void add_user() {}
  virtual void remove_user() {}
  virtual bool shared() const { return false; }
  // Some other process used this side at some point (it may have moved the cursors).
  virtual bool ever_shared() const { return false; }
  virtual void lock(Dir) {}
  virtual void unlock(Dir) {}
  // Changes of the socket's options (O_NONBLOCK, timeouts, SO_RCVLOWAT) by
  // any process sharing this side: each process re-reads its cached values
  // when the generation moved. bump returns the new generation.
  virtual uint32_t options_generation() const { return 0; }
  virtual uint32_t bump_options_generation() { return 0; }
  // A direction passed its Switch (in this process or a sibling).
  virtual void mark_switched(Dir) {}
  virtual bool switched(Dir) const { return false; }
  // The peer's Downgrade of our rx (read in this process or a sibling): the
  // ring stream ends at `position`; raw TCP bytes follow the frame.
  virtual void mark_rx_left(uint64_t) {}
  virtual bool rx_left(uint64_t*) const { return false; }
  // False if a forked child must not touch the parent's transport at all
  // (a verbs QP: its queues are mapped shared with the parent's).
  virtual bool survives_fork() const { return true; }
  // Keeps the transport's descriptors open across exec and describes them
  // for the next image; "" if this transport cannot follow exec.
  virtual std::string describe_for_exec() { return ""; }
};

}  // namespace rdmashim
