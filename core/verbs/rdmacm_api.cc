#include "verbs/rdmacm_api.h"

#include <dlfcn.h>
#include <pthread.h>

#include "verbs/dl_load.h"

namespace rdmashim::verbs {
namespace {

RdmaCmApi g_api;
const RdmaCmApi* g_ready = nullptr;
pthread_once_t g_once = PTHREAD_ONCE_INIT;

void open_library() {
  void* lib = dlopen("librdmacm.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  bool ok = dl_load(lib, g_api.create_event_channel, "rdma_create_event_channel") &&
            dl_load(lib, g_api.destroy_event_channel, "rdma_destroy_event_channel") &&
            dl_load(lib, g_api.create_id, "rdma_create_id") && dl_load(lib, g_api.destroy_id, "rdma_destroy_id") &&
            dl_load(lib, g_api.bind_addr, "rdma_bind_addr") && dl_load(lib, g_api.listen, "rdma_listen") &&
            dl_load(lib, g_api.resolve_addr, "rdma_resolve_addr") &&
            dl_load(lib, g_api.resolve_route, "rdma_resolve_route") && dl_load(lib, g_api.connect, "rdma_connect") &&
            dl_load(lib, g_api.reject, "rdma_reject") && dl_load(lib, g_api.get_cm_event, "rdma_get_cm_event") &&
            dl_load(lib, g_api.ack_cm_event, "rdma_ack_cm_event");
  if (ok) g_ready = &g_api;  // stays loaded: its threads and ids live on
}

}  // namespace

const RdmaCmApi* rdmacm() {
  pthread_once(&g_once, open_library);
  return g_ready;
}

}  // namespace rdmashim::verbs
