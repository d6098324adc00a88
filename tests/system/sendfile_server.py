#!/usr/bin/env python3
"""A tiny HTTP/1.0 server for the system tests: answers every GET with one
file, sent with socket.sendfile (os.sendfile with an offset), then closes.
usage: sendfile_server.py PORT FILE"""
import os
import socket
import sys
import threading


def serve(conn, path):
    with conn:
        req = b""
        while b"\r\n\r\n" not in req:
            chunk = conn.recv(4096)
            if not chunk:
                return
            req += chunk
        size = os.path.getsize(path)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % size)
        with open(path, "rb") as f:
            sent = conn.sendfile(f)
        if sent != size:
            print(f"sendfile_server: sent {sent} of {size}", file=sys.stderr)


def main():
    port, path = int(sys.argv[1]), sys.argv[2]
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", port))
    lsock.listen(16)
    while True:
        conn, _ = lsock.accept()
        threading.Thread(target=serve, args=(conn, path), daemon=True).start()


if __name__ == "__main__":
    main()
