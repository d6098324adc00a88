#include "verbs/rdmacm_api.h"

#include <dlfcn.h>
#include <pthread.h>

namespace rdmashim::verbs {
namespace {

RdmaCmApi g_api;
const RdmaCmApi* g_ready = nullptr;
pthread_once_t g_once = PTHREAD_ONCE_INIT;

template <typename Fn>
bool load(void* lib, Fn*& slot, const char* name) {
  slot = reinterpret_cast<Fn*>(dlsym(lib, name));
  return slot != nullptr;
}

void open_library() {
  void* lib = dlopen("librdmacm.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  bool ok = load(lib, g_api.create_event_channel, "rdma_create_event_channel") &&
            load(lib, g_api.destroy_event_channel, "rdma_destroy_event_channel") &&
            load(lib, g_api.create_id, "rdma_create_id") && load(lib, g_api.destroy_id, "rdma_destroy_id") &&
            load(lib, g_api.bind_addr, "rdma_bind_addr") && load(lib, g_api.listen, "rdma_listen") &&
            load(lib, g_api.resolve_addr, "rdma_resolve_addr") &&
            load(lib, g_api.resolve_route, "rdma_resolve_route") && load(lib, g_api.connect, "rdma_connect") &&
            load(lib, g_api.reject, "rdma_reject") && load(lib, g_api.get_cm_event, "rdma_get_cm_event") &&
            load(lib, g_api.ack_cm_event, "rdma_ack_cm_event");
  if (ok) g_ready = &g_api;  // stays loaded: its threads and ids live on
}

}  // namespace

const RdmaCmApi* rdmacm() {
  pthread_once(&g_once, open_library);
  return g_ready;
}

}  // namespace rdmashim::verbs
