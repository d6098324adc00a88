// `rdmashim stat [--json] [--watch [SECONDS] [--count N]]`: every process
// under rdmashim that we may inspect, its connection counters and one line per
// live connection, read from its "rdmashim-stats" memfd (core/util/stats.h)
// through /proc/PID/fd. Rows on TCP take their byte counts from the kernel
// (sock_diag, by the socket's inode): rdmashim steps aside on those.
#include "stat.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "json.h"
#include "util/stats.h"

namespace rdmashim::tools {
namespace {

using stats::Outcome;

struct Conn {
  int fd = -1;
  bool server = false;
  Outcome outcome = Outcome::kShm;
  std::string downgraded;  // the reason, once the connection left its rings
  std::string local, peer;
  uint64_t inode = 0, ring = 0;
  uint64_t tx_bytes = 0, tx_msgs = 0, rx_bytes = 0, rx_msgs = 0, rx_unread = 0, tx_unacked = 0;
  bool kernel_counts = false;  // bytes from the kernel's tcp_info, messages unknown
  // Where rx_unread/tx_unacked come from: both ends' byte counters (a ring
  // whose two ends we see), the kernel's queues (TCP), or unknown.
  const char* fill = "unknown";
};

struct Proc {
  int pid = 0;
  std::string command = "?";
  uint32_t version = 0;
  uint64_t counts[stats::kOutcomes] = {};
  std::vector<Conn> conns;
  uint64_t unlisted = 0;
  uint64_t verbs_registered = 0, verbs_pooled = 0;  // bytes
  uint64_t verbs_qps = 0, verbs_cqs = 0, verbs_mrs = 0, verbs_beats = 0;
};

std::string address(const sockaddr_in6& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  const auto* sa = reinterpret_cast<const sockaddr*>(&a);
  if (sa->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(v4->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof host);
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a.sin6_port));
  }
  return "?";
}

// A consistent copy of a live row, or false (free, changing, or reused).
bool read_row(const stats::Slot& s, Conn* c) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    uint32_t seq = s.seq.load(std::memory_order_acquire);
    if (seq % 4 != 2) return false;
    c->fd = s.fd;
    c->server = s.role == 1;
    c->outcome = s.outcome >= 0 && s.outcome < stats::kOutcomes ? static_cast<Outcome>(s.outcome) : Outcome::kCount;
    c->inode = s.inode;
    c->ring = s.ring_bytes;
    sockaddr_in6 local = s.local, peer = s.peer;
    char down[sizeof s.downgraded];
    memcpy(down, s.downgraded, sizeof down);
    down[sizeof down - 1] = 0;
    c->tx_bytes = s.tx_bytes.load(std::memory_order_relaxed);
    c->tx_msgs = s.tx_msgs.load(std::memory_order_relaxed);
    c->rx_bytes = s.rx_bytes.load(std::memory_order_relaxed);
    c->rx_msgs = s.rx_msgs.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != seq) continue;
    c->local = address(local);
    c->peer = address(peer);
    c->downgraded = down;
    return true;
  }
  return false;
}

