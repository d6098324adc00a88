#!/usr/bin/python3
"""Binds rdmashim's discovery names for a port (specific address, IPv4 and
IPv6 wildcards) as whoever runs it, so that a client under rdmashim would
believe an rdmashim server listens there; then sleeps until killed."""
import socket, sys, time

port = sys.argv[1]
held = []
for addr in ("127.0.0.1", "0.0.0.0", "::"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0rdmashim/v1/tcp/%s/%s" % (addr, port))
    held.append(s)
print("squatting", flush=True)
time.sleep(3600)
