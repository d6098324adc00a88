// Cross-host discovery over RDMA-CM: no extra TCP port, no daemon.
//
// A listener under rdmashim on a host with an active RDMA device also listens
// on the same port number in RDMA-CM's TCP port space (RDMA_PS_TCP, separate
// from the kernel's TCP ports). A background thread answers every request
// there with a reject carrying kAnswer: a "yes", and no connection. A client
// asks before its SYN, and says in the same request whether a Hello follows
// (announcements.h). The answer means the server runs rdmashim;
// anything else (a plain reject: nobody listens there; nothing within the
// probe timeout; no RDMA device here) means plain TCP.
//
// Negative answers are cached per destination for a minute, so a plain
// server costs one probe a minute. Positive ones are asked again for every
// connection: a stale "yes" would send a Hello to a plain server.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <memory>

namespace rdmashim::discovery {

// The advertisement outlives the process that called listen() (daemons,
// pre-forked pools, socket activation): the id belongs to the process that
// made it and dies with it, so every process holding the listener takes over
// where it accepts (take_over_remote); while another process still holds the
// port's id (EADDRINUSE, or EADDRNOTAVAIL when either is on the wildcard
// address), the advertisement waits and this process's
// answering thread tries again once a second, so the first to notice the
// holder gone answers for all.
class RemoteAdvert {
 public:
  ~RemoteAdvert();  // stops answering (in the process that started it)
  RemoteAdvert(const RemoteAdvert&) = delete;
  RemoteAdvert& operator=(const RemoteAdvert&) = delete;
  // Made by another process (a forked child's copy of its parent's).
  bool inherited() const;

 private:
  friend std::unique_ptr<RemoteAdvert> advertise(const sockaddr*, socklen_t, bool);
  friend bool bind_advert(RemoteAdvert*);
  friend void take_over_remote(std::unique_ptr<RemoteAdvert>*);
  RemoteAdvert() = default;
  void* id_ = nullptr;  // rdma_cm_id*; nullptr: waiting for the port
  int owner_ = 0;       // pid that created it
  sockaddr_storage addr_{};
};

// Starts answering probes for a listening socket bound to `local`; nullptr if
// this host has no usable RDMA device. A port another process holds in
// RDMA_PS_TCP gives an advertisement that waits for it (see above).
std::unique_ptr<RemoteAdvert> advertise_remote(const sockaddr* local, socklen_t len);

// Before accept() on a listener: an advertisement this process inherited is
// replaced by its own (answering, or waiting for the holder to go).
void take_over_remote(std::unique_ptr<RemoteAdvert>* advert);

// The answer of a probe a client asks before connect().
// kUnsure: the path to the peer was still being resolved when the probe's
// time was up (a cold ARP entry on a loaded host): plain for this
// connection, and asked again for the next, never cached as a "no".
enum class RemoteAnswer : uint8_t { kNotAsked, kNo, kYes, kUnsure };
struct RemoteProbe {
  RemoteAnswer answer = RemoteAnswer::kNotAsked;
  bool announced = false;  // the probe said a Hello with `nonce` follows
  uint8_t nonce[16] = {};
};

// A client, before its SYN: asks `peer` whether it runs rdmashim (as
// probe_remote), and with `announce` says in the same request that a Hello
// with a fresh nonce (out->nonce) follows, so that a server which speaks
// first waits for it (announcements.h). A peer RDMASHIM_PEERS forces is asked
// only to announce. A "no" is not cached here (a server not up yet would be
// remembered as plain): the caller calls remember_remote_no() once connected.
void ask_remote(const sockaddr* peer, socklen_t len, bool announce, RemoteProbe* out);
// Not for a destination that refused a connection within the last 10 s
// (note_refused): a server starting up may have answered the probe before
// its listen() advertised it and taken the connection after.
void remember_remote_no(const sockaddr* peer, socklen_t len);
// A connect() to `peer` that a probe had asked about was refused.
void note_refused(const sockaddr* peer, socklen_t len);

// Asks `peer` whether it runs rdmashim, if RDMASHIM_PEERS leaves it to
// discovery, it is another host's address and this host has an RDMA device (the cheap checks first: no interface list is
// read on a host without one). Bounded by min(RDMASHIM_SETUP_TIMEOUT_MS, 1 s).
bool probe_remote(const sockaddr* peer, socklen_t len);

// Why a connection to `peer` stays on TCP by this host's verbs policy: a
// peer RDMASHIM_PEERS leaves to discovery, on another host, and this host's
// RDMA device is software with nobody asking for it (verbs/policy.h); the
// log's detail ("software rdma rxe0"), or nullptr. Such a peer is not probed.
const char* remote_refusal(const sockaddr* peer, socklen_t len);

// Whether a client should speak to `peer` as to an rdmashim server: the
// RDMASHIM_PEERS rules, then the same-host registry, then (for another host)
// a probe over RDMA-CM.
bool is_rdmashim_peer(const sockaddr* peer, socklen_t len);

// In a forked child: the answering thread is the parent's; drop our copy of
// its event channel so the parent alone owns its listening ids.
void remote_after_fork_child();

}  // namespace rdmashim::discovery
