#!/usr/bin/env python3
"""A plain server (never run under rdmashim) for COUNT connections: records
everything each client sends until it half-closes, then answers with a fixed
line and the SHA-256 of what it got.  plain_recorder.py PORT_FILE COUNT OUT"""
import hashlib, os, socket, sys

port_file, count, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(16)
with open(port_file + ".tmp", "w") as f:
    f.write(str(ls.getsockname()[1]))
os.rename(port_file + ".tmp", port_file)
with open(out, "wb") as rec:
    for _ in range(count):
        c, _ = ls.accept()
        got = b""
        while True:
            b = c.recv(65536)
            if not b:
                break
            got += b
        rec.write(got)
        c.sendall(b"PLAIN " + hashlib.sha256(got).hexdigest().encode() + b"\n")
        c.close()
