// libibverbs, loaded at run time. The preload must never keep a program from
// starting because rdma-core is absent, so nothing links against it: the
// calls that are not inline in <infiniband/verbs.h> come from this table,
// filled by dlopen/dlsym on first use. (The data-path calls, ibv_post_send,
// ibv_post_recv, ibv_poll_cq and ibv_req_notify_cq, are inline and go
// straight to the provider.)
#pragma once

#include <infiniband/verbs.h>

namespace rdmashim::verbs {

struct IbvApi {
  ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
  int (*query_device)(ibv_context*, ibv_device_attr*);
  int (*query_port)(ibv_context*, uint8_t, _compat_ibv_port_attr*);
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  int (*dereg_mr)(ibv_mr*);
  ibv_comp_channel* (*create_comp_channel)(ibv_context*);
  int (*destroy_comp_channel)(ibv_comp_channel*);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**);
  void (*ack_cq_events)(ibv_cq*, unsigned int);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  int (*destroy_qp)(ibv_qp*);
};

// The table, or nullptr if libibverbs cannot be loaded (then there is no
// verbs transport and connections use shared memory or TCP).
const IbvApi* ibv();

// Port attributes through the provider's extended query when it has one.
int query_port(ibv_context* ctx, uint8_t port, ibv_port_attr* attr);

}  // namespace rdmashim::verbs
