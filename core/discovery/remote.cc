#include "discovery/remote.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "discovery/announcements.h"
#include "discovery/registry.h"
#include "sys/sys.h"
#include "util/config.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/misc.h"
#include "util/thread.h"
#include "verbs/device.h"
#include "verbs/policy.h"
#include "verbs/rdmacm_api.h"

namespace rdmashim::discovery {
namespace {

using verbs::rdmacm;

// Private data of the probe's request and of the answering reject.
constexpr char kAsk[] = "rdmashim/1?";
constexpr char kAnswer[] = "rdmashim/1!";
constexpr uint64_t kNegativeTtlNs = 60'000'000'000ull;
constexpr uint64_t kRefusedTtlNs = 10'000'000'000ull;  // note_refused

// ---- answering ----

std::mutex g_mu;
rdma_event_channel* g_channel = nullptr;  // shared by all listening ids of this process
bool g_thread_started = false;
int g_wake = -1;                        // eventfd: an advertisement started waiting
std::vector<RemoteAdvert*> g_waiting;   // for a port another process holds (under g_mu)
constexpr uint64_t kRetryNs = 1'000'000'000ull;

// A probe that says a Hello follows: remembered, keyed by the client's
// address as RDMA-CM saw it and the listening port, until the setup timeout.
void note_announcement(rdma_cm_id* req, const void* pd, size_t len) {
  AnnouncementTable* table = announcements();
  if (!table || !pd || len < kAnnounceBytes || memcmp(pd, kAnnounce, sizeof kAnnounce) != 0) return;
  AnnounceKey client, here;
  if (!announce_key(rdma_get_peer_addr(req), sizeof(sockaddr_storage), &client) ||
      !announce_key(rdma_get_local_addr(req), sizeof(sockaddr_storage), &here)) {
    return;
  }
  client.port = here.port;
  uint8_t nonce[16];
  memcpy(nonce, static_cast<const char*>(pd) + sizeof kAnnounce, sizeof nonce);
  uint64_t now = now_ns();
  if (!table->record(client, nonce, now, uint64_t{config().setup_timeout_ms} * 1'000'000)) {
    RDMASHIM_DEBUG("rdma-cm: an announcement was not recorded (%zu live)", table->size(now));
  }
}

void retry_waiting();

// Sleeps in poll() only: with nothing waiting for a port, no timeout at all;
// otherwise the waiting advertisements try their port once a second.
void* answer_loop(void*) {
  const verbs::RdmaCmApi* api = rdmacm();
  rdma_event_channel* ch = g_channel;
  int wake = g_wake;
  uint64_t next_retry = 0;
  for (;;) {
    bool waiting = false;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      waiting = !g_waiting.empty();
    }
    uint64_t now = now_ns();
    if (!waiting) {
      next_retry = 0;
    } else if (next_retry == 0) {
      next_retry = now + kRetryNs;
    } else if (now >= next_retry) {
      retry_waiting();
      next_retry = now + kRetryNs;
      continue;
    }
    pollfd p[2] = {{ch->fd, POLLIN, 0}, {wake, POLLIN, 0}};
    int timeout = waiting ? static_cast<int>((next_retry - now) / 1'000'000) + 1 : -1;
    if (sys::real().poll(p, wake >= 0 ? 2 : 1, timeout) <= 0) continue;  // the retry's time, or EINTR
    if (p[1].revents & POLLIN) {
      uint64_t v;
      (void)!sys::real().read(wake, &v, sizeof v);
    }
    if (!(p[0].revents & (POLLIN | POLLERR | POLLHUP | POLLNVAL))) continue;
    rdma_cm_event* ev = nullptr;
    if (api->get_cm_event(ch, &ev) != 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return nullptr;  // the channel is gone
    }
    rdma_cm_id* req = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->id : nullptr;
    if (req) note_announcement(req, ev->param.conn.private_data, ev->param.conn.private_data_len);
    // Answered after the announcement is in the table: the client's SYN
    // follows our answer, so any accept() of its connection finds it there.
    if (req) api->reject(req, kAnswer, sizeof kAnswer);
    api->ack_cm_event(ev);
    if (req) api->destroy_id(req);
  }
}

bool start_answering() {
  if (g_thread_started) return true;
  if (!g_channel) g_channel = RDMASHIM_FAULT(kCmChannel) ? nullptr : rdmacm()->create_event_channel();
  if (!g_channel) return false;
  sys::real().fcntl(g_channel->fd, F_SETFD, FD_CLOEXEC);
  if (g_wake < 0) g_wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);  // without it: retries wait for a probe
  (void)create_announcements();  // without it, probes are answered and announcements ignored
  g_thread_started = start_background_thread(answer_loop, nullptr);
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  if (g_thread_started) pthread_once(&once, [] { pthread_atfork(nullptr, nullptr, remote_after_fork_child); });
  return g_thread_started;
}

