#include "verbs/device.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>

#include "sys/sys.h"
#include "util/config.h"
#include "util/fd_budget.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/stats.h"
#include "util/watchdog.h"
#include "verbs/ibv_api.h"
#include "verbs/shared_cq.h"
#include "verbs/verbs_link.h"

namespace rdmashim::verbs {
namespace {

std::mutex g_mu;
Device* g_device = nullptr;
bool g_tried = false;
int g_err = -ENODEV;
std::atomic<bool> g_given_up{false};

// g_mu held.
void give_up_locked(const char* what) {
  if (g_given_up.exchange(true)) return;
  RDMASHIM_WARN("verbs: the RDMA provider did not answer within %u ms (%s); this process goes on without verbs",
                config().setup_timeout_ms, what);
}

bool ipv4_mapped(const ibv_gid& g) {
  static const unsigned char kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(g.raw, kPrefix, sizeof kPrefix) == 0;
}

}  // namespace

Device::Device() : pool_(config().verbs_pool_bytes) {
  budget_ = config().verbs_mem_bytes;
  if (budget_ == 0) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
    rlimit lim{};
    bool finite = getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY;
    // root (CAP_IPC_LOCK) registers past the limit, as ring_size_for assumes.
    budget_ = default_budget(ram, finite ? lim.rlim_cur : UINT64_MAX, geteuid() == 0);
  }
}

// Opening a device runs provider code that has been seen to block (a wedged
// driver, a dead fabric manager). It runs under the watchdog: if it takes
// longer than the setup timeout, this process goes on without verbs (TCP or
// shared memory) instead of hanging the application, and says so once. So
// do the QP's creation and transitions (verbs_link_setup.cc, give_up).
Device* Device::get(int* err) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_given_up.load(std::memory_order_relaxed)) {
    *err = -ETIMEDOUT;
    return nullptr;
  }
  if (g_tried) {
    *err = g_err;
    return g_device;
  }
  g_tried = true;
  struct Job {
    Device* dev = nullptr;
    int err = 0;
  };
  auto job = std::make_shared<Job>();
  // If the caller gave up, a device opened late stays open and unused.
  if (!run_bounded(config().setup_timeout_ms, [job] { job->dev = open_first(&job->err); })) {
    give_up_locked("opening the device");
    *err = g_err = -ETIMEDOUT;
    return nullptr;
  }
  g_device = job->dev;
  *err = g_err = job->err;
  // A forked child must open its own: register that once, here, so the
  // preload and the tools alike get it.
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  if (g_device) pthread_once(&once, [] { pthread_atfork(nullptr, nullptr, forget_after_fork); });
  return g_device;
}

void Device::give_up(const char* what) {
  std::lock_guard<std::mutex> lock(g_mu);
  give_up_locked(what);
}

