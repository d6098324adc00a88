// Answer-then-close (HTTP/1.0 style), repeated: the client sends a 16-byte
// request; the server (a child process) answers with RESP bytes and close()s
// at once, never reading again; the client reads until EOF. Natively every
// connection delivers all RESP bytes and then EOF. Exits 0 only if every
// connection did.
//
// usage: close_after_response [ROUNDS (100)] [RESP bytes (200000)]
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned char byte_at(size_t i) { return (unsigned char)(i * 131 + 17); }

int main(int argc, char** argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 100;
  size_t resp = argc > 2 ? strtoul(argv[2], NULL, 10) : 200000;
  alarm(120);  // bounded, whatever happens
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (bind(l, (struct sockaddr*)&a, sizeof a) != 0 || listen(l, 16) != 0) return perror("listen"), 2;
  getsockname(l, (struct sockaddr*)&a, &len);
  unsigned char* answer = malloc(resp);
  for (size_t i = 0; i < resp; ++i) answer[i] = byte_at(i);
  pid_t child = fork();
  if (child == 0) {
    for (int i = 0; i < rounds; ++i) {
      int s = accept(l, NULL, NULL);
      if (s < 0) _exit(2);
      char req[16];
      size_t have = 0;
      while (have < sizeof req) {
        ssize_t n = recv(s, req + have, sizeof req - have, 0);
        if (n <= 0) break;
        have += (size_t)n;
      }
      size_t sent = 0;
      while (sent < resp) {
        ssize_t n = send(s, answer + sent, resp - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += (size_t)n;
      }
      if (sent != resp) fprintf(stderr, "server: connection %d: sent %zu of %zu: %s\n", i, sent, resp, strerror(errno));
      close(s);
    }
    _exit(0);
  }
  close(l);
  int ok = 0, short_eof = 0, errors = 0, corrupt = 0;
  size_t fewest = resp;
  static unsigned char buf[65536];
  for (int i = 0; i < rounds; ++i) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr*)&a, sizeof a) != 0) return perror("connect"), 2;
    send(c, "GET / HTTP/1.0\r\n", 16, MSG_NOSIGNAL);
    size_t got = 0;
    ssize_t n;
    int bad = 0;
    while ((n = recv(c, buf, sizeof buf, 0)) > 0) {
      for (ssize_t k = 0; k < n && !bad; ++k) bad = got + (size_t)k >= resp || buf[k] != byte_at(got + (size_t)k);
      got += (size_t)n;
    }
    int err = errno;
    if (bad) ++corrupt;
    if (n == 0 && got == resp && !bad) ++ok;
    else if (n == 0) ++short_eof;
    else ++errors;
    if (!(n == 0 && got == resp && !bad) && errors + short_eof <= 10)
      fprintf(stderr, "connection %d: %zu of %zu bytes, then %s%s\n", i, got, resp, n == 0 ? "EOF" : strerror(err),
              bad ? " (content differs)" : "");
    if (got < fewest) fewest = got;
    close(c);
  }
  int status = 0;
  waitpid(child, &status, 0);
  free(answer);
  printf("%s: %d connections, %zu-byte answer then close(): complete+EOF %d, short+EOF %d, error %d, "
         "content differs %d; fewest bytes received %zu\n",
         ok == rounds ? "ok" : "FAIL", rounds, resp, ok, short_eof, errors, corrupt, fewest);
  return ok == rounds && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