// Reads one page (version 1: counters only; version 2: counters and rows).
bool read_page(int fd, int pid, Proc* out) {
  struct stat st{};
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(stats::kPageV1Bytes)) return false;
  size_t len = static_cast<size_t>(st.st_size) >= stats::kPageBytes ? stats::kPageBytes : stats::kPageV1Bytes;
  void* m = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return false;
  const auto* page = static_cast<const stats::Page*>(m);
  bool ok = page->magic == stats::kPageMagic && page->pid == pid &&
            (page->version == 1 || (page->version == stats::kPageVersion && len == stats::kPageBytes));
  if (ok) {
    out->version = page->version;
    for (int i = 0; i < stats::kOutcomes; ++i) {
      // Version 1 pages had no counts_added (their bytes there mean nothing).
      bool has = i < stats::kV2Outcomes || page->version > 1;
      out->counts[i] = has ? page->count_of(i).load(std::memory_order_relaxed) : 0;
    }
    if (page->version == stats::kPageVersion) {
      out->unlisted = page->unlisted.load(std::memory_order_relaxed);
      out->verbs_registered = page->verbs_registered.load(std::memory_order_relaxed);
      out->verbs_pooled = page->verbs_pooled.load(std::memory_order_relaxed);
      out->verbs_qps = page->verbs_qps.load(std::memory_order_relaxed);
      out->verbs_cqs = page->verbs_cqs.load(std::memory_order_relaxed);
      out->verbs_mrs = page->verbs_mrs.load(std::memory_order_relaxed);
      out->verbs_beats = page->verbs_beats.load(std::memory_order_relaxed);
      uint32_t n = page->slots < stats::kSlots ? page->slots : stats::kSlots;
      for (uint32_t i = 0; i < n; ++i) {
        Conn c;
        if (read_row(page->slot[i], &c)) out->conns.push_back(c);
      }
    }
  }
  munmap(m, len);
  return ok;
}

// What the kernel knows of a TCP socket (what `ss -ti` shows).
struct KernelTcp {
  uint64_t acked, received;  // bytes
  uint32_t rqueue, wqueue;   // bytes not yet read / not yet acknowledged
  std::string local, peer;
};

std::string diag_address(const inet_diag_msg& m, bool src) {
  sockaddr_in6 a{};
  const uint32_t* ip = src ? m.id.idiag_src : m.id.idiag_dst;
  uint16_t port = src ? m.id.idiag_sport : m.id.idiag_dport;
  if (m.idiag_family == AF_INET) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&a);
    v4->sin_family = AF_INET;
    v4->sin_port = port;
    memcpy(&v4->sin_addr, ip, 4);
  } else {
    a.sin6_family = AF_INET6;
    a.sin6_port = port;
    memcpy(&a.sin6_addr, ip, 16);
  }
  return address(a);
}

// The socket inode behind a process's descriptor ("socket:[N]"), or 0.
uint64_t socket_inode(int pid, int fd) {
  char link[64], target[64];
  snprintf(link, sizeof link, "/proc/%d/fd/%d", pid, fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return 0;
  target[n] = '\0';
  unsigned long long ino = 0;
  return sscanf(target, "socket:[%llu]", &ino) == 1 ? ino : 0;
}

// socket inode -> its counters, for every TCP socket in our network namespace.
std::map<uint64_t, KernelTcp> kernel_tcp() {
  std::map<uint64_t, KernelTcp> out;
  int s = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (s < 0) return out;
  for (int family : {AF_INET, AF_INET6}) {
    struct {
      nlmsghdr h;
      inet_diag_req_v2 r;
    } req{};
    req.h.nlmsg_len = sizeof req;
    req.h.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.r.sdiag_family = static_cast<uint8_t>(family);
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = ~0u;
    req.r.idiag_ext = 1u << (INET_DIAG_INFO - 1);
    if (send(s, &req, sizeof req, 0) != static_cast<ssize_t>(sizeof req)) break;
    alignas(nlmsghdr) char buf[32768];
    bool done = false;
    while (!done) {
      ssize_t n = recv(s, buf, sizeof buf, 0);
      if (n <= 0) break;
      for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
          done = true;
          break;
        }
        auto* msg = static_cast<inet_diag_msg*>(NLMSG_DATA(h));
        int left = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof *msg));
        for (auto* a = reinterpret_cast<rtattr*>(msg + 1); RTA_OK(a, left); a = RTA_NEXT(a, left)) {
          if (a->rta_type != INET_DIAG_INFO) continue;
          tcp_info info{};
          memcpy(&info, RTA_DATA(a), std::min<size_t>(RTA_PAYLOAD(a), sizeof info));
          out[msg->idiag_inode] = {info.tcpi_bytes_acked, info.tcpi_bytes_received, msg->idiag_rqueue,
                                   msg->idiag_wqueue, diag_address(*msg, true), diag_address(*msg, false)};
        }
      }
    }
  }
  close(s);
  return out;
}

