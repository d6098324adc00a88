#include "util/config.h"

#include <pthread.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "util/fault.h"
#include "util/log.h"
#include "util/schedule.h"

namespace rdmashim {
namespace {

Config g_config;
pthread_once_t g_once = PTHREAD_ONCE_INIT;


template <typename T>
bool read_number(const char* name, T* field, uint64_t lo, uint64_t hi) {
  const char* text = getenv(name);
  if (!text || !*text) return false;
  uint64_t v = 0;
  if (!parse_size(text, &v) || v < lo || v > hi) {
    RDMASHIM_WARN("ignoring %s=%s (expected %llu..%llu)", name, text,
              static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi));
    return false;
  }
  *field = static_cast<T>(v);
  return true;
}

void load() {
  Config& c = g_config;
  // The log level first, so the warnings below are shown or not as asked.
  if (const char* t = getenv("RDMASHIM_LOG")) {
    if (!strcmp(t, "off") || !strcmp(t, "0")) c.log_level = 0;
    else if (!strcmp(t, "warn") || !strcmp(t, "1")) c.log_level = 1;
    else if (!strcmp(t, "info") || !strcmp(t, "2")) c.log_level = 2;
    else if (!strcmp(t, "debug") || !strcmp(t, "3")) c.log_level = 3;
  }
  log::set_level(c.log_level);
  log::prime_pid();
  log::set_file(getenv("RDMASHIM_LOG_FILE"));

  if (const char* t = getenv("RDMASHIM_TRANSPORT"); t && *t && !parse_transport(t, &c.transport)) {
    RDMASHIM_WARN("ignoring RDMASHIM_TRANSPORT=%s (expected %s)", t, kTransportNames);
  }
  read_number("RDMASHIM_SETUP_TIMEOUT_MS", &c.setup_timeout_ms, 1, 600000);
  read_number("RDMASHIM_SPIN_US", &c.spin_us, 0, 1000000);
  read_number("RDMASHIM_SHORT_CONN_MS", &c.short_conn_ms, 0, 600000);
  size_t ring = c.ring_size;
  bool ring_given = read_number("RDMASHIM_RING_SIZE", &ring, kMinRingSize, kMaxRingSize);
  if (ring & (ring - 1)) {
    RDMASHIM_WARN("ignoring RDMASHIM_RING_SIZE=%zu (must be a power of two)", ring);
  } else {
    c.ring_size_set = ring_given;
    c.ring_size = ring;
  }
  read_number("RDMASHIM_VERBS_POOL", &c.verbs_pool_bytes, 0, uint64_t{1} << 30);
  read_number("RDMASHIM_VERBS_MEM", &c.verbs_mem_bytes, 0, uint64_t{1} << 50);
  read_number("RDMASHIM_HEARTBEAT_S", &c.heartbeat_s, 1, 86400);
  if (const char* t = getenv("RDMASHIM_FORKGEN"); t && *t) {
    uint64_t v = 0;
    if (parse_size(t, &v) && v < 64) c.fork_generation = static_cast<int>(v);
    else RDMASHIM_WARN("ignoring RDMASHIM_FORKGEN=%s (expected 0..63)", t);
  }
  if (const char* t = getenv("RDMASHIM_DISABLE"); t && *t && strcmp(t, "0") != 0) c.disabled = true;
  if (const char* t = getenv("RDMASHIM_SOFT_VERBS"); t && *t && strcmp(t, "0") != 0) c.soft_verbs = true;
  if (const char* t = getenv("RDMASHIM_DEVICE"); t && *t) {
    if (strlen(t) < sizeof c.device) memcpy(c.device, t, strlen(t) + 1);
    else RDMASHIM_WARN("ignoring RDMASHIM_DEVICE=%s (longer than any device name)", t);
  }
  read_number("RDMASHIM_GID_INDEX", &c.gid_index, 0, 255);
  // Kept as the environment holds it; discovery parses (and warns about) it.
  if (const char* t = getenv("RDMASHIM_PEERS"); t && *t) c.peers = strdup(t);
  if (const char* t = getenv("RDMASHIM_TEST_SCHEDULE"); t && *t) {
    uint64_t v = 0, n = 0;
    char seed[32] = {};
    const char* comma = strchr(t, ',');
    size_t len = comma ? static_cast<size_t>(comma - t) : strlen(t);
    if (len < sizeof seed) memcpy(seed, t, len);
    bool ok = len < sizeof seed && parse_size(seed, &v);
    if (ok && comma) ok = !strncmp(comma, ",downgrade=", 11) && parse_size(comma + 11, &n) && n > 0 && n <= UINT32_MAX;
    if (ok) c.test_schedule_on = true, c.test_schedule = v, c.test_downgrade = static_cast<uint32_t>(n);
    else RDMASHIM_WARN("ignoring RDMASHIM_TEST_SCHEDULE=%s (expected <seed>[,downgrade=<n>])", t);
  }
  sched::g_state.store(c.test_schedule_on ? sched::kOn : sched::kOff, std::memory_order_relaxed);
  if (const char* t = getenv("RDMASHIM_TEST_FAULT"); t && *t) {
    if (fault::configure(t)) c.test_fault_on = true;
    else RDMASHIM_WARN("ignoring RDMASHIM_TEST_FAULT=%s (expected STEP[:N],...; steps in util/fault.h)", t);
  }
  fault::g_state.store(c.test_fault_on ? fault::kOn : fault::kOff, std::memory_order_relaxed);
}

}  // namespace

const char* transport_name(TransportChoice t) {
  switch (t) {
    case TransportChoice::kAuto: return "auto";
    case TransportChoice::kShm: return "shm";
    case TransportChoice::kVerbs: return "verbs";
    case TransportChoice::kTcp: return "tcp";
  }
  return "auto";
}

bool parse_transport(const char* text, TransportChoice* out) {
  for (TransportChoice t : {TransportChoice::kAuto, TransportChoice::kShm, TransportChoice::kVerbs,
                            TransportChoice::kTcp}) {
    if (text && strcmp(text, transport_name(t)) == 0) return *out = t, true;
  }
  return false;
}

bool parse_size(const char* text, uint64_t* out) {
  if (!text || *text < '0' || *text > '9') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(text, &end, 10);
  if (errno != 0 || end == text) return false;
  unsigned shift = 0;
  switch (*end) {
    case '\0': break;
    case 'k': case 'K': shift = 10; ++end; break;
    case 'm': case 'M': shift = 20; ++end; break;
    case 'g': case 'G': shift = 30; ++end; break;
    default: return false;
  }
  if (*end != '\0') return false;
  if (shift && v > (~0ULL >> shift)) return false;
  *out = v << shift;
  return true;
}

const Config& config() {
  pthread_once(&g_once, load);
  return g_config;
}

}  // namespace rdmashim
