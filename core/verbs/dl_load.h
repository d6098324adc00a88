// Filling a table of function pointers from a library opened with dlopen:
// rdma-core is loaded at run time, never linked (see ibv_api.h).
#pragma once

#include <dlfcn.h>

namespace rdmashim::verbs {

template <typename Fn>
bool dl_load(void* lib, Fn*& slot, const char* name) {
  slot = reinterpret_cast<Fn*>(dlsym(lib, name));
  return slot != nullptr;
}

}  // namespace rdmashim::verbs
