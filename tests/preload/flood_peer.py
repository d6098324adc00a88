#!/usr/bin/env python3
"""Echo server and client for the rendezvous flood test.
  flood_peer.py server PORT_FILE COUNT   accept, wait 50 ms before reading
                                         (the client's rendezvous stays up that long),
                                         then echo everything until EOF
  flood_peer.py client PORT COUNT        send 256 KiB, half-close, check the echo"""
import os, socket, sys, time

mode, arg, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "server":
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    with open(arg + ".tmp", "w") as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(arg + ".tmp", arg)
    for _ in range(count):
        c, _ = ls.accept()
        time.sleep(0.05)
        while True:
            b = c.recv(65536)
            if not b:
                break
            c.sendall(b)
        c.close()
else:
    bad = 0
    for i in range(count):
        data = os.urandom(256 * 1024)
        s = socket.create_connection(("127.0.0.1", int(arg)))
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        got = bytearray()
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
        bad += bytes(got) != data
        s.close()
    print("connections %d bad %d" % (count, bad))
    sys.exit(1 if bad else 0)
