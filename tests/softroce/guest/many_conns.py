#!/usr/bin/env python3
"""Many connections in one process (softroce.verbs_local, bench/softroce_scale.sh).

  many_conns.py server PORTFILE [N [AGAIN]]
                                         accepts connections and echoes each
                                         one until its EOF (one thread, epoll);
                                         with N: touches PORTFILE.all once N
                                         have sent something (their handshakes
                                         done) and returns once all closed
                                         (PEERS_PORT: a fixed port, else any;
                                         a reset counts as an EOF);
                                         writes PORTFILE.closed (seconds from
                                         the first EOF to the N-th close);
                                         AGAIN=1: then serves one more
                                         connection before returning
  many_conns.py client HOST PORT N BYTES MARK SECS [AGAIN]
                                         opens N connections (one byte each
                                         way on each, so every handshake is
                                         done), sends BYTES on every one (a
                                         thread writes while we read the
                                         echo) and checks the echo byte for
                                         byte, then touches MARK and holds
                                         them all open until MARK.go exists
                                         (at most SECS: time to read
                                         `rdmashim stat`); AGAIN=1: after
                                         closing them all, opens one more
                                         and echoes BYTES on it (timed);
                                         MANY_CONNS_PIPELINE=1: BYTES sent on
                                         every connection before any echo is
                                         read (BYTES must fit the ring);
                                         MANY_CONNS_GO=FILE: touches
                                         FILE.ready, then connects only once
                                         FILE exists (the interpreter's start,
                                         seconds in a TCG guest, not timed)

The client prints {"connections": N, "exact": bool, "open_s": S, "rss_kb": K,
"close_s": C, "again_s": A, "again_exact": bool} (rss_kb: its resident memory
with every connection open; close_s: closing all N; again_s: the next
connection's connect and echo, -1 without AGAIN or when it failed).
"""
import os
import random
import selectors
import socket
import sys
import threading
import time

BLOCK = random.Random(13).randbytes(1 << 20)


def pattern(i, n):
    off = (i * 7919) % len(BLOCK)
    b = (BLOCK + BLOCK)[off:off + min(n, len(BLOCK))]
    return (b * (n // len(b) + 1))[:n]


def recv_exact(s, n):
    parts, got = [], 0
    while got < n:
        c = s.recv(min(1 << 20, n - got))
        if not c:
            raise EOFError
        parts.append(c)
        got += len(c)
    return b"".join(parts)


def server(portfile, n=0, again=0):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((os.environ.get("PEERS_HOST", "127.0.0.1"), int(os.environ.get("PEERS_PORT", "0"))))
    ls.listen(1024)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(portfile + ".tmp", portfile)
    sel = selectors.DefaultSelector()  # epoll: past select()'s 1024 descriptors
    sel.register(ls, selectors.EVENT_READ)
    accepted = live = closed = 0
    first_eof = None
    heard = set()
    # With N: until every connection closed (or the client died); AGAIN: and one more.
    while not n or not accepted or live or (again and closed == n and accepted <= n):
        for key, _ in sel.select():
            s = key.fileobj
            if s is ls:
                c, _ = ls.accept()
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sel.register(c, selectors.EVENT_READ)
                accepted += 1
                live += 1
                continue
            try:
                b = s.recv(1 << 16)
            except ConnectionResetError:  # a killed client's socket with bytes unread
                b = b""
            if not b:
                if first_eof is None:
                    first_eof = time.monotonic()
                sel.unregister(s)
                s.close()
                live -= 1
                closed += 1
                if n and (closed % max(1, n // 10) == 0 or closed == n):
                    print("many_conns: %d closed %.1f s after the first EOF" % (closed, time.monotonic() - first_eof),
                          file=sys.stderr, flush=True)
                if closed == n:
                    with open(portfile + ".closed", "w") as f:
                        f.write("%.3f" % (time.monotonic() - first_eof))
                continue
            s.sendall(b)  # the client reads while it writes: never blocks for long
            if n and len(heard) < n:
                heard.add(s.fileno())
                if len(heard) == n:
                    open(portfile + ".all", "w").close()


def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGESIZE") // 1024)


def client(host, port, n, nbytes, mark, secs, again=0):
    go = os.environ.get("MANY_CONNS_GO")
    if go:
        open(go + ".ready", "w").close()
        while not os.path.exists(go):
            time.sleep(0.01)
    t0 = time.monotonic()
    conns = []
    for i in range(n):
        for attempt in range(6000):  # the first: until the server (in another guest) listens
            try:
                s = socket.create_connection((host, int(port)))
                break
            except ConnectionRefusedError:
                if i or attempt == 5999:
                    raise
                time.sleep(0.1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(b"h")
        if recv_exact(s, 1) != b"h":
            sys.exit(1)
        conns.append(s)
        if len(conns) % 100 == 0:
            print("many_conns: %d open after %.1f s" % (len(conns), time.monotonic() - t0), file=sys.stderr, flush=True)
    open_s = time.monotonic() - t0
    rss = rss_kb()
    exact = True
    if os.environ.get("MANY_CONNS_PIPELINE") == "1":
        # BYTES fit the ring and the socket buffers: all sent, then all read, so
        # the server's event loop serves many per wake-up (not one at a time).
        for i, s in enumerate(conns):
            s.sendall(pattern(i, nbytes))
        for i, s in enumerate(conns):
            exact = recv_exact(s, nbytes) == pattern(i, nbytes) and exact
    for i, s in enumerate(conns if os.environ.get("MANY_CONNS_PIPELINE") != "1" else []):
        data = pattern(i, nbytes)
        w = threading.Thread(target=s.sendall, args=(data,))
        w.start()
        exact = recv_exact(s, nbytes) == data and exact
        w.join()
    open(mark, "w").close()
    end = time.monotonic() + secs
    while not os.path.exists(mark + ".go") and time.monotonic() < end:
        time.sleep(0.1)
    t1 = time.monotonic()
    for s in conns:
        s.close()
    close_s = time.monotonic() - t1
    again_s, again_exact = -1.0, False
    if again:
        t2 = time.monotonic()
        try:
            s = socket.create_connection((host, int(port)), timeout=120)
            data = pattern(n, nbytes)
            w = threading.Thread(target=s.sendall, args=(data,))
            w.start()
            again_exact = recv_exact(s, nbytes) == data
            w.join()
            s.close()
            again_s = time.monotonic() - t2
        except OSError as e:
            print("many_conns: the next connection failed after %.1f s: %s" % (time.monotonic() - t2, e),
                  file=sys.stderr, flush=True)
    print('{"connections": %d, "exact": %s, "open_s": %.3f, "rss_kb": %d, "close_s": %.3f, "again_s": %.3f, '
          '"again_exact": %s}' % (n, "true" if exact else "false", open_s, rss, close_s, again_s,
                                  "true" if again_exact else "false"), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0, int(sys.argv[4]) if len(sys.argv) > 4 else 0)
    else:
        client(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], float(sys.argv[7]),
               int(sys.argv[8]) if len(sys.argv) > 8 else 0)
