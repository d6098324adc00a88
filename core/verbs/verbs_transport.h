// The cross-host transport: a VerbsLink whose queue pair each side connects
// with the other's Params, carried in the handshake (after the Hello from the
// client, after the Ack from the server; see wire.h).
//
// Who may write when: the server moves its QP to RTS before it sends its Ack,
// so the client may write as soon as its own QP is connected. The client then
// announces itself with a bare credit write; the server's first completion
// from the client is its "peer attached", and only then does it switch.
#pragma once

#include <sys/socket.h>

#include <memory>

#include "link/transport.h"
#include "verbs/verbs_link.h"

namespace rdmashim::verbs {

class VerbsTransport final : public Transport {
 public:
  // A QP in INIT with its rings registered at ring_size (callers: never
  // more than tcp_equivalent_ring_size of their own socket), for the
  // connection whose local address is `local`. nullptr and *err (negative
  // errno) when there is no usable device; -EDQUOT, *limit saying which,
  // when this process is at its verbs limits (verbs/limits.h).
  static std::unique_ptr<VerbsTransport> prepare(const sockaddr* local, size_t ring_size, int* err,
                                                 const char** limit = nullptr);
  // The ring size a connection on `fd` registers: what TCP would buffer
  // there, but never more than RLIMIT_MEMLOCK lets an unprivileged process
  // pin for two connections (ring + send buffer each): with the common
  // 8 MiB limit a ring of 2 MiB, where 16 MiB would fail to register and
  // leave every connection on TCP.
  static size_t ring_size_for(int fd);

  const Params& local_params() const { return link_->local_params(); }
  // RTR and RTS towards the peer, the rings used at `ring` bytes (see
  // VerbsLink::connect); once, never retried.
  int connect(const Params& peer, size_t ring) { return link_->connect(peer, ring); }

  const char* name() const override { return "verbs"; }
  Link& link() override { return *link_; }
  void mark_attached() override { link_->announce(); }
  bool peer_attached() const override { return link_->peer_seen(); }
  bool survives_fork() const override { return false; }

 private:
  explicit VerbsTransport(std::unique_ptr<VerbsLink> link) : link_(std::move(link)) {}
  std::unique_ptr<VerbsLink> link_;
};

}  // namespace rdmashim::verbs
