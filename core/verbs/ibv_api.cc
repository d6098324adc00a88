#include "verbs/ibv_api.h"

#include <dlfcn.h>
#include <pthread.h>

#include <cstring>

#include "verbs/dl_load.h"

namespace rdmashim::verbs {
namespace {

IbvApi g_api;
const IbvApi* g_ready = nullptr;
pthread_once_t g_once = PTHREAD_ONCE_INIT;

void open_library() {
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  bool ok = dl_load(lib, g_api.get_device_list, "ibv_get_device_list") &&
            dl_load(lib, g_api.free_device_list, "ibv_free_device_list") &&
            dl_load(lib, g_api.get_device_name, "ibv_get_device_name") &&
            dl_load(lib, g_api.open_device, "ibv_open_device") && dl_load(lib, g_api.close_device, "ibv_close_device") &&
            dl_load(lib, g_api.query_device, "ibv_query_device") && dl_load(lib, g_api.query_port, "ibv_query_port") &&
            dl_load(lib, g_api.query_gid, "ibv_query_gid") && dl_load(lib, g_api.alloc_pd, "ibv_alloc_pd") &&
            dl_load(lib, g_api.dealloc_pd, "ibv_dealloc_pd") && dl_load(lib, g_api.reg_mr, "ibv_reg_mr") &&
            dl_load(lib, g_api.dereg_mr, "ibv_dereg_mr") &&
            dl_load(lib, g_api.create_comp_channel, "ibv_create_comp_channel") &&
            dl_load(lib, g_api.destroy_comp_channel, "ibv_destroy_comp_channel") &&
            dl_load(lib, g_api.create_cq, "ibv_create_cq") && dl_load(lib, g_api.destroy_cq, "ibv_destroy_cq") &&
            dl_load(lib, g_api.get_cq_event, "ibv_get_cq_event") &&
            dl_load(lib, g_api.ack_cq_events, "ibv_ack_cq_events") && dl_load(lib, g_api.create_qp, "ibv_create_qp") &&
            dl_load(lib, g_api.modify_qp, "ibv_modify_qp") && dl_load(lib, g_api.destroy_qp, "ibv_destroy_qp");
  // The library stays loaded for the life of the process either way: the
  // providers it loaded must not be unmapped under a live context.
  if (ok) g_ready = &g_api;
}

}  // namespace

const IbvApi* ibv() {
  pthread_once(&g_once, open_library);
  return g_ready;
}

int query_port(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx) return vctx->query_port(ctx, port, attr, sizeof *attr);
  memset(attr, 0, sizeof *attr);
  return ibv()->query_port(ctx, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

}  // namespace rdmashim::verbs
