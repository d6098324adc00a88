// rdmashim doctor: is this machine ready for rdmashim? First the settings and
// what two local processes need for shared memory (doctor_same_host.cc), then
// the verbs transport:
//
// Lists devices, ports, states, MTUs and GIDs, says whether connections to
// other hosts use verbs on the chosen device and why (verbs/policy.h), then opens and closes a PD, a
// CQ, an MR and a QP and walks a loopback QP through INIT, RTR and RTS with
// one RDMA WRITE WITH IMM to itself. Every step runs in a child process
// under a watchdog: a provider call that blocks ends the command with exit
// code 124 and the name of the step, never a hang. Exit 0: both ready; 1: a
// step failed (including "no device"); 124: a step blocked.
#include "doctor.h"
#include "json.h"

#include <arpa/inet.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "util/config.h"
#include "verbs/ibv_api.h"
#include "verbs/policy.h"

namespace rdmashim::tools {
namespace {

using verbs::ibv;

// The child reports one line per step: "ok|fail <step> <detail>".
// RDMASHIM_DOCTOR_STALL_AT=<step> makes the child hang right before that
// step: fault injection, so the watchdog itself can be tested anywhere.
void report(int fd, bool ok, const char* step, const std::string& detail) {
  static const char* stall = getenv("RDMASHIM_DOCTOR_STALL_AT");
  if (stall && strcmp(stall, step) == 0) pause();
  std::string line = std::string(ok ? "ok " : "fail ") + step + " " + detail + "\n";
  ssize_t ignored = write(fd, line.data(), line.size());
  (void)ignored;
}

std::string gid_text(const ibv_gid& g) {
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, g.raw, buf, sizeof buf);
  return buf;
}

// Runs in the child. Returns normally after reporting; the parent decides.
void probe(int out) {
  const verbs::IbvApi* api = ibv();
  if (!api) return report(out, false, "load", "libibverbs.so.1 cannot be loaded (install ibverbs-providers)");
  report(out, true, "load", "libibverbs.so.1");
  int n = 0;
  ibv_device** list = api->get_device_list(&n);
  if (!list || n == 0) return report(out, false, "devices", "no RDMA device (for Soft-RoCE: rdma link add rxe0 type rxe netdev eth0)");
  ibv_context* chosen = nullptr;
  uint8_t chosen_port = 0;
  int chosen_gid = -1;
  ibv_gid gid{};
  ibv_port_attr chosen_attr{};
  std::string chosen_name;
  uint32_t chosen_vendor = 0;
  for (int i = 0; i < n; ++i) {
    const char* name = api->get_device_name(list[i]);
    ibv_context* ctx = api->open_device(list[i]);
    if (!ctx) {
      report(out, false, "device", std::string(name) + " cannot be opened: " + strerror(errno));
      continue;
    }
    ibv_device_attr dattr{};
    api->query_device(ctx, &dattr);
    for (uint8_t p = 1; p <= dattr.phys_port_cnt; ++p) {
      ibv_port_attr pa{};
      if (verbs::query_port(ctx, p, &pa) != 0) continue;
      std::string detail = std::string(name) + " port " + std::to_string(p) + " state " +
                           (pa.state == IBV_PORT_ACTIVE ? "ACTIVE" : "not-active(" + std::to_string(pa.state) + ")") +
                           " link " + (pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "ethernet" : "infiniband") +
                           " mtu " + std::to_string(128 << pa.active_mtu);
      for (int g = 0; g < pa.gid_tbl_len && g < 16; ++g) {
        ibv_gid x{};
        if (api->query_gid(ctx, p, g, &x) != 0) continue;
        static const ibv_gid kZero{};
        if (memcmp(&x, &kZero, sizeof x) == 0) continue;
        detail += " gid[" + std::to_string(g) + "]=" + gid_text(x);
        bool mapped = x.raw[10] == 0xff && x.raw[11] == 0xff;
        if (pa.state == IBV_PORT_ACTIVE && !chosen && (mapped || pa.link_layer != IBV_LINK_LAYER_ETHERNET)) {
          chosen = ctx, chosen_port = p, chosen_gid = g, gid = x, chosen_attr = pa;
          chosen_name = name, chosen_vendor = dattr.vendor_id;
        }
      }
      report(out, pa.state == IBV_PORT_ACTIVE, "port", detail);
    }
    if (ctx != chosen) api->close_device(ctx);
  }
  api->free_device_list(list);
  if (!chosen) return report(out, false, "select", "no active port with a usable GID");
  report(out, true, "select", "port " + std::to_string(chosen_port) + " gid index " + std::to_string(chosen_gid));
  // What RDMASHIM_TRANSPORT=auto does across hosts on this device, and why.
  verbs::Judgement j = verbs::judge(verbs::gather_facts(chosen_name.c_str(), chosen_vendor), config().transport,
                                    config().soft_verbs);
  report(out, true, "policy", j.reason);

  ibv_pd* pd = api->alloc_pd(chosen);
  if (!pd) return report(out, false, "pd", strerror(errno));
  report(out, true, "pd", "allocated");
  ibv_cq* cq = api->create_cq(chosen, 16, nullptr, nullptr, 0);
  if (!cq) return report(out, false, "cq", strerror(errno));
  report(out, true, "cq", "created");
  const size_t kBytes = 4096;
  void* mem = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ibv_mr* mr = api->reg_mr(pd, mem, kBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) return report(out, false, "mr", strerror(errno));
  report(out, true, "mr", "registered 4096 bytes for remote write");
  ibv_qp_init_attr init{};
  init.send_cq = init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = init.cap.max_recv_wr = 4;
  init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  ibv_qp* qp = api->create_qp(pd, &init);
  if (!qp) return report(out, false, "qp", strerror(errno));
  report(out, true, "qp", "RC qp " + std::to_string(qp->qp_num));

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = chosen_port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (api->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    return report(out, false, "init", strerror(errno));
  }
  report(out, true, "init", "qp in INIT");
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = chosen_attr.active_mtu;
  a.dest_qp_num = qp->qp_num;  // loopback: the QP talks to itself
  a.rq_psn = 1;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = chosen_port;
  if (chosen_attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(chosen_gid);
    a.ah_attr.grh.hop_limit = 1;
  } else {
    a.ah_attr.dlid = chosen_attr.lid;
  }
  // One attempt only: repeated failed RTR transitions can wedge some providers.
  if (api->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    return report(out, false, "rtr", strerror(errno));
  }
  report(out, true, "rtr", "qp in RTR");
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 1;
  a.max_rd_atomic = 1;
  if (api->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                 IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    return report(out, false, "rts", strerror(errno));
  }
  report(out, true, "rts", "qp in RTS");

  ibv_recv_wr rwr{}, *rbad = nullptr;
  ibv_post_recv(qp, &rwr, &rbad);
  strcpy(static_cast<char*>(mem), "rdmashim");
  ibv_sge sge{reinterpret_cast<uintptr_t>(mem), 8, mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.imm_data = htonl(42);
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(mem) + 64;
  wr.wr.rdma.rkey = mr->rkey;
  if (ibv_post_send(qp, &wr, &bad) != 0) return report(out, false, "write", strerror(errno));
  int done = 0;
  ibv_wc wc[2];
  while (done < 2) {
    int k = ibv_poll_cq(cq, 2, wc);
    for (int i = 0; i < k; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        return report(out, false, "write", "completion status " + std::to_string(wc[i].status));
      }
    }
    done += k > 0 ? k : 0;
  }
  bool placed = memcmp(static_cast<char*>(mem) + 64, "rdmashim", 8) == 0;
  report(out, placed, "write", placed ? "loopback RDMA WRITE WITH IMM completed and placed" : "bytes not placed");
  api->destroy_qp(qp);
  api->dereg_mr(mr);
  api->destroy_cq(cq);
  api->dealloc_pd(pd);
  api->close_device(chosen);
  report(out, true, "teardown", "qp, mr, cq, pd and device released");
}

}  // namespace