Device* Device::open_first(int* err) {
  const IbvApi* api = ibv();
  if (!api) {
    *err = -ENOSYS;
    return nullptr;
  }
  int n = 0;
  ibv_device** list = RDMASHIM_FAULT(kIbvDevices) ? nullptr : api->get_device_list(&n);
  if (!list) {
    *err = -ENODEV;
    return nullptr;
  }
  const char* wanted = config().device;
  auto* d = new (std::nothrow) Device();
  for (int i = 0; d && i < n && !d->ctx_; ++i) {
    const char* name = api->get_device_name(list[i]);
    if (wanted && *wanted && strcmp(name, wanted) != 0) continue;
    ibv_context* ctx = RDMASHIM_FAULT(kIbvOpen) ? nullptr : api->open_device(list[i]);
    if (!ctx) continue;
    ibv_device_attr dattr{};
    api->query_device(ctx, &dattr);
    for (uint8_t port = 1; port <= dattr.phys_port_cnt; ++port) {
      ibv_port_attr pattr{};
      if (query_port(ctx, port, &pattr) != 0 || pattr.state != IBV_PORT_ACTIVE) continue;
      d->ctx_ = ctx;
      d->name_ = name;
      d->port_ = port;
      d->mtu_ = pattr.active_mtu;
      d->lid_ = pattr.lid;
      d->gid_table_len_ = pattr.gid_tbl_len;
      d->ethernet_ = pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
      d->judgement_ = judge(gather_facts(name, dattr.vendor_id), config().transport, config().soft_verbs);
      d->refusal_ = "software rdma " + d->name_;
      d->limits_ = DeviceLimits{static_cast<uint64_t>(dattr.max_qp > 0 ? dattr.max_qp : 0),
                                static_cast<uint64_t>(dattr.max_cq > 0 ? dattr.max_cq : 0),
                                static_cast<uint64_t>(dattr.max_mr > 0 ? dattr.max_mr : 0)};
      d->max_cqe_ = dattr.max_cqe > 0 ? dattr.max_cqe : 0;
      break;
    }
    if (!d->ctx_) api->close_device(ctx);
  }
  api->free_device_list(list);
  if (d && d->ctx_) d->pd_ = RDMASHIM_FAULT(kIbvPd) ? nullptr : api->alloc_pd(d->ctx_);
  if (!d || !d->ctx_ || !d->pd_) {
    if (d && d->ctx_) api->close_device(d->ctx_);
    delete d;
    *err = -ENODEV;
    return nullptr;
  }
  RDMASHIM_INFO("verbs: using %s port %u (mtu %d); %s", d->name_.c_str(), d->port_, 128 << d->mtu_,
                d->judgement_.reason.c_str());
  RDMASHIM_INFO("verbs: this process uses at most %llu queue pairs, %llu completion queues and %llu memory regions "
                "of %s's and registers at most %llu bytes (RDMASHIM_VERBS_MEM)",
                static_cast<unsigned long long>(usable(d->limits_.max_qp)),
                static_cast<unsigned long long>(usable(d->limits_.max_cq)),
                static_cast<unsigned long long>(usable(d->limits_.max_mr)), d->name_.c_str(),
                static_cast<unsigned long long>(d->budget_));
  *err = 0;
  return d;
}

// Runs in the child right after fork(), when only this thread exists: a lock
// another thread held at the fork stays held forever, so it is remade.
void Device::forget_after_fork() {
  VerbsLink::forget_after_fork();
  SharedCq::forget_after_fork();
  new (&g_mu) std::mutex();
  if (g_device && g_device->ctx_) {
    sys::real().close(g_device->ctx_->cmd_fd);
    sys::real().close(g_device->ctx_->async_fd);
  }
  g_device = nullptr;  // leaked on purpose: the memory is the parent's copy
  stats::verbs_reset();  // the parent's queues and registrations, not ours
  g_tried = false;
}

std::string Device::gid_type(int index) const {
  char path[256];
  snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%u/gid_attrs/types/%d", name_.c_str(), port_, index);
  FILE* f = fopen(path, "re");
  if (!f) return "";
  char buf[32] = {};
  if (!fgets(buf, sizeof buf, f)) buf[0] = '\0';
  fclose(f);
  buf[strcspn(buf, "\n")] = '\0';
  return buf;
}

bool Device::gid(int index, ibv_gid* out) const {
  return index >= 0 && index < gid_table_len_ && !RDMASHIM_FAULT(kIbvGid) && ibv()->query_gid(ctx_, port_, index, out) == 0;
}

int Device::gid_index_for(const sockaddr* local) const {
  if (int want = config().gid_index; want >= 0) {
    if (want < gid_table_len_) return want;
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) RDMASHIM_WARN("ignoring RDMASHIM_GID_INDEX=%d (%s port %u has %d GIDs); choosing one per connection",
                  want, name_.c_str(), port_, gid_table_len_);
  }
  if (!ethernet_) return 0;  // InfiniBand: the port GID, routed by LID
  in_addr want{};
  bool have_ip = local && local->sa_family == AF_INET;
  if (have_ip) want = reinterpret_cast<const sockaddr_in*>(local)->sin_addr;
  int any_v2 = -1;
  for (int i = 0; i < gid_table_len_; ++i) {
    ibv_gid g{};
    if (!gid(i, &g) || !ipv4_mapped(g) || gid_type(i) != "RoCE v2") continue;
    if (have_ip && memcmp(g.raw + 12, &want, 4) == 0) return i;
    if (any_v2 < 0) any_v2 = i;
  }
  return any_v2 >= 0 ? any_v2 : 0;
}

