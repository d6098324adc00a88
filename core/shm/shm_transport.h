// The same-host transport: a Segment, the ShmLink over it, and the handover
// of its descriptors through the rendezvous socket.
#pragma once

#include <memory>

#include "link/transport.h"
#include "shm/rendezvous.h"
#include "shm/shm_link.h"

namespace rdmashim::shm {

class ShmTransport final : public Transport {
 public:
  // Server: creates the segment and delivers it to the client's rendezvous
  // name together with the Hello's `nonce` and `token`. nullptr and *err on failure.
  static std::unique_ptr<ShmTransport> offer(size_t ring_size, const unsigned char (&rendezvous)[kNameBytes],
                                             const unsigned char (&nonce)[kNonceBytes],
                                             const unsigned char (&token)[kTokenBytes], int* err);
  // Client: receives the descriptors on `listener` (sent by user
  // `server_uid`), checks them and maps the segment. nullptr and *err on failure.
  static std::unique_ptr<ShmTransport> accept(int listener, const unsigned char (&nonce)[kNonceBytes],
                                              const unsigned char (&token)[kTokenBytes], uid_t server_uid,
                                              size_t ring_size, int* err);

  // A transport inherited across exec, from describe_for_exec()'s text.
  static std::unique_ptr<ShmTransport> adopt(const char* text, int* err);

  const char* name() const override { return "shm"; }
  std::string describe_for_exec() override;
  Link& link() override { return link_; }
  void mark_attached() override { link_.mark_attached(); }
  bool peer_attached() const override { return link_.peer_attached(); }
  void add_user() override {
    link_.mine().ever_shared.store(1, std::memory_order_relaxed);
    link_.mine().users.fetch_add(1, std::memory_order_acq_rel);
  }
  bool ever_shared() const override {
    return const_cast<ShmLink&>(link_).mine().ever_shared.load(std::memory_order_relaxed) != 0;
  }
  void remove_user() override { link_.mine().users.fetch_sub(1, std::memory_order_acq_rel); }
  bool shared() const override {
    return const_cast<ShmLink&>(link_).mine().users.load(std::memory_order_acquire) > 1;
  }
  void mark_switched(Dir d) override {
    (d == Dir::kRx ? link_.mine().rx_switched : link_.mine().tx_switched).store(1, std::memory_order_release);
  }
  bool switched(Dir d) const override {
    SideState& s = const_cast<ShmLink&>(link_).mine();
    return (d == Dir::kRx ? s.rx_switched : s.tx_switched).load(std::memory_order_acquire) != 0;
  }
  void mark_rx_left(uint64_t position) override {
    link_.mine().rx_left_at.store(position + 1, std::memory_order_release);
  }
  bool rx_left(uint64_t* position) const override {
    uint64_t v = const_cast<ShmLink&>(link_).mine().rx_left_at.load(std::memory_order_acquire);
    if (v != 0) *position = v - 1;
    return v != 0;
  }
  uint32_t options_generation() const override {
    return const_cast<ShmLink&>(link_).mine().options_gen.load(std::memory_order_acquire);
  }
  uint32_t bump_options_generation() override {
    return link_.mine().options_gen.fetch_add(1, std::memory_order_acq_rel) + 1;
  }
  void lock(Dir d) override;
  void unlock(Dir d) override;

 private:
  ShmTransport(std::unique_ptr<Segment> segment, Side self) : self_(self), link_(std::move(segment), self) {}
  Side self_;
  ShmLink link_;
};

}  // namespace rdmashim::shm