void pair_rings(std::vector<Proc>& procs);

// Finds every process's page among its descriptors (a memfd named
// rdmashim-stats) and reads it. Processes we may not inspect are skipped.
std::vector<Proc> collect() {
  std::vector<Proc> out;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* d = readdir(proc)) {
    int pid = atoi(d->d_name);
    if (pid <= 0) continue;
    std::string fddir = "/proc/" + std::string(d->d_name) + "/fd";
    DIR* fds = opendir(fddir.c_str());
    if (!fds) continue;
    while (dirent* f = readdir(fds)) {
      if (f->d_name[0] == '.') continue;
      std::string link = fddir + "/" + f->d_name;
      char target[256];
      ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      if (strncmp(target, "/memfd:rdmashim-stats", 21) != 0) continue;
      int fd = open(link.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      Proc p;
      p.pid = pid;
      bool ok = read_page(fd, pid, &p);
      close(fd);
      if (!ok) continue;
      if (FILE* c = fopen(("/proc/" + std::string(d->d_name) + "/comm").c_str(), "r")) {
        char comm[64] = {};
        if (fgets(comm, sizeof comm, c)) p.command = std::string(comm, strcspn(comm, "\n"));
        fclose(c);
      }
      out.push_back(std::move(p));
      break;
    }
    closedir(fds);
  }
  closedir(proc);
  bool any_tcp = false;
  for (auto& p : out)
    for (auto& c : p.conns) any_tcp |= c.outcome != Outcome::kShm && c.outcome != Outcome::kVerbs;
  if (any_tcp) {
    auto kernel = kernel_tcp();
    for (auto& p : out) {
      for (auto& c : p.conns) {
        if (c.outcome == Outcome::kShm || c.outcome == Outcome::kVerbs) continue;
        if (c.inode == 0) c.inode = socket_inode(p.pid, c.fd);  // TCP rows leave it to us
        auto it = kernel.find(c.inode);
        if (it == kernel.end()) continue;
        if (c.local == "?") c.local = it->second.local;
        if (c.peer == "?") c.peer = it->second.peer;
        c.kernel_counts = true;
        c.tx_bytes = it->second.acked;
        c.rx_bytes = it->second.received;
        c.rx_unread = it->second.rqueue;
        c.tx_unacked = it->second.wqueue;
        c.fill = "kernel";
      }
    }
  }
  pair_rings(out);
  return out;
}

// Both ends of a ring on this host are listed: what one end wrote and the
// other did not read yet is the difference of their byte counters (exact
// now, where each end's own figure is as of its last call).
void pair_rings(std::vector<Proc>& procs) {
  std::map<std::pair<std::string, std::string>, std::vector<Conn*>> ends;
  for (auto& p : procs)
    for (auto& c : p.conns)
      if (c.ring) ends[{c.local, c.peer}].push_back(&c);
  for (auto& [key, mine] : ends) {
    auto it = ends.find({key.second, key.first});
    if (mine.size() != 1 || it == ends.end() || it->second.size() != 1) continue;
    Conn& a = *mine[0];
    const Conn& b = *it->second[0];
    if (a.ring != b.ring) continue;
    a.rx_unread = b.tx_bytes > a.rx_bytes ? b.tx_bytes - a.rx_bytes : 0;
    a.tx_unacked = a.tx_bytes > b.rx_bytes ? a.tx_bytes - b.rx_bytes : 0;
    a.fill = "both-ends";
  }
}

std::string u64(uint64_t v) { return std::to_string(v); }
const char* outcome_name(Outcome o) { return o == Outcome::kCount ? "?" : stats::name(o); }
std::string transport_of(const Conn& c) {
  return c.downgraded.empty() ? outcome_name(c.outcome) : "tcp:downgraded:" + c.downgraded;
}

