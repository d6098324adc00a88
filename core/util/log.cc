#include "util/log.h"

#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>

#include "sys/sys.h"

namespace rdmashim::log {

void write(int level, const char* fmt, ...) {
  int saved = errno;  // logging must never disturb the errno a hook returns
  static const char* const kNames[] = {"", "warn", "info", "debug"};
  char line[512];
  int n = snprintf(line, sizeof line, "rdmashim[%d] %s: ", static_cast<int>(getpid()),
                   kNames[level & 3]);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  // One write(2) so lines from several processes do not interleave.
  ssize_t ignored = sys::real().write(STDERR_FILENO, line, len);
  (void)ignored;
  errno = saved;
}

}  // namespace rdmashim::log
