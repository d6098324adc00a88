// Which system calls rdmashim may make on a program's behalf.
//
// A sandboxed program (OpenSSH's pre-authentication child, a systemd unit
// with SystemCallFilter=, a browser's renderer) may be killed by any call it
// did not make itself. So inside a hook, every call rdmashim makes on the
// socket is of the family the program used there (its "calling convention"),
// and it sleeps the way the program last slept (poll, ppoll, select or
// pselect). See docs/ARCHITECTURE.md, "System calls on the program's behalf".
#pragma once

#include <poll.h>
#include <signal.h>

#include <cstdint>

namespace rdmashim::sys {

enum class Calls : uint8_t {
  kMsg,    // recvmsg/sendmsg (and the default outside any hook)
  kSend,   // recv/send/recvfrom/sendto: one buffer, flags
  kRead,   // read/write: one buffer, no flags
  kReadv,  // readv/writev: several buffers, no flags
};
inline bool file_calls(Calls c) { return c == Calls::kRead || c == Calls::kReadv; }

enum class WaitCall : uint8_t { kPoll, kPpoll, kSelect, kPselect };
// select and pselect report no POLLRDHUP/POLLHUP/POLLERR (see wait()).
inline bool select_like(WaitCall w) { return w == WaitCall::kSelect || w == WaitCall::kPselect; }

// The hooks note how the program sleeps; rdmashim's own waits follow it.
void note_wait_call(WaitCall w);
WaitCall wait_call();

// poll() done with the program's sleeping call. Same result and errno as poll.
// select/pselect report POLLIN, POLLOUT, POLLPRI only (no POLLERR/POLLHUP:
// those show as readable or writable) and fall back to poll() for a
// descriptor past FD_SETSIZE.
int wait(pollfd* fds, nfds_t n, int timeout_ms);
int wait_as(WaitCall how, pollfd* fds, nfds_t n, int timeout_ms, const sigset_t* mask = nullptr);

// The calling convention of the hook this thread is in. A scope nests: the
// innermost one wins, and the previous one comes back when it ends.
// `sigpipe_ok`: the program's own call would raise SIGPIPE on a broken
// stream (write(), send() without MSG_NOSIGNAL), so rdmashim's write() may too.
class CallScope {
 public:
  CallScope(Calls calls, bool sigpipe_ok);
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  Calls saved_calls_;
  bool saved_sigpipe_ok_;
  bool saved_raised_;
};

Calls current_calls();
bool sigpipe_ok();
// The kernel already raised SIGPIPE for a call of ours in this scope: the
// hook must not raise another one.
bool sigpipe_raised();
void note_sigpipe_raised();

}  // namespace rdmashim::sys
