// The RDMA device a process uses: opened once, on first need, with one
// protection domain, and a pool of registered buffers that connections
// reuse (some providers allow only tens of PDs and about a hundred MRs),
// bounded by RDMASHIM_VERBS_POOL bytes.
#pragma once

#include <infiniband/verbs.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "verbs/limits.h"
#include "verbs/policy.h"
#include "verbs/reg_pool.h"

namespace rdmashim::verbs {

class Device {
 public:
  // The process's device: RDMASHIM_DEVICE if set, else the first device with
  // an active port. nullptr, with *err, when there is none (or no libibverbs).
  static Device* get(int* err);
  // In a forked child: the parent's resources are not ours to use or to
  // destroy (destroying them through the shared uverbs file would destroy
  // the parent's); we close our copies of the descriptors and forget them.
  static void forget_after_fork();
  // A provider call (`what`) outlived the setup timeout: this process stops
  // using verbs (get() answers -ETIMEDOUT from now on) and says so once.
  static void give_up(const char* what);

  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  uint8_t port() const { return port_; }
  ibv_mtu mtu() const { return mtu_; }
  uint16_t lid() const { return lid_; }
  bool ethernet() const { return ethernet_; }
  const std::string& name() const { return name_; }
  // Entries a completion queue may hold (0: not known).
  int max_cqe() const { return max_cqe_; }
  // Soft-RoCE or soft-iWARP: the "NIC" is this host's kernel (policy.h).
  bool software() const { return judgement_.software; }
  const Judgement& judgement() const { return judgement_; }
  // The short TCP reason when verbs to other hosts is refused ("software rdma rxe0").
  const char* refusal() const { return refusal_.c_str(); }

  // The GID index to use for a connection from `local`: RDMASHIM_GID_INDEX if
  // set, else a RoCEv2 GID that maps local's IPv4 address, else any IPv4-mapped
  // RoCEv2 GID, else 0. -1 if the port has no usable GID.
  int gid_index_for(const sockaddr* local) const;
  bool gid(int index, ibv_gid* out) const;

  // A link's queues, counted in the stats page (stats::verbs_add) here and
  // nowhere else; the fault injection stays with the caller.
  // A completion channel (verbs/shared_cq.h) whose descriptor is
  // non-blocking and kept out of the program's numbers (util/fd_budget.h):
  // -EMFILE when there is no room for it (the connection stays on TCP as
  // tcp:fd-budget).
  ibv_comp_channel* create_channel(int* err);
  void destroy_channel(ibv_comp_channel* channel);
  ibv_cq* create_cq(int depth, ibv_comp_channel* channel);
  void destroy_cq(ibv_cq* cq);
  ibv_qp* create_qp(ibv_qp_init_attr* init);
  void destroy_qp(ibv_qp* qp);

  // Whether this process may make one more link registering `bytes`
  // (verbs/limits.h); the first refusal is also said in a warning. An
  // admitted link holds a queue pair and a completion queue in reserve
  // until end_link_setup(), called once its own are made (or not).
  Refusal admit_link(uint64_t bytes);
  void end_link_setup();
  // A link refused (by admit_link or a take): said once per process, with the figures.
  void say_refused(Refusal r);

  // Registered memory, reused across connections. Pages are pinned by the
  // registration: a ring costs its whole size while it exists. Counted
  // (bytes, registrations, the pool's share) in the stats page. A new
  // registration must fit the limits (the pool gives up entries first) and,
  // when budgeted, the memory budget; *why says which refused it.
  bool take(size_t size, bool remote, Buffer* out, bool budgeted = true, Refusal* why = nullptr);
  void give_back(const Buffer& b);
  // Deregisters b now, past the pool (a region an idle connection shrank from).
  void drop(const Buffer& b);

 private:
  Device();
  static Device* open_first(int* err);  // the first active port (or RDMASHIM_DEVICE)
  std::string gid_type(int index) const;
  static void deregister(const Buffer& b);
  VerbsUsage usage_locked();  // pool_mu_ held

  std::string name_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 1;
  ibv_mtu mtu_ = IBV_MTU_1024;
  uint16_t lid_ = 0;
  int gid_table_len_ = 0;
  bool ethernet_ = true;
  Judgement judgement_;
  std::string refusal_;
  DeviceLimits limits_;  // queried once, at open
  int max_cqe_ = 0;
  uint64_t budget_ = 0;  // registered bytes at most (RDMASHIM_VERBS_MEM or default_budget)
  std::mutex pool_mu_;   // the pool, and a registration's admission with its reservation
  RegPool pool_;
  uint64_t links_reserved_ = 0;  // pool_mu_ held: admitted, queues not made yet
};

}  // namespace rdmashim::verbs
