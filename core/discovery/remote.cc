#include "discovery/remote.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

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

// ---- answering ----

std::mutex g_mu;
rdma_event_channel* g_channel = nullptr;  // shared by all listening ids of this process
bool g_thread_started = false;

void* answer_loop(void*) {
  const verbs::RdmaCmApi* api = rdmacm();
  rdma_event_channel* ch = g_channel;
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (api->get_cm_event(ch, &ev) != 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return nullptr;  // the channel is gone
    }
    rdma_cm_id* req = ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ? ev->id : nullptr;
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

bool same(const sockaddr_storage& a, const sockaddr* b, socklen_t len) {
  return static_cast<socklen_t>(sizeof a) >= len && memcmp(&a, b, len) == 0;
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

bool ask(const sockaddr* peer) {
  const verbs::RdmaCmApi* api = rdmacm();
  uint32_t timeout_ms = std::min<uint32_t>(config().setup_timeout_ms, 1000);
  uint64_t deadline = now_ns() + uint64_t{timeout_ms} * 1'000'000;
  rdma_event_channel* ch = RDMASHIM_FAULT(kCmChannel) ? nullptr : api->create_event_channel();
  if (!ch) return false;
  sys::real().fcntl(ch->fd, F_SETFL, sys::real().fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
  sys::real().fcntl(ch->fd, F_SETFD, FD_CLOEXEC);
  rdma_cm_id* id = nullptr;
  bool yes = false;
  if (!RDMASHIM_FAULT(kCmId) && api->create_id(ch, &id, nullptr, RDMA_PS_TCP) == 0) {
    if (!RDMASHIM_FAULT(kCmResolveAddr) && api->resolve_addr(id, nullptr, const_cast<sockaddr*>(peer), static_cast<int>(timeout_ms)) == 0 &&
        next_event(api, ch, deadline, nullptr) == RDMA_CM_EVENT_ADDR_RESOLVED &&
        !RDMASHIM_FAULT(kCmResolveRoute) && api->resolve_route(id, static_cast<int>(timeout_ms)) == 0 &&
        next_event(api, ch, deadline, nullptr) == RDMA_CM_EVENT_ROUTE_RESOLVED) {
      rdma_conn_param p{};
      p.private_data = kAsk;
      p.private_data_len = sizeof kAsk;
      p.qp_num = 1;  // no QP: the answer is a reject, nothing is ever connected
      if (!RDMASHIM_FAULT(kCmConnect) && api->connect(id, &p) == 0) {
        bool ours = false;
        (void)next_event(api, ch, deadline, &ours);
        yes = ours;
      }
    }
    api->destroy_id(id);
  }
  api->destroy_event_channel(ch);
  return yes;
}

}  // namespace

RemoteAdvert::~RemoteAdvert() {
  // A forked child's copy: the id is the parent's (see remote_after_fork_child).
  if (id_ && owner_ == getpid()) rdmacm()->destroy_id(static_cast<rdma_cm_id*>(id_));
}

std::unique_ptr<RemoteAdvert> advertise_remote(const sockaddr* local, socklen_t len) {
  if (config().transport == TransportChoice::kTcp || config().transport == TransportChoice::kShm) return nullptr;
  if (!local || (local->sa_family != AF_INET && local->sa_family != AF_INET6)) return nullptr;
  if (!rdmacm()) return nullptr;
  int err = 0;
  if (!verbs::Device::get(&err)) return nullptr;  // no active RDMA device here
  const char* why = nullptr;
  if (verbs::remote_refused(&why)) return nullptr;  // other hosts' clients stay on TCP: nothing to answer
  std::lock_guard<std::mutex> lock(g_mu);
  if (!start_answering()) return nullptr;
  rdma_cm_id* id = nullptr;
  if (RDMASHIM_FAULT(kCmId) || rdmacm()->create_id(g_channel, &id, nullptr, RDMA_PS_TCP) != 0) return nullptr;
  sockaddr_storage addr{};
  memcpy(&addr, local, std::min<size_t>(len, sizeof addr));
  if (RDMASHIM_FAULT(kCmBind) || rdmacm()->bind_addr(id, reinterpret_cast<sockaddr*>(&addr)) != 0 ||
      RDMASHIM_FAULT(kCmListen) || rdmacm()->listen(id, 64) != 0) {
    RDMASHIM_DEBUG("rdma-cm: cannot answer probes on this port: %s", strerror(errno));
    rdmacm()->destroy_id(id);
    return nullptr;
  }
  std::unique_ptr<RemoteAdvert> a(new (std::nothrow) RemoteAdvert());
  if (!a) {
    rdmacm()->destroy_id(id);
    return nullptr;
  }
  a->id_ = id;
  a->owner_ = getpid();
  return a;
}

bool probe_remote(const sockaddr* peer, socklen_t len) {
  if (!peer || (peer->sa_family != AF_INET && peer->sa_family != AF_INET6)) return false;
  if (peer_rule(peer, len) != PeerRule::kDiscover) return false;  // RDMASHIM_PEERS decided
  if (config().transport == TransportChoice::kTcp || config().transport == TransportChoice::kShm) return false;
  if (!rdmacm()) return false;
  int err = 0;
  if (!verbs::Device::get(&err)) return false;  // without a device here, the answer does not matter
  if (is_local_address(peer, len)) return false;  // this host's listeners are in the registry
  const char* why = nullptr;
  if (verbs::remote_refused(&why)) return false;  // TCP is faster: not worth a probe
  uint64_t now = now_ns();
  {
    std::lock_guard<std::mutex> lock(g_cache_mu);
    std::erase_if(g_negative, [&](const Cached& c) { return c.expires_ns <= now; });
    for (const Cached& c : g_negative)
      if (same(c.addr, peer, len)) return false;
  }
  int saved = errno;
  bool yes = ask(peer);
  errno = saved;
  if (!yes) {
    Cached c{};
    memcpy(&c.addr, peer, std::min<size_t>(len, sizeof c.addr));
    c.expires_ns = now_ns() + kNegativeTtlNs;
    std::lock_guard<std::mutex> lock(g_cache_mu);
    g_negative.push_back(c);
  }
  return yes;
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
}

}  // namespace rdmashim::discovery