// ---- asking ----

struct Cached {
  sockaddr_storage addr;
  uint64_t expires_ns;
};
std::mutex g_cache_mu;
std::vector<Cached> g_negative;
// Destinations whose listener refused us lately: a server starting up.
std::vector<Cached> g_refused;

bool same(const sockaddr_storage& a, const sockaddr* b, socklen_t len) {
  return static_cast<socklen_t>(sizeof a) >= len && memcmp(&a, b, len) == 0;
}

// g_cache_mu held: drops what expired, then finds `peer` in `list`.
Cached* find_live(std::vector<Cached>& list, const sockaddr* peer, socklen_t len, uint64_t now) {
  std::erase_if(list, [&](const Cached& c) { return c.expires_ns <= now; });
  for (Cached& c : list)
    if (same(c.addr, peer, len)) return &c;
  return nullptr;
}

Cached entry_for(const sockaddr* peer, socklen_t len, uint64_t expires_ns) {
  Cached c{};
  memcpy(&c.addr, peer, std::min<size_t>(len, sizeof c.addr));
  c.expires_ns = expires_ns;
  return c;
}

// Waits for the next event on ch until deadline; returns its type, or -1.
// For a reject, *ours says whether it carried kAnswer.
int next_event(const verbs::RdmaCmApi* api, rdma_event_channel* ch, uint64_t deadline, bool* ours) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (api->get_cm_event(ch, &ev) == 0) {
      int type = ev->event;
      if (ours) {
        const auto* pd = static_cast<const char*>(ev->param.conn.private_data);
        *ours = type == RDMA_CM_EVENT_REJECTED && pd && ev->param.conn.private_data_len >= sizeof kAnswer &&
                memcmp(pd, kAnswer, sizeof kAnswer) == 0;
      }
      api->ack_cm_event(ev);
      return type;
    }
    if (errno != EAGAIN && errno != EINTR) return -1;
    uint64_t now = now_ns();
    if (now >= deadline) return -1;
    pollfd p{ch->fd, POLLIN, 0};
    sys::real().poll(&p, 1, static_cast<int>((deadline - now) / 1'000'000) + 1);
  }
}

// `nonce`: the probe also announces the Hello that follows (announcements.h).
RemoteAnswer ask(const sockaddr* peer, const uint8_t* nonce) {
  const verbs::RdmaCmApi* api = rdmacm();
  uint32_t timeout_ms = std::min<uint32_t>(config().setup_timeout_ms, 1000);
  uint64_t deadline = now_ns() + uint64_t{timeout_ms} * 1'000'000;
  rdma_event_channel* ch = RDMASHIM_FAULT(kCmChannel) ? nullptr : api->create_event_channel();
  if (!ch) return RemoteAnswer::kNo;
  sys::real().fcntl(ch->fd, F_SETFL, sys::real().fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
  sys::real().fcntl(ch->fd, F_SETFD, FD_CLOEXEC);
  rdma_cm_id* id = nullptr;
  RemoteAnswer answer = RemoteAnswer::kNo;
  int addr_event = 0, route_event = 0;
  if (!RDMASHIM_FAULT(kCmId) && api->create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0) {
    if (!RDMASHIM_FAULT(kCmResolveAddr) && api->resolve_addr(id, nullptr, const_cast<sockaddr*>(peer), static_cast<int>(timeout_ms)) == 0 &&
        (addr_event = next_event(api, ch, deadline, nullptr)) == RDMA_CM_EVENT_ADDR_RESOLVED &&
        !RDMASHIM_FAULT(kCmResolveRoute) && api->resolve_route(id, static_cast<int>(timeout_ms)) == 0 &&
        (route_event = next_event(api, ch, deadline, nullptr)) == RDMA_CM_EVENT_ROUTE_RESOLVED) {
      char announce[kAnnounceBytes];
      memcpy(announce, kAnnounce, sizeof kAnnounce);
      if (nonce) memcpy(announce + sizeof kAnnounce, nonce, 16);
      rdma_conn_param p{};
      p.private_data = nonce ? static_cast<const void*>(announce) : kAsk;
      p.private_data_len = nonce ? sizeof announce : sizeof kAsk;
      p.qp_num = 1;  // no QP: the answer is a reject, nothing is ever connected
      if (!RDMASHIM_FAULT(kCmConnect) && api->connect(id, &p) == 0) {
        bool ours = false;
        int ev = next_event(api, ch, deadline, &ours);
        answer = ours ? RemoteAnswer::kYes : RemoteAnswer::kNo;
        if (ev < 0) RDMASHIM_DEBUG("rdma-cm: no answer to our probe within %u ms: taken as plain", timeout_ms);
      }
    } else if (addr_event < 0 || route_event < 0) {
      // Out of time before the request could even go (a resolution that
      // a loaded host or a cold neighbour entry made slow): says nothing
      // about the peer.
      answer = RemoteAnswer::kUnsure;
      RDMASHIM_DEBUG("rdma-cm: resolving the peer's %s took over %u ms: plain this time, asked again next time",
                     addr_event < 0 ? "address" : "route", timeout_ms);
    }
    api->destroy_id(id);
  }
  api->destroy_event_channel(ch);
  return answer;
}

}  // namespace