void print_json(const std::vector<Proc>& procs) {
  printf("[");
  for (size_t p = 0; p < procs.size(); ++p) {
    const Proc& pr = procs[p];
    // "connections" comes first after command: older readers split on it.
    printf("%s{\"pid\":%d,\"command\":%s,\"connections\":{", p ? "," : "", pr.pid, json_quote(pr.command).c_str());
    for (int i = 0; i < stats::kOutcomes; ++i) {
      printf("%s\"%s\":%llu", i ? "," : "", stats::name(static_cast<Outcome>(i)),
             static_cast<unsigned long long>(pr.counts[i]));
    }
    printf("},\"page_version\":%u,\"not_listed\":%llu,\"verbs_registered\":%llu,\"verbs_pooled\":%llu,"
           "\"verbs_qps\":%llu,\"verbs_cqs\":%llu,\"verbs_mrs\":%llu,\"verbs_beats\":%llu,\"live\":[",
           pr.version, static_cast<unsigned long long>(pr.unlisted),
           static_cast<unsigned long long>(pr.verbs_registered), static_cast<unsigned long long>(pr.verbs_pooled),
           static_cast<unsigned long long>(pr.verbs_qps), static_cast<unsigned long long>(pr.verbs_cqs),
           static_cast<unsigned long long>(pr.verbs_mrs), static_cast<unsigned long long>(pr.verbs_beats));
    for (size_t i = 0; i < pr.conns.size(); ++i) {
      const Conn& c = pr.conns[i];
      bool known = strcmp(c.fill, "unknown") != 0;
      std::string msgs_tx = c.kernel_counts ? "null" : u64(c.tx_msgs), msgs_rx = c.kernel_counts ? "null" : u64(c.rx_msgs);
      printf("%s{\"fd\":%d,\"role\":\"%s\",\"local\":%s,\"peer\":%s,\"transport\":%s,\"counted_by\":\"%s\","
             "\"tx_bytes\":%s,\"tx_msgs\":%s,\"rx_bytes\":%s,\"rx_msgs\":%s,\"ring_bytes\":%s,"
             "\"rx_unread\":%s,\"tx_unacked\":%s,\"fill\":\"%s\"}",
             i ? "," : "", c.fd, c.server ? "server" : "client", json_quote(c.local).c_str(),
             json_quote(c.peer).c_str(), json_quote(transport_of(c)).c_str(), c.kernel_counts ? "kernel" : "rdmashim",
             u64(c.tx_bytes).c_str(), msgs_tx.c_str(), u64(c.rx_bytes).c_str(), msgs_rx.c_str(), u64(c.ring).c_str(),
             known ? u64(c.rx_unread).c_str() : "null", known ? u64(c.tx_unacked).c_str() : "null", c.fill);
    }
    printf("]}");
  }
  printf("]\n");
}

std::string human(uint64_t v) {
  const char* unit[] = {"", "K", "M", "G", "T"};
  int u = 0;
  double d = static_cast<double>(v);
  while (d >= 10000 && u < 4) {
    d /= 1024;
    ++u;
  }
  char buf[32];
  snprintf(buf, sizeof buf, u ? "%.1f%s" : "%.0f%s", d, unit[u]);
  return buf;
}

