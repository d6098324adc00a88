// Built only into diff_scenarios_fortify (-O2 -D_FORTIFY_SOURCE=2): with a
// buffer of known size and a length the compiler cannot prove safe, glibc's
// headers turn read/recv/recvfrom/poll/ppoll into __read_chk, __recv_chk,
// __recvfrom_chk, __poll_chk and __ppoll_chk (run_diff.sh checks the binary
// references them with nm). Debian builds its packages this way.
#include "sc_common.h"

using namespace diff;

namespace {
// Lengths the optimiser cannot see through.
volatile size_t g_len5 = 5;
volatile nfds_t g_one = 1;
}  // namespace

SCENARIO(fortify_chk, 2) {
  run_pair(
      [](Pair& p) {
        char buf[64];
        pollfd pf[2] = {{p.fd, POLLIN, 0}, {-1, 0, 0}};
        for (int round = 0; round < 5; ++round) {
          p.ctl.sync();  // the client wrote 5 bytes
          int k;
          if (round % 2 == 0) {
            k = poll(pf, g_one, kBoundMs);
            T("poll (__poll_chk) = %s", pres(k, pf[0]).c_str());
          } else {
            timespec ts{5, 0};
            k = ppoll(pf, g_one, &ts, nullptr);
            T("ppoll (__ppoll_chk) = %s", pres(k, pf[0]).c_str());
          }
          ssize_t n = -1;
          const char* what = "";
          switch (round) {
            case 0:
              what = "read (__read_chk)";
              n = read(p.fd, buf, g_len5);
              break;
            case 1:
              what = "recv (__recv_chk)";
              n = recv(p.fd, buf, g_len5, 0);
              break;
            case 2: {
              what = "recvfrom (__recvfrom_chk)";
              sockaddr_storage from{};
              socklen_t flen = sizeof from;
              n = recvfrom(p.fd, buf, g_len5, 0, reinterpret_cast<sockaddr*>(&from), &flen);
              break;
            }
            case 3:
              what = "recv MSG_PEEK then read (__recv_chk, __read_chk)";
              n = recv(p.fd, buf, g_len5, MSG_PEEK);
              if (n > 0) n = read(p.fd, buf, g_len5);
              break;
            case 4:
              what = "recvfrom NULL address (__recvfrom_chk)";
              n = recvfrom(p.fd, buf, g_len5, 0, nullptr, nullptr);
              break;
          }
          T("%s = %s", what, Rn(n, buf).c_str());
          k = poll(pf, g_one, 0);
          T("then poll(0) = %s", pres(k, pf[0]).c_str());
          p.ctl.sync();  // done with this round
        }
      },
      [](Pair& p) {
        const char* msgs[5] = {"read!", "recv!", "from!", "peek!", "null!"};
        for (auto m : msgs) {
          write_all(p.fd, m, 5);
          p.ctl.sync();
          p.ctl.sync();
        }
      });
}
