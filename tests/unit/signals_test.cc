// signals_restart(): whether a wait our poll() ended with EINTR is restarted,
// as the kernel would restart the blocking call the application made.
#include "util/signals.h"

#include <gtest/gtest.h>
#include <signal.h>

namespace {

void on_signal(int) {}

struct SavedAction {
  int sig;
  struct sigaction old;
  SavedAction(int s, int flags) : sig(s) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, &old);
  }
  ~SavedAction() { sigaction(sig, &old, nullptr); }
};

}  // namespace

TEST(SignalsRestart, FollowsSaRestartOfCaughtSignals) {
  SavedAction usr1(SIGUSR1, SA_RESTART);
  EXPECT_TRUE(rdmashim::signals_restart());
  SavedAction usr2(SIGUSR2, 0);
  EXPECT_FALSE(rdmashim::signals_restart());
}

// A crash handler (or a sanitizer runtime) without SA_RESTART on SIGSEGV
// must not turn every interrupted wait into EINTR: a fault signal is raised
// by the thread's own instruction, never while it is blocked in a call.
TEST(SignalsRestart, IgnoresFaultSignalHandlers) {
  SavedAction usr1(SIGUSR1, SA_RESTART);
  SavedAction segv(SIGSEGV, SA_NODEFER);
  SavedAction bus(SIGBUS, 0);
  SavedAction fpe(SIGFPE, 0);
  EXPECT_TRUE(rdmashim::signals_restart());
}
