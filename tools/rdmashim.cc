// rdmashim: the command-line front door.
//   rdmashim run [--transport T] [--log L] -- CMD [ARGS...]
//   rdmashim stat [--json] [--watch [SECONDS] [--count N]]
//   rdmashim doctor [--json] [--timeout S]
//   rdmashim version
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dlfcn.h>
#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "doctor.h"
#include "stat.h"
#include "util/config.h"

namespace {

#ifndef RDMASHIM_REL_LIBDIR
#define RDMASHIM_REL_LIBDIR "../lib"
#endif
#ifndef RDMASHIM_VERSION
#define RDMASHIM_VERSION "0"
#endif

void usage() {
  fprintf(stderr,
          "usage: rdmashim run [--transport auto|shm|verbs|tcp] [--log off|warn|info|debug] [--] CMD [ARGS...]\n"
          "       rdmashim stat [--json] [--watch [SECONDS] [--count N]]   every process under rdmashim:\n"
          "                connections by transport, and each live one (addresses, bytes, ring fill)\n"
          "       rdmashim doctor [--json] [--timeout S]   is this machine ready for RDMA verbs?\n"
          "       rdmashim version\n"
          "Runs CMD with librdmashim.so preloaded (kept in front of any LD_PRELOAD already set).\n");
}

bool exists(const std::string& p) {
  struct stat st{};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// The library next to this executable: the build tree keeps it in ../lib,
// an install in the configured libdir. RDMASHIM_LIBRARY overrides both.
std::string find_library() {
  if (const char* env = getenv("RDMASHIM_LIBRARY"); env && *env) return exists(env) ? env : "";
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "";
  self[n] = '\0';
  std::string dir(self);
  dir.resize(dir.rfind('/'));
  for (const char* rel : {RDMASHIM_REL_LIBDIR, "../lib"}) {
    std::string candidate = dir + "/" + rel + "/librdmashim.so";
    char real[PATH_MAX];
    if (exists(candidate) && realpath(candidate.c_str(), real)) return real;
  }
  return "";
}

#if defined(__SANITIZE_ADDRESS__)
extern "C" void __asan_init();
#endif

// In an AddressSanitizer build the library needs the ASan runtime loaded
// before it (ASan insists on being first in the library list, and programs
// like the shell are not linked with it): the runtime this tool itself uses,
// found through one of its symbols. "" in a normal build.
std::string sanitizer_runtime() {
#if defined(__SANITIZE_ADDRESS__)
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&__asan_init), &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
    return info.dli_fname;
  }
#endif
  return "";
}

int run(int argc, char** argv) {
  int i = 0;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--transport" && i + 1 < argc) {
      rdmashim::TransportChoice ignored;
      if (!rdmashim::parse_transport(argv[i + 1], &ignored)) {
        fprintf(stderr, "rdmashim run: --transport takes %s\n", rdmashim::kTransportNames);
        return 2;
      }
      setenv("RDMASHIM_TRANSPORT", argv[++i], 1);
    } else if (a == "--log" && i + 1 < argc) {
      setenv("RDMASHIM_LOG", argv[++i], 1);
    } else if (a[0] == '-') {
      fprintf(stderr, "rdmashim run: unknown option %s\n", a.c_str());
      usage();
      return 2;
    } else {
      break;
    }
  }
  if (i >= argc) {
    usage();
    return 2;
  }
  std::string lib = find_library();
  if (lib.empty()) {
    fprintf(stderr, "rdmashim run: cannot find librdmashim.so next to this program (set RDMASHIM_LIBRARY)\n");
    return 127;
  }
  if (lib.find_first_of(" :") != std::string::npos) {
    fprintf(stderr, "rdmashim run: the library path %s contains a space or colon, which LD_PRELOAD cannot hold\n",
            lib.c_str());
    return 127;
  }
  std::string preload = lib;
  if (std::string rt = sanitizer_runtime(); !rt.empty()) preload = rt + " " + preload;
  if (const char* old = getenv("LD_PRELOAD"); old && *old) preload += std::string(" ") + old;
  setenv("LD_PRELOAD", preload.c_str(), 1);
  execvp(argv[i], argv + i);
  fprintf(stderr, "rdmashim run: cannot run %s: %s\n", argv[i], strerror(errno));
  return errno == ENOENT ? 127 : 126;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "run") return run(argc - 2, argv + 2);
  if (cmd == "stat") return rdmashim::tools::stat(argc - 2, argv + 2);
  if (cmd == "doctor") return rdmashim::tools::doctor(argc - 2, argv + 2);
  if (cmd == "version" || cmd == "--version") {
    printf("rdmashim %s\n", RDMASHIM_VERSION);
    return 0;
  }
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage();
    return 0;
  }
  fprintf(stderr, "rdmashim: unknown command %s\n", cmd.c_str());
  usage();
  return 2;
}
