#include "util/fault.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

#include "util/config.h"
#include "util/log.h"

namespace rdmashim::fault {
namespace {

// Per step: 0 not armed, UINT32_MAX every run, else the run that fails.
uint32_t g_armed[kStepCount];
std::atomic<uint32_t> g_runs[kStepCount];

}  // namespace

const char* step_name(Step s) {
  static const char* const kNames[kStepCount] = {
      "advertise",          "probe-socket",    "probe-connect",    "sockdiag",           "random",
      "rendezvous-socket",  "rendezvous-filter", "rendezvous-passcred", "rendezvous-bind",
      "memfd",              "local-page",      "ftruncate",        "seals",
      "mmap",               "handoff-socket",  "handoff-connect",  "handoff-send",     "handoff-recv",
      "attach-stat",        "attach-seals",    "doorbell-connect",
      "attach-mmap",        "attach-header",   "shm-fork",         "ibv-devices",      "ibv-open",
      "ibv-pd",             "ibv-mr",          "ibv-channel",      "ibv-cq",
      "ibv-qp",             "ibv-qp-init",     "ibv-gid",          "ibv-qp-rtr",
      "ibv-qp-rts",         "cm-channel",      "cm-id",            "cm-bind",
      "cm-listen",          "cm-resolve-addr", "cm-resolve-route", "cm-connect",
      "ibv-qp-block",       "ibv-qp-rtr-block"};
  return s < kStepCount ? kNames[s] : "?";
}

bool configure(const char* text) {
  uint32_t armed[kStepCount] = {};
  for (const char* p = text; p && *p;) {
    const char* end = p + strcspn(p, ",");
    const char* colon = static_cast<const char*>(memchr(p, ':', static_cast<size_t>(end - p)));
    size_t len = static_cast<size_t>((colon ? colon : end) - p);
    uint32_t nth = UINT32_MAX;
    if (colon) {
      char* stop = nullptr;
      unsigned long v = strtoul(colon + 1, &stop, 10);
      if (stop != end || stop == colon + 1 || v == 0 || v >= UINT32_MAX) return false;
      nth = static_cast<uint32_t>(v);
    }
    int found = -1;
    for (int s = 0; s < kStepCount && found < 0; ++s) {
      const char* name = step_name(static_cast<Step>(s));
      if (strlen(name) == len && memcmp(name, p, len) == 0) found = s;
    }
    if (found < 0 && len > 0) return false;
    if (found >= 0) armed[found] = nth;
    p = *end ? end + 1 : end;
  }
  memcpy(g_armed, armed, sizeof armed);
  for (auto& r : g_runs) r.store(0, std::memory_order_relaxed);
  return true;
}

void block_forever() {
  for (;;) sleep(3600);
}

bool hit(Step s) {
  if (g_state.load(std::memory_order_relaxed) == kUnknown) (void)config();
  if (g_state.load(std::memory_order_relaxed) != kOn || s >= kStepCount || g_armed[s] == 0) return false;
  uint32_t run = g_runs[s].fetch_add(1, std::memory_order_relaxed) + 1;
  if (g_armed[s] != UINT32_MAX && g_armed[s] != run) return false;
  RDMASHIM_INFO("test fault: %s made to fail (run %u)", step_name(s), run);
  errno = EIO;
  return true;
}

}  // namespace rdmashim::fault
