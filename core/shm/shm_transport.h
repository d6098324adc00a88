// The same-host transport: a Segment, the ShmLink over it, and the handover
// of its descriptors through the rendezvous socket.
#pragma once

#include <sys/uio.h>

#include <memory>

#include "link/transport.h"
#include "shm/rendezvous.h"
#include "shm/shm_link.h"

namespace rdmashim::shm {

class ShmTransport final : public Transport {
 public:
  // Server: creates the segment and delivers it to the client's rendezvous
  // name together with the Hello's `nonce` and `token`. Our own writes keep
  // to tx_limit (<= ring_size; LocalState::tx_limit). nullptr and *err on failure.
  static std::unique_ptr<ShmTransport> offer(size_t ring_size, size_t tx_limit,
                                             const unsigned char (&rendezvous)[kNameBytes],
                                             const unsigned char (&nonce)[kNonceBytes],
                                             const unsigned char (&token)[kTokenBytes], int* err);
  // Client: receives the descriptors on `listener` (sent by user
  // `server_uid`), checks them and maps the segment. nullptr and *err on failure.
  // The listener becomes the client's doorbell (taken in every case).
  static std::unique_ptr<ShmTransport> accept(UniqueFd listener, const unsigned char (&nonce)[kNonceBytes],
                                              const unsigned char (&token)[kTokenBytes], uid_t server_uid,
                                              size_t ring_size, int* err);

  // A transport inherited across exec, from describe_for_exec()'s text.
  static std::unique_ptr<ShmTransport> adopt(const char* text, int* err);

  // A ring no peer writes any more, holding the stream bytes [head, end)
  // that a connection had not read when its verbs ring could not follow a
  // fork or an exec (conn/handover.cc); `fill` copies them, in order, into
  // the iovecs it is given (byte p lands at p mod ring_size), true if all. It follows fork and exec as any shared-memory ring;
  // `left`: the peer's ring stream ends at `end` and raw TCP bytes follow
  // (else the stream ends there: the peer shut down writing). Our tx is on
  // TCP already. A fresh segment and local page, an eventfd as the doorbell
  // (nobody rings it). nullptr and *err on failure.
  using Fill = bool (*)(void* ctx, const iovec* iov, int iovcnt);
  static std::unique_ptr<ShmTransport> hold(Side self, size_t ring_size, uint64_t head, uint64_t end, bool left,
                                            Fill fill, void* ctx, int* err);

  // Once handed over and mapped, the memfd is needed only to follow exec.
  void close_memfd() {
    link_.segment().close_memfd();
    link_.local_page().close_fd();
  }

  const char* name() const override { return "shm"; }
  // RDMASHIM_TEST_FAULT=shm-fork: this ring behaves as a verbs one at fork
  // and exec (it cannot follow them), so the hand-over is tested on one host.
  bool survives_fork() const override { return !pinned_; }
  std::string describe_for_exec() override;
  Link& link() override { return link_; }
  void mark_attached() override { link_.mark_attached(); }
  bool peer_attached() const override { return link_.peer_attached(); }
  // The sharing state is our LocalState: the peer cannot write it.
  void add_user() override {
    local().ever_shared.store(1, std::memory_order_relaxed);
    local().users.fetch_add(1, std::memory_order_acq_rel);
  }
  bool ever_shared() const override { return local().ever_shared.load(std::memory_order_relaxed) != 0; }
  void remove_user() override { local().users.fetch_sub(1, std::memory_order_acq_rel); }
  bool shared() const override { return local().users.load(std::memory_order_acquire) > 1; }
  void mark_switched(Dir d) override {
    (d == Dir::kRx ? local().rx_switched : local().tx_switched).store(1, std::memory_order_release);
  }
  bool switched(Dir d) const override {
    return (d == Dir::kRx ? local().rx_switched : local().tx_switched).load(std::memory_order_acquire) != 0;
  }
  // The peer's Downgrade of our rx, seen by whichever process of this side
  // read it: kept in our local page, where the peer cannot forge it.
  void mark_rx_left(uint64_t position) override {
    local().rx_left_at.store(position + 1, std::memory_order_release);
  }
  bool rx_left(uint64_t* position) const override {
    uint64_t v = local().rx_left_at.load(std::memory_order_acquire);
    if (v != 0) *position = v - 1;
    return v != 0;
  }
  uint32_t options_generation() const override { return local().options_gen.load(std::memory_order_acquire); }
  uint32_t bump_options_generation() override {
    return local().options_gen.fetch_add(1, std::memory_order_acq_rel) + 1;
  }
  void lock(Dir d) override;
  void unlock(Dir d) override;

 private:
  ShmTransport(std::unique_ptr<Segment> segment, std::unique_ptr<LocalPage> local, UniqueFd doorbell, Side self)
      : self_(self), link_(std::move(segment), std::move(local), std::move(doorbell), self) {}
  static std::unique_ptr<ShmTransport> make(std::unique_ptr<Segment> segment, UniqueFd doorbell, Side self,
                                            std::unique_ptr<LocalPage> local, int* err);
  LocalState& local() const { return link_.local(); }
  bool pinned_ = false;
  Side self_;
  ShmLink link_;
};

}  // namespace rdmashim::shm
