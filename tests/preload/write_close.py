#!/usr/bin/env python3
"""Clients that write and close without ever reading (nc -q0), and their server.

server: accepts --count connections one after the other; waits --late-ms
  after each accept before its first read (so the client has closed, and
  perhaps exited, before the server's first I/O), then reads to EOF and
  checks every byte (ECONNRESET or a short stream is a failure). With
  --reply it answers after EOF (for --half-close clients). Prints JSON.
client: per connection writes --size bytes and close()s at once, never
  reading. Checks on the program's view of descriptors after close: the
  closed number is the lowest free one again (a new open() gets it); any
  socket left in /proc/self/fd that we did not open is rdmashim's and
  close() of it fails with EBADF; dup2() onto it works. --epoll: the socket
  was in an epoll set since before connect(): the set never reports it after
  close(). --half-close:
  shutdown(SHUT_WR) instead, then reads the server's reply to EOF.
"""
import argparse, errno, json, os, resource, select, socket, sys, time


def pattern(conn, size):
    return bytes((conn * 7 + i) & 0xFF for i in range(size))


def sockets_open():
    out = set()
    for name in os.listdir('/proc/self/fd'):
        try:
            if os.readlink('/proc/self/fd/' + name).startswith('socket:'):
                out.add(int(name))
        except OSError:
            pass
    return out


def server(a):
    ls = socket.socket()
    ls.bind(('127.0.0.1', 0))
    ls.listen(64)
    with open(a.port_file + '.tmp', 'w') as f:
        f.write(str(ls.getsockname()[1]))
    os.rename(a.port_file + '.tmp', a.port_file)
    bad = []
    for conn in range(a.count):
        s, _ = ls.accept()
        time.sleep(a.late_ms / 1000.0)
        got = bytearray()
        try:
            while True:
                b = s.recv(1 << 16)
                if not b:
                    break
                got += b
        except OSError as e:
            bad.append('conn %d: %s after %d bytes' % (conn, e, len(got)))
        if bytes(got) != pattern(conn, a.size):
            bad.append('conn %d: got %d bytes, expected %d' % (conn, len(got), a.size))
        if a.reply:
            s.sendall(b'reply-%d' % conn)
        s.close()
    print(json.dumps({'bad': len(bad), 'errors': bad[:10]}))
    return 0 if not bad else 1


def client(a):
    bad = []
    start = time.monotonic()
    for conn in range(a.count):
        if a.epoll:
            # In an epoll set from before connect() (as asio's async_connect):
            # after close() the set must never report it again.
            s = socket.socket()
            ep = select.epoll()
            ep.register(s.fileno(), select.EPOLLIN | select.EPOLLOUT)
            s.connect(('127.0.0.1', a.port))
        else:
            s = socket.create_connection(('127.0.0.1', a.port))
        if a.half_close:
            s.sendall(pattern(conn, a.size))
            s.shutdown(socket.SHUT_WR)
            reply = b''
            while True:
                b = s.recv(4096)
                if not b:
                    break
                reply += b
            if reply != b'reply-%d' % conn:
                bad.append('conn %d: reply %r' % (conn, reply))
            s.close()
            continue
        before = sockets_open()
        fd = s.detach()
        s_sendall(fd, pattern(conn, a.size))
        os.close(fd)
        if a.epoll:
            stale = ep.poll(0.2)
            if stale:
                bad.append('conn %d: epoll reported closed fd %d: %r' % (conn, fd, stale))
            ep.close()
        n = os.open('/dev/null', os.O_RDONLY)
        if n != fd:
            bad.append('conn %d: closed %d, the next open() got %d' % (conn, fd, n))
        for held in sockets_open() - before - {fd}:
            try:
                os.close(held)
                bad.append('conn %d: close() of rdmashim\'s fd %d succeeded' % (conn, held))
            except OSError as e:
                if e.errno != errno.EBADF:
                    bad.append('conn %d: close(%d): %s' % (conn, held, e))
            if conn % 2 == 0 and held < resource.getrlimit(resource.RLIMIT_NOFILE)[0]:
                # The number is free as far as we know: ours now. (Above the
                # soft limit, where rdmashim keeps its own when it can, dup2
                # fails with EBADF for any number, as on TCP.)
                os.dup2(n, held)
                os.close(held)
        os.close(n)
    print(json.dumps({'bad': len(bad), 'errors': bad[:10], 'seconds': time.monotonic() - start, 'end': time.time()}))
    return 0 if not bad else 1


def s_sendall(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def main():
    p = argparse.ArgumentParser()
    p.add_argument('role', choices=['server', 'client'])
    p.add_argument('--port-file')
    p.add_argument('--port', type=int)
    p.add_argument('--count', type=int, default=20)
    p.add_argument('--size', type=int, default=1000)
    p.add_argument('--late-ms', type=int, default=0)
    p.add_argument('--reply', action='store_true')
    p.add_argument('--half-close', action='store_true')
    p.add_argument('--epoll', action='store_true')
    a = p.parse_args()
    return server(a) if a.role == 'server' else client(a)


if __name__ == '__main__':
    sys.exit(main())