bool bind_advert(RemoteAdvert* a);
// Under g_mu: listens on a's port in RDMA_PS_TCP. false with errno (EADDRINUSE:
// another process's id holds it).
bool bind_advert(RemoteAdvert* a) {
  rdma_cm_id* id = nullptr;
  if (RDMASHIM_FAULT(kCmId) || rdmacm()->create_id(g_channel, &id, nullptr, RDMA_PS_TCP) != 0) return false;
  sockaddr_storage addr = a->addr_;
  if (RDMASHIM_FAULT(kCmBind) || rdmacm()->bind_addr(id, reinterpret_cast<sockaddr*>(&addr)) != 0 ||
      RDMASHIM_FAULT(kCmListen) || rdmacm()->listen(id, 64) != 0) {
    int err = errno;
    rdmacm()->destroy_id(id);
    errno = err;
    return false;
  }
  a->id_ = id;
  return true;
}

namespace {
void retry_waiting() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::erase_if(g_waiting, [](RemoteAdvert* a) {
    if (!bind_advert(a)) return false;
    RDMASHIM_DEBUG("rdma-cm: the port's holder left; answering probes here now");
    return true;
  });
}
}  // namespace

RemoteAdvert::~RemoteAdvert() {
  // A forked child's copy: the id is the parent's (see remote_after_fork_child).
  if (owner_ != getpid()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  std::erase(g_waiting, this);
  if (id_) rdmacm()->destroy_id(static_cast<rdma_cm_id*>(id_));
}

bool RemoteAdvert::inherited() const { return owner_ != getpid(); }

std::unique_ptr<RemoteAdvert> advertise(const sockaddr* local, socklen_t len, bool inherited);
// `inherited`: the address was bound before (by the process we inherited the
// listener from), so EADDRNOTAVAIL (RDMA-CM's answer when either id is on the
// wildcard address) also means another process holds the port.
std::unique_ptr<RemoteAdvert> advertise(const sockaddr* local, socklen_t len, bool inherited) {
  if (config().transport == TransportChoice::kTcp || config().transport == TransportChoice::kShm) return nullptr;
  if (!local || (local->sa_family != AF_INET && local->sa_family != AF_INET6)) return nullptr;
  if (!rdmacm()) return nullptr;
  int err = 0;
  if (!verbs::Device::get(&err)) return nullptr;  // no active RDMA device here
  const char* why = nullptr;
  if (verbs::remote_refused(&why)) return nullptr;  // other hosts' clients stay on TCP: nothing to answer
  std::lock_guard<std::mutex> lock(g_mu);
  if (!start_answering()) return nullptr;
  std::unique_ptr<RemoteAdvert> a(new (std::nothrow) RemoteAdvert());
  if (!a) return nullptr;
  memcpy(&a->addr_, local, std::min<size_t>(len, sizeof a->addr_));
  // owner_ stays 0 (not ours: its destructor takes no lock) until it is kept.
  bool bound = bind_advert(a.get());
  if (!bound && errno != EADDRINUSE && !(inherited && errno == EADDRNOTAVAIL)) {
    RDMASHIM_DEBUG("rdma-cm: cannot answer probes on this port: %s", strerror(errno));
    return nullptr;
  }
  a->owner_ = getpid();
  if (bound) return a;
  // Another process answers for this port (our parent, a sibling worker):
  // ours waits, and the answering thread takes over when it goes.
  g_waiting.push_back(a.get());
  if (g_wake >= 0) {
    uint64_t one = 1;
    (void)!sys::real().write(g_wake, &one, sizeof one);
  }
  return a;
}

std::unique_ptr<RemoteAdvert> advertise_remote(const sockaddr* local, socklen_t len) {
  return advertise(local, len, false);
}

void take_over_remote(std::unique_ptr<RemoteAdvert>* advert) {
  if (!*advert || !(*advert)->inherited()) return;
  sockaddr_storage addr = (*advert)->addr_;
  *advert = advertise(reinterpret_cast<sockaddr*>(&addr), sizeof addr, true);
}

void ask_remote(const sockaddr* peer, socklen_t len, bool announce, RemoteProbe* out) {
  *out = RemoteProbe{};
  if (!peer || (peer->sa_family != AF_INET && peer->sa_family != AF_INET6)) return;
  // RDMASHIM_PEERS decided: a forced peer is asked only to announce a Hello.
  PeerRule rule = peer_rule(peer, len);
  if (rule == PeerRule::kForbid || (rule == PeerRule::kForce && !announce)) return;
  if (config().transport == TransportChoice::kTcp || config().transport == TransportChoice::kShm) return;
  if (!rdmacm()) return;
  int err = 0;
  if (!verbs::Device::get(&err)) return;  // without a device here, the answer does not matter
  if (is_local_address(peer, len)) return;  // this host's listeners are in the registry
  const char* why = nullptr;
  if (verbs::remote_refused(&why)) return;  // TCP is faster: not worth a probe
  uint64_t now = now_ns();
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    if (find_live(g_negative, peer, len, now)) {
      out->answer = RemoteAnswer::kNo;  // cached already
      return;
    }
  }
  int saved = errno;
  out->announced = announce && random_bytes(out->nonce, sizeof out->nonce);
  out->answer = ask(peer, out->announced ? out->nonce : nullptr);
  errno = saved;
}

