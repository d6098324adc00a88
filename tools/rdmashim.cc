// rdmashim: the command-line front door.
//   rdmashim run [--transport T] [--log L] -- CMD [ARGS...]
//   rdmashim stat [--json]
//   rdmashim doctor [--json] [--timeout S]
//   rdmashim version
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "doctor.h"
#include "json.h"
#include "util/config.h"
#include "util/stats.h"

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
          "       rdmashim stat [--json]   connections of every process under rdmashim, by transport\n"
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

struct ProcStats {
  int pid;
  std::string command;
  uint64_t counts[static_cast<int>(rdmashim::stats::Outcome::kCount)];
};

// Finds every process's counter page among its descriptors (a memfd named
// rdmashim-stats) and reads it. Processes we may not inspect are skipped.
std::vector<ProcStats> collect_stats() {
  using rdmashim::stats::Page;
  std::vector<ProcStats> out;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* d = readdir(proc)) {
    int pid = atoi(d->d_name);
    if (pid <= 0) continue;
    std::string fddir = "/proc/" + std::string(d->d_name) + "/fd";
    DIR* fds = opendir(fddir.c_str());
    if (!fds) continue;
    while (dirent* f = readdir(fds)) {
      if (f->d_name[0] == '.') continue;
      std::string link = fddir + "/" + f->d_name;
      char target[256];
      ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      if (strncmp(target, "/memfd:rdmashim-stats", 21) != 0) continue;
      int fd = open(link.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      alignas(8) unsigned char buf[sizeof(Page)];
      ssize_t got = pread(fd, buf, sizeof buf, 0);
      close(fd);
      const auto* page = reinterpret_cast<const Page*>(buf);
      if (got != static_cast<ssize_t>(sizeof buf) || page->magic != rdmashim::stats::kPageMagic ||
          page->version != rdmashim::stats::kPageVersion || page->pid != pid) {
        continue;
      }
      ProcStats s{pid, "?", {}};
      for (int i = 0; i < static_cast<int>(rdmashim::stats::Outcome::kCount); ++i) s.counts[i] = page->counts[i].load();
      if (FILE* c = fopen(("/proc/" + std::string(d->d_name) + "/comm").c_str(), "r")) {
        char comm[64] = {};
        if (fgets(comm, sizeof comm, c)) s.command = std::string(comm, strcspn(comm, "\n"));
        fclose(c);
      }
      out.push_back(s);
      break;
    }
    closedir(fds);
  }
  closedir(proc);
  return out;
}

int stat(int argc, char** argv) {
  using rdmashim::stats::Outcome;
  bool json = argc > 0 && std::string(argv[0]) == "--json";
  const int n = static_cast<int>(Outcome::kCount);
  auto procs = collect_stats();
  if (json) {
    printf("[");
    for (size_t p = 0; p < procs.size(); ++p) {
      printf("%s{\"pid\":%d,\"command\":%s,\"connections\":{", p ? "," : "", procs[p].pid,
             rdmashim::tools::json_quote(procs[p].command).c_str());
      for (int i = 0; i < n; ++i) {
        printf("%s\"%s\":%llu", i ? "," : "", rdmashim::stats::name(static_cast<Outcome>(i)),
               static_cast<unsigned long long>(procs[p].counts[i]));
      }
      printf("}}");
    }
    printf("]\n");
    return 0;
  }
  if (procs.empty()) {
    printf("no process under rdmashim has made a connection yet (or none that you may inspect)\n");
    return 0;
  }
  printf("%-8s %-16s %8s %8s %8s  %s\n", "PID", "COMMAND", "SHM", "VERBS", "TCP", "TCP BECAUSE");
  for (auto& p : procs) {
    uint64_t tcp = 0;
    std::string why;
    for (int i = static_cast<int>(Outcome::kTcpNotAdvertised); i < n; ++i) {
      if (!p.counts[i]) continue;
      tcp += p.counts[i];
      why += (why.empty() ? "" : " ") + std::string(rdmashim::stats::name(static_cast<Outcome>(i)) + 4) + "=" +
             std::to_string(p.counts[i]);
    }
    printf("%-8d %-16s %8llu %8llu %8llu  %s\n", p.pid, p.command.c_str(),
           static_cast<unsigned long long>(p.counts[static_cast<int>(Outcome::kShm)]),
           static_cast<unsigned long long>(p.counts[static_cast<int>(Outcome::kVerbs)]),
           static_cast<unsigned long long>(tcp), why.c_str());
  }
  return 0;
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
  if (cmd == "stat") return stat(argc - 2, argv + 2);
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