int doctor(int argc, char** argv) {
  bool json = false;
  int timeout_s = 10;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--timeout" && i + 1 < argc) timeout_s = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: rdmashim doctor [--json] [--timeout SECONDS]\n");
      return 2;
    }
  }
  if (timeout_s <= 0) timeout_s = 10;
  const std::vector<DoctorLine> same_host = same_host_checks();
  bool same_host_ok = true;
  for (auto& [ok, text] : same_host) same_host_ok = same_host_ok && ok;
  fflush(stdout);  // nothing buffered twice by the fork
  int p[2];
  if (pipe(p) != 0) return 1;
  pid_t child = fork();
  if (child == 0) {
    close(p[0]);
    probe(p[1]);
    _exit(0);
  }
  close(p[1]);
  // Each step must report within the timeout, measured from the last report.
  std::string buf, step = "load";
  std::vector<DoctorLine> lines;
  bool blocked = false;
  for (;;) {
    pollfd pf{p[0], POLLIN, 0};
    int r = poll(&pf, 1, timeout_s * 1000);
    if (r == 0) {
      blocked = true;
      break;
    }
    char chunk[4096];
    ssize_t n = read(p[0], chunk, sizeof chunk);
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      bool ok = line.rfind("ok ", 0) == 0;
      lines.emplace_back(ok, line.substr(ok ? 3 : 5));
    }
  }
  if (blocked) kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  bool verbs_ok = !blocked && !lines.empty() && lines.back().second.rfind("teardown", 0) == 0;
  for (auto& [ok, text] : lines) verbs_ok = verbs_ok && (ok || text.rfind("port", 0) == 0);
  const bool all_ok = same_host_ok && verbs_ok;
  lines.insert(lines.begin(), same_host.begin(), same_host.end());
  if (json) {
    printf("{\"ok\":%s,\"same_host\":%s,\"verbs\":%s,\"blocked\":%s,\"steps\":[", all_ok ? "true" : "false",
           same_host_ok ? "true" : "false", verbs_ok ? "true" : "false", blocked ? "true" : "false");
    for (size_t i = 0; i < lines.size(); ++i) {
      std::string detail = lines[i].second;
      size_t sp = detail.find(' ');
      std::string name = detail.substr(0, sp), rest = sp == std::string::npos ? "" : detail.substr(sp + 1);
      printf("%s{\"step\":%s,\"ok\":%s,\"detail\":%s}", i ? "," : "", json_quote(name).c_str(),
             lines[i].first ? "true" : "false", json_quote(rest).c_str());
    }
    printf("]}\n");
  } else {
    for (auto& [ok, text] : lines) printf("%-5s %s\n", ok ? "ok" : "FAIL", text.c_str());
  }
  if (blocked) {
    fprintf(stderr, "rdmashim doctor: a provider call did not return within %d s after the last step (%s); "
                    "the device or its driver is wedged\n",
            timeout_s, lines.empty() ? "start" : lines.back().second.substr(0, lines.back().second.find(' ')).c_str());
    return 124;
  }
  if (!json) {
    printf("%s\n", same_host_ok ? "same host: ready (shared memory between local processes)"
                                : "same host: not ready (see FAIL above): local connections stay on TCP");
    printf("%s\n", verbs_ok ? "verbs: ready: the verbs transport can run here"
                            : "verbs: not ready (see FAIL above): connections to other hosts stay on TCP");
  }
  return all_ok ? 0 : 1;
}

}  // namespace rdmashim::tools
