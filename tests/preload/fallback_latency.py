#!/usr/bin/env python3
"""Request/response connections whose upgrade failed on the server (a fault
at memfd): the client's first send after the negative Ack carries its Plain
frame. Sent alone, that frame holds the request behind Nagle until the
server's delayed ACK (~40 ms per connection); TCP would answer in well under
a millisecond. Prints one line: the round trips slower than 35 ms."""
import socket
import sys
import time

mode, port = sys.argv[1], int(sys.argv[2])
CONNS, ROUNDS = 20, 4
if mode == "server":
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(64)
    print("listening", flush=True)
    for _ in range(CONNS):
        c, _ = ls.accept()
        for _ in range(ROUNDS):
            d = c.recv(100)
            if not d:
                break
            c.sendall(d)
        c.close()
else:
    slow = 0
    for i in range(CONNS):
        s = socket.create_connection(("127.0.0.1", port))
        for r in range(ROUNDS):
            a = time.monotonic()
            s.sendall(b"%02d:%02d" % (i, r))
            if s.recv(100) != b"%02d:%02d" % (i, r):
                sys.exit("wrong echo")
            slow += time.monotonic() - a > 0.035
        s.close()
    print("slow round trips: %d of %d" % (slow, CONNS * ROUNDS))
