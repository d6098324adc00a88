#!/usr/bin/env python3
"""Peers for the buffering tests (run_buffering.sh), each started under
`rdmashim run`:

  server PORTFILE echo|sink     asyncio server: echo 64 KiB at a time with
                                drain(), or read everything and answer one
                                byte per MiB received
  echo PORT BYTES               asyncio client: write BYTES, await drain(),
                                then read the echo; checks it byte-exact
  many PORT CONNS BYTES         CONNS connections, each writes BYTES and gets
                                its answer, twice (the second time on the
                                ring); then, all idle, sleeps in select()
                                and prints the ring memory (memfd blocks) this
                                process holds, as JSON
  fill_server PORTFILE GOFILE read|write
  fill PORT GOFILE read|write SNDBUF
                                one connection whose client set SO_SNDBUF
                                (SO_SNDBUFFORCE, root) before connecting;
                                after the server's greeting the writing
                                side ("read": the client) writes without
                                blocking until 300 ms pass without progress
                                and prints {"buffered": N}, the other reads
                                nothing until GOFILE exists, then reads to
                                EOF and prints {"received": N}
"""
import asyncio, hashlib, json, os, select, socket, sys, time

# The address to listen on and connect to (the Soft-RoCE guest passes its
# eth0 address, the one its RoCE GID carries).
HOST = os.environ.get("PEERS_HOST", "127.0.0.1")


def publish_port(portfile, port):
    with open(portfile + ".tmp", "w") as f:
        f.write(str(port))
    os.rename(portfile + ".tmp", portfile)  # whole, for the script polling it


async def serve(portfile, mode):
    async def echo(reader, writer):
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.close()

    async def sink(reader, writer):
        got = 0
        while True:
            data = await reader.read(1 << 20)
            if not data:
                break
            before, got = got, got + len(data)
            for _ in range(got // (1 << 20) - before // (1 << 20)):
                writer.write(b"k")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo if mode == "echo" else sink, HOST, 0)
    publish_port(portfile, server.sockets[0].getsockname()[1])
    async with server:
        await server.serve_forever()


async def echo_client(port, size):
    reader, writer = await asyncio.open_connection(HOST, port)
    payload = os.urandom(size)
    writer.write(payload)
    await writer.drain()
    got = await reader.readexactly(size)
    writer.close()
    ok = hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
    print(json.dumps({"bytes": size, "exact": ok}))
    return 0 if ok else 1


def ring_bytes():
    # The ring memfds, through the descriptor or, once rdmashim closed it
    # (mapped, socket close-on-exec), through the mapping (root: map_files).
    total, seen, paths = 0, set(), []
    for name in os.listdir("/proc/self/fd"):
        paths.append("/proc/self/fd/" + name)
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/memfd:rdmashim-ring" in line:
                paths.append("/proc/self/map_files/" + line.split()[0])
    for path in paths:
        try:
            if os.readlink(path).startswith("/memfd:rdmashim-ring"):
                st = os.stat(path)
                if st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
        except OSError:
            pass
    return total


def many(port, conns, size):
    socks, chunk = [], b"x" * (1 << 20)
    for _ in range(conns):
        s = socket.create_connection((HOST, port))
        # Twice: what a client writes before the handshake's answer travels
        # framed over TCP; the second round is on the ring.
        for _ in range(2):
            left = size
            while left > 0:
                n = s.send(chunk[: min(left, len(chunk))])
                left -= n
            need = max(1, size >> 20)
            got = b""
            while len(got) < need:
                got += s.recv(need - len(got))
        socks.append(s)
    busy = ring_bytes()
    # Idle: sleeping in select() on the connections (our hook) lets the rings
    # give their pages back; the rate limit may take one more wakeup.
    deadline = time.time() + 1.0
    while time.time() < deadline:
        select.select(socks[:64], [], [], 0.3)
    print(json.dumps({"conns": conns, "bytes_each": size, "ring_bytes_right_after": busy,
                      "ring_bytes_idle": ring_bytes()}))
    for s in socks:
        s.close()
    return 0


SO_SNDBUFFORCE = 32


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.01)


def flood(sock):
    # Non-blocking writes until the buffers are full: no progress for 300 ms.
    sock.setblocking(False)
    chunk, total, last = b"f" * (1 << 20), 0, time.time()
    while time.time() - last < 0.3:
        try:
            total += sock.send(chunk)
            last = time.time()
        except BlockingIOError:
            time.sleep(0.01)
    sock.setblocking(True)
    print(json.dumps({"buffered": total}), flush=True)


def drain(sock):
    total = 0
    while True:
        data = sock.recv(1 << 20)
        if not data:
            break
        if data.strip(b"f"):
            raise SystemExit("unexpected bytes")
        total += len(data)
    print(json.dumps({"received": total}), flush=True)


def accept_greeted(portfile):
    """One connection on a published port, greeted with "g" (the server speaks first)."""
    ls = socket.socket()
    ls.bind((HOST, 0))
    ls.listen(1)
    publish_port(portfile, ls.getsockname()[1])
    conn, _ = ls.accept()
    conn.sendall(b"g")
    return conn


def fill_server(portfile, gofile, mode):
    conn = accept_greeted(portfile)
    if mode == "write":
        conn.recv(1)  # the client is there and reads no more
        flood(conn)
        wait_for(gofile)
    else:
        wait_for(gofile)
        drain(conn)
    conn.close()
    return 0


def fill_client(port, gofile, mode, sndbuf):
    s = socket.socket()
    try:
        if sndbuf:
            s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, sndbuf)
    except PermissionError:
        print("SO_SNDBUFFORCE needs CAP_NET_ADMIN", file=sys.stderr)
        return 77
    s.connect((HOST, port))
    if s.recv(1) != b"g":
        return 1
    if mode == "write":
        s.sendall(b"r")
        wait_for(gofile)
        drain(s)
    else:
        flood(s)
        wait_for(gofile)
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # the server's EOF
    s.close()
    return 0


def main():
    cmd = sys.argv[1]
    if cmd == "server":
        asyncio.run(serve(sys.argv[2], sys.argv[3]))
        return 0
    if cmd == "echo":
        return asyncio.run(echo_client(int(sys.argv[2]), int(sys.argv[3])))
    if cmd == "many":
        return many(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    if cmd == "fill_server":
        return fill_server(sys.argv[2], sys.argv[3], sys.argv[4])
    if cmd == "fill":
        return fill_client(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
