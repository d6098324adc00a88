// A listening socket on 127.0.0.1 and a client connected to it (blocking),
// for the bare epoll programs here. Returns 0, or -1 with errno set.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static inline int loopback_pair(int* listener, int* client) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (l < 0 || bind(l, (struct sockaddr*)&a, sizeof a) != 0 || listen(l, 4) != 0) return -1;
  getsockname(l, (struct sockaddr*)&a, &len);
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || connect(c, (struct sockaddr*)&a, sizeof a) != 0) return -1;
  *listener = l;
  *client = c;
  return 0;
}