ibv_comp_channel* Device::create_channel(int* err) {
  ibv_comp_channel* ch = ibv()->create_comp_channel(ctx_);
  if (!ch) return *err = -EIO, nullptr;
  // The doorbell must never block a check, nor take a number the program
  // would get on TCP (a thousand connections would meet EMFILE at half).
  sys::real().fcntl(ch->fd, F_SETFL, sys::real().fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
  int fd = ch->fd;
  bool kept = fds::keep(&fd, 1);  // closes it when there is no room
  ch->fd = fd;
  if (!kept) {
    ibv()->destroy_comp_channel(ch);
    return *err = -EMFILE, nullptr;
  }
  sys::real().fcntl(ch->fd, F_SETFD, FD_CLOEXEC);  // never into an exec'd program
  return ch;
}

void Device::destroy_channel(ibv_comp_channel* channel) {
  if (!channel) return;
  // Ours to close: the library's own close() would meet the hook's EBADF
  // for a descriptor of ours (and a number left marked ours).
  fds::close(channel->fd);
  channel->fd = -1;
  ibv()->destroy_comp_channel(channel);
}

ibv_cq* Device::create_cq(int depth, ibv_comp_channel* channel) {
  ibv_cq* cq = ibv()->create_cq(ctx_, depth, nullptr, channel, 0);
  if (cq) stats::verbs_add({.cqs = 1});
  return cq;
}

void Device::destroy_cq(ibv_cq* cq) {
  if (!cq) return;
  ibv()->destroy_cq(cq);
  stats::verbs_add({.cqs = -1});
}

ibv_qp* Device::create_qp(ibv_qp_init_attr* init) {
  ibv_qp* qp = ibv()->create_qp(pd_, init);
  if (qp) stats::verbs_add({.qps = 1});
  return qp;
}

void Device::destroy_qp(ibv_qp* qp) {
  if (!qp) return;
  ibv()->destroy_qp(qp);
  stats::verbs_add({.qps = -1});
}

void Device::deregister(const Buffer& b) {
  ibv()->dereg_mr(b.mr);
  munmap(b.data, b.size);
  stats::verbs_add({.registered = -static_cast<int64_t>(b.size), .mrs = -1});
}

VerbsUsage Device::usage_locked() {
  stats::VerbsResources r = stats::verbs_resources();
  VerbsUsage u;
  u.qps = static_cast<uint64_t>(r.qps), u.cqs = static_cast<uint64_t>(r.cqs), u.mrs = static_cast<uint64_t>(r.mrs);
  u.registered = static_cast<uint64_t>(r.registered);
  u.pooled = pool_.bytes(), u.pooled_mrs = pool_.count();
  u.links_reserved = links_reserved_;
  return u;
}

Refusal Device::admit_link(uint64_t bytes) {
  Refusal r;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    r = verbs::admit_link(limits_, usage_locked(), bytes, budget_);
    if (r == Refusal::kNone) ++links_reserved_;
  }
  if (r != Refusal::kNone) say_refused(r);
  return r;
}

void Device::end_link_setup() {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (links_reserved_ > 0) --links_reserved_;
}

