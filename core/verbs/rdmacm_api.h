// librdmacm, loaded at run time like libibverbs (see ibv_api.h): only the
// calls cross-host discovery needs.
#pragma once

#include <rdma/rdma_cma.h>

namespace rdmashim::verbs {

struct RdmaCmApi {
  rdma_event_channel* (*create_event_channel)();
  void (*destroy_event_channel)(rdma_event_channel*);
  int (*create_id)(rdma_event_channel*, rdma_cm_id**, void*, rdma_port_space);
  int (*destroy_id)(rdma_cm_id*);
  int (*bind_addr)(rdma_cm_id*, sockaddr*);
  int (*listen)(rdma_cm_id*, int);
  int (*resolve_addr)(rdma_cm_id*, sockaddr*, sockaddr*, int);
  int (*resolve_route)(rdma_cm_id*, int);
  int (*connect)(rdma_cm_id*, rdma_conn_param*);
  int (*reject)(rdma_cm_id*, const void*, uint8_t);
  int (*get_cm_event)(rdma_event_channel*, rdma_cm_event**);
  int (*ack_cm_event)(rdma_cm_event*);
};

// The table, or nullptr if librdmacm cannot be loaded.
const RdmaCmApi* rdmacm();

}  // namespace rdmashim::verbs