void remember_remote_no(const sockaddr* peer, socklen_t len) {
  const uint64_t now = now_ns();
  std::lock_guard<std::mutex> lock(g_cache_mu);
  // A server that refused us lately was starting: its "no" may have come
  // before its listen() advertised it, and the connection after. Not kept.
  if (find_live(g_refused, peer, len, now) || find_live(g_negative, peer, len, now)) return;
  g_negative.push_back(entry_for(peer, len, now + kNegativeTtlNs));
}

void note_refused(const sockaddr* peer, socklen_t len) {
  const uint64_t now = now_ns();
  std::lock_guard<std::mutex> lock(g_cache_mu);
  if (Cached* c = find_live(g_refused, peer, len, now)) {
    c->expires_ns = now + kRefusedTtlNs;
  } else if (g_refused.size() < 64) {  // a bound on what a scanner costs
    g_refused.push_back(entry_for(peer, len, now + kRefusedTtlNs));
  }
}

bool probe_remote(const sockaddr* peer, socklen_t len) {
  RemoteProbe p;
  ask_remote(peer, len, false, &p);
  if (p.answer == RemoteAnswer::kNo) remember_remote_no(peer, len);
  return p.answer == RemoteAnswer::kYes;
}

const char* remote_refusal(const sockaddr* peer, socklen_t len) {
  const char* why = nullptr;
  if (!peer || (peer->sa_family != AF_INET && peer->sa_family != AF_INET6)) return nullptr;
  if (peer_rule(peer, len) != PeerRule::kDiscover) return nullptr;
  if (config().transport == TransportChoice::kTcp || config().transport == TransportChoice::kShm) return nullptr;
  if (!verbs::remote_refused(&why) || is_local_address(peer, len)) return nullptr;
  return why;
}

bool is_rdmashim_peer(const sockaddr* peer, socklen_t len) {
  if (peer_advertised(peer, len)) return true;
  return probe_remote(peer, len);
}

void remote_after_fork_child() {
  new (&g_mu) std::mutex();  // only this thread exists now; another may have held it at the fork
  new (&g_cache_mu) std::mutex();
  if (g_channel) sys::real().close(g_channel->fd);
  g_channel = nullptr;  // leaked on purpose: the parent's copy
  g_thread_started = false;
  if (g_wake >= 0) sys::real().close(g_wake);
  g_wake = -1;
  g_waiting.clear();  // the parent's; our copies are taken over at accept (take_over_remote)
}

}  // namespace rdmashim::discovery