void print_text(const std::vector<Proc>& procs) {
  if (procs.empty()) {
    printf("no process under rdmashim has made a connection yet (or none that you may inspect)\n");
    return;
  }
  printf("%-8s %-16s %8s %8s %8s  %s\n", "PID", "COMMAND", "SHM", "VERBS", "TCP", "TCP BECAUSE");
  for (auto& p : procs) {
    uint64_t tcp = 0;
    std::string why;
    for (int i = static_cast<int>(Outcome::kTcpNotAdvertised); i < stats::kOutcomes; ++i) {
      if (!p.counts[i]) continue;
      tcp += p.counts[i];
      why += (why.empty() ? "" : " ") + std::string(stats::name(static_cast<Outcome>(i)) + 4) + "=" + u64(p.counts[i]);
    }
    printf("%-8d %-16s %8llu %8llu %8llu  %s\n", p.pid, p.command.c_str(),
           static_cast<unsigned long long>(p.counts[static_cast<int>(Outcome::kShm)]),
           static_cast<unsigned long long>(p.counts[static_cast<int>(Outcome::kVerbs)]),
           static_cast<unsigned long long>(tcp), why.c_str());
  }
  for (auto& p : procs) {
    if (p.verbs_registered || p.verbs_qps || p.verbs_cqs || p.verbs_mrs) {
      printf("%-8d registered with the RDMA device (pinned): %s, of which %s pooled for reuse; %llu queue pairs, "
             "%llu completion queues, %llu memory regions; %llu idle heartbeats posted\n",
             p.pid, human(p.verbs_registered).c_str(), human(p.verbs_pooled).c_str(),
             static_cast<unsigned long long>(p.verbs_qps), static_cast<unsigned long long>(p.verbs_cqs),
             static_cast<unsigned long long>(p.verbs_mrs), static_cast<unsigned long long>(p.verbs_beats));
    }
  }
  printf("\n%-8s %-5s %-6s %-22s %-22s %-22s %8s %8s %8s %8s %7s %7s %7s\n", "PID", "FD", "ROLE", "LOCAL", "PEER",
         "TRANSPORT", "TX", "TX_MSGS", "RX", "RX_MSGS", "RING", "UNREAD", "UNACKED");
  for (auto& p : procs) {
    if (p.version == 1) printf("%-8d (an older rdmashim: counters only, no connection list)\n", p.pid);
    for (auto& c : p.conns) {
      bool ring = c.ring != 0, known = strcmp(c.fill, "unknown") != 0;
      printf("%-8d %-5d %-6s %-22s %-22s %-22s %8s %8s %8s %8s %7s %7s %7s\n", p.pid, c.fd,
             c.server ? "server" : "client", c.local.c_str(), c.peer.c_str(), transport_of(c).c_str(),
             human(c.tx_bytes).c_str(), c.kernel_counts ? "-" : u64(c.tx_msgs).c_str(), human(c.rx_bytes).c_str(),
             c.kernel_counts ? "-" : u64(c.rx_msgs).c_str(), ring ? human(c.ring).c_str() : "-",
             known ? human(c.rx_unread).c_str() : "?", known ? human(c.tx_unacked).c_str() : "?");
    }
    if (p.unlisted) printf("%-8d (+%llu not listed)\n", p.pid, static_cast<unsigned long long>(p.unlisted));
  }
}

}  // namespace

int stat(int argc, char** argv) {
  bool json = false, watch = false;
  double every = 2.0;
  long count = 0;  // 0: until interrupted
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if (a == "--watch") {
      watch = true;
      if (i + 1 < argc && argv[i + 1][0] != '-') every = atof(argv[++i]);
    } else if (a == "--count" && i + 1 < argc) {
      count = atol(argv[++i]);
    } else {
      fprintf(stderr, "rdmashim stat: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (every <= 0 || (watch && json)) {
    fprintf(stderr, "rdmashim stat: --watch takes a positive interval and no --json\n");
    return 2;
  }
  if (!watch) {
    auto procs = collect();
    json ? print_json(procs) : print_text(procs);
    return 0;
  }
  bool tty = isatty(STDOUT_FILENO);
  for (long n = 1;; ++n) {
    time_t now = time(nullptr);
    char when[64];
    strftime(when, sizeof when, "%F %T", localtime(&now));
    if (tty) printf("\033[H\033[J");
    printf("rdmashim stat, every %gs: %s\n\n", every, when);
    print_text(collect());
    fflush(stdout);
    if (count > 0 && n >= count) return 0;
    timespec ts{static_cast<time_t>(every), static_cast<long>((every - static_cast<double>(static_cast<time_t>(every))) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    if (!tty) printf("\n");
  }
}

}  // namespace rdmashim::tools
