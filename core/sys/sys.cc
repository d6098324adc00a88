#include "sys/sys.h"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <climits>

namespace rdmashim::sys {
namespace {

Table g_table;
std::atomic<int> g_source{-1};
pthread_once_t g_once = PTHREAD_ONCE_INIT;

// The address range of the object this code lives in, so a lookup that comes
// back pointing at one of our own hooks (a broken RTLD_NEXT order) is refused.
bool is_our_own(void* fn) {
  Dl_info self{}, found{};
  if (dladdr(reinterpret_cast<void*>(&is_our_own), &self) == 0) return false;
  if (dladdr(fn, &found) == 0) return false;
  return self.dli_fbase == found.dli_fbase;
}

void* libc_handle() {
  static void* handle = [] {
    void* h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    return h ? h : RTLD_DEFAULT;
  }();
  return handle;
}

template <typename Fn>
void resolve(Fn*& slot, const char* name, Source source) {
  void* fn = nullptr;
  if (source == Source::kNextObject) {
    fn = dlsym(RTLD_NEXT, name);
    if (fn && is_our_own(fn)) fn = nullptr;
  }
  if (!fn) fn = dlsym(libc_handle(), name);
  slot = reinterpret_cast<Fn*>(fn);
}

void resolve_all() {
  int chosen = g_source.load();
  Source s = chosen < 0 ? Source::kLibc : static_cast<Source>(chosen);
#define RDMASHIM_RESOLVE(name) resolve(g_table.name, #name, s)
  RDMASHIM_RESOLVE(socket);
  RDMASHIM_RESOLVE(bind);
  RDMASHIM_RESOLVE(listen);
  RDMASHIM_RESOLVE(accept);
  RDMASHIM_RESOLVE(accept4);
  RDMASHIM_RESOLVE(connect);
  RDMASHIM_RESOLVE(close);
  RDMASHIM_RESOLVE(read);
  RDMASHIM_RESOLVE(write);
  RDMASHIM_RESOLVE(readv);
  RDMASHIM_RESOLVE(writev);
  RDMASHIM_RESOLVE(recv);
  RDMASHIM_RESOLVE(send);
  RDMASHIM_RESOLVE(recvfrom);
  RDMASHIM_RESOLVE(sendto);
  RDMASHIM_RESOLVE(recvmsg);
  RDMASHIM_RESOLVE(sendmsg);
  RDMASHIM_RESOLVE(shutdown);
  RDMASHIM_RESOLVE(getpeername);
  RDMASHIM_RESOLVE(getsockname);
  RDMASHIM_RESOLVE(getsockopt);
  RDMASHIM_RESOLVE(setsockopt);
  RDMASHIM_RESOLVE(fcntl);
  RDMASHIM_RESOLVE(ioctl);
  RDMASHIM_RESOLVE(poll);
  RDMASHIM_RESOLVE(ppoll);
  RDMASHIM_RESOLVE(select);
  RDMASHIM_RESOLVE(pselect);
  RDMASHIM_RESOLVE(epoll_create);
  RDMASHIM_RESOLVE(epoll_create1);
  RDMASHIM_RESOLVE(epoll_ctl);
  RDMASHIM_RESOLVE(epoll_wait);
  RDMASHIM_RESOLVE(epoll_pwait);
  RDMASHIM_RESOLVE(epoll_pwait2);
  RDMASHIM_RESOLVE(dup);
  RDMASHIM_RESOLVE(dup2);
  RDMASHIM_RESOLVE(dup3);
  RDMASHIM_RESOLVE(fork);
  RDMASHIM_RESOLVE(recvmmsg);
  RDMASHIM_RESOLVE(sendmmsg);
  RDMASHIM_RESOLVE(sendfile);
  RDMASHIM_RESOLVE(splice);
  RDMASHIM_RESOLVE(pread);
#undef RDMASHIM_RESOLVE
}

}  // namespace

void init(Source source) {
  int expected = -1;
  g_source.compare_exchange_strong(expected, static_cast<int>(source));
  pthread_once(&g_once, resolve_all);
}

const Table& real() {
  pthread_once(&g_once, resolve_all);
  return g_table;
}

bool epoll_pwait2_missing() {
  // Asked once with a descriptor no kernel accepts: EBADF where the call exists.
  static const bool missing = [] {
    const Table& t = real();
    if (!t.epoll_pwait2) return true;
    int saved = errno;
    epoll_event ev;
    bool m = t.epoll_pwait2(-1, &ev, 1, nullptr, nullptr) < 0 && errno == ENOSYS;
    errno = saved;
    return m;
  }();
  return missing;
}

int epoll_wait_ts(int epfd, epoll_event* ev, int max, const timespec* ts, const sigset_t* mask) {
  const Table& t = real();
  if (!epoll_pwait2_missing()) return t.epoll_pwait2(epfd, ev, max, ts, mask);
  int ms = -1;
  if (ts) {
    long long total = ts->tv_sec > INT_MAX / 1000 ? INT_MAX
                                                  : static_cast<long long>(ts->tv_sec) * 1000 + (ts->tv_nsec + 999'999) / 1'000'000;
    ms = total > INT_MAX ? INT_MAX : static_cast<int>(total);
  }
  return t.epoll_pwait(epfd, ev, max, ms, mask);
}

}  // namespace rdmashim::sys
