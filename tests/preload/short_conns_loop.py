#!/usr/bin/env python3
# For short_conns.sh event_loop: an event-loop echo server (epoll through
# selectors, level-triggered, non-blocking sockets; it deletes a socket from
# the set before closing it, as libevent, libuv and Python programs do) and a
# client making short connections to it: connect, 64 B each way, close.
#   short_conns_loop.py server PORTFILE N   serves N connections, then exits
#   short_conns_loop.py client PORT N [MS]  MS: wait that long after each
#                                           connect before the first bytes
import os, selectors, socket, sys, time

def server(portfile, n):
    sel = selectors.EpollSelector()
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(128)
    ls.setblocking(False)
    sel.register(ls, selectors.EVENT_READ)
    with open(portfile + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(portfile + ".tmp", portfile)
    done = 0
    while done < n:
        for key, _ in sel.select():
            s = key.fileobj
            if s is ls:
                try:
                    c, _ = ls.accept()
                except BlockingIOError:
                    continue
                c.setblocking(False)
                sel.register(c, selectors.EVENT_READ)
                continue
            try:
                b = s.recv(4096)
            except BlockingIOError:
                continue
            if b:
                s.send(b)
                continue
            sel.unregister(s)
            s.close()
            done += 1

def client(port, n, late_ms):
    msg = b"x" * 64
    for _ in range(n):
        c = socket.create_connection(("127.0.0.1", port))
        if late_ms:
            time.sleep(late_ms / 1000)
        c.sendall(msg)
        got = b""
        while len(got) < 64:
            got += c.recv(64 - len(got))
        c.shutdown(socket.SHUT_WR)
        c.recv(1)
        c.close()

if sys.argv[1] == "server":
    server(sys.argv[2], int(sys.argv[3]))
else:
    client(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]) if len(sys.argv) > 4 else 0)