void Device::say_refused(Refusal r) {
  static std::atomic<bool> said{false};
  if (r == Refusal::kNone || said.exchange(true)) return;
  VerbsUsage u;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    u = usage_locked();
  }
  RDMASHIM_WARN("verbs: new connections stay on TCP (tcp:verbs-limit: %s): %llu/%llu queue pairs, %llu/%llu "
                "completion queues, %llu/%llu memory regions (usable of %s's), %llu/%llu bytes registered",
                refusal_text(r), static_cast<unsigned long long>(u.qps),
                static_cast<unsigned long long>(usable(limits_.max_qp)), static_cast<unsigned long long>(u.cqs),
                static_cast<unsigned long long>(usable(limits_.max_cq)), static_cast<unsigned long long>(u.mrs),
                static_cast<unsigned long long>(usable(limits_.max_mr)), name_.c_str(),
                static_cast<unsigned long long>(u.registered), static_cast<unsigned long long>(budget_));
}

bool Device::take(size_t size, bool remote, Buffer* out, bool budgeted, Refusal* why) {
  if (why) *why = Refusal::kNone;
  std::vector<Buffer> evicted;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (pool_.take(size, remote, out)) {
      stats::verbs_add({.pooled = -static_cast<int64_t>(size)});
      return true;
    }
    VerbsUsage u = usage_locked();
    Refusal r = admit_registration(limits_, u, size, budget_, budgeted);
    if (r != Refusal::kNone) {
      if (why) *why = r;
      return false;
    }
    // Room for it: the pool gives up its oldest buffers first.
    Buffer old;
    int64_t freed = 0;
    while ((u.registered + size > budget_ || u.mrs + 1 > usable(limits_.max_mr)) && pool_.evict_oldest(&old)) {
      evicted.push_back(old);
      u.registered -= old.size, u.mrs -= 1;
      freed += static_cast<int64_t>(old.size);
    }
    // Counted now, under the lock: a concurrent take sees it.
    stats::verbs_add({.registered = static_cast<int64_t>(size), .pooled = -freed, .mrs = 1});
  }
  for (const Buffer& b : evicted) deregister(b);
  void* mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    stats::verbs_add({.registered = -static_cast<int64_t>(size), .mrs = -1});
    return false;
  }
  int access = IBV_ACCESS_LOCAL_WRITE | (remote ? IBV_ACCESS_REMOTE_WRITE : 0);
  bool injected = RDMASHIM_FAULT(kIbvMr);  // a test's fault says so itself: no warning
  ibv_mr* mr = injected ? nullptr : ibv()->reg_mr(pd_, mem, size, access);
  if (!mr) {
    int e = errno;
    munmap(mem, size);
    stats::verbs_add({.registered = -static_cast<int64_t>(size), .mrs = -1});
    // Usually RLIMIT_MEMLOCK (registration pins the ring): say so once; the
    // connection stays on TCP rather than get a ring smaller than TCP's.
    static std::atomic<bool> warned{false};
    rlimit lim{};
    if (!injected && !warned.exchange(true) && getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
      RDMASHIM_WARN("verbs: registering a %zu-byte ring failed (%s; %lld bytes registered, RLIMIT_MEMLOCK %lld): "
                    "such connections stay on TCP (raise ulimit -l, or set RDMASHIM_RING_SIZE)",
                    size, strerror(e), static_cast<long long>(stats::verbs_resources().registered),
                    lim.rlim_cur == RLIM_INFINITY ? -1LL : static_cast<long long>(lim.rlim_cur));
    }
    return false;
  }
  *out = Buffer{mem, size, mr, remote};
  return true;
}

void Device::give_back(const Buffer& b) {
  if (!b.mr) return;
  std::vector<Buffer> drop;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    pool_.give_back(b, &drop);
  }
  // What the pool kept of b, less what it evicted (b itself, when too large).
  int64_t pooled = static_cast<int64_t>(b.size);
  for (const Buffer& d : drop) pooled -= static_cast<int64_t>(d.size);
  stats::verbs_add({.pooled = pooled});
  for (const Buffer& d : drop) deregister(d);
}

void Device::drop(const Buffer& b) {
  if (!b.mr) return;
  deregister(b);
}

}  // namespace rdmashim::verbs
