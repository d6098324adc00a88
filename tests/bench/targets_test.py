#!/usr/bin/python3
"""bench/lib/report.targets on made-up results: each target row's PASS/FAIL
follows the ratio against its threshold, a missing measurement is SKIP,
never PASS, and the message-rate row fails when the rate falls as
messages shrink; the nginx row needs every connection on shm; summary.md's
convergence line flags exactly the latency rows whose halves moved > 5%."""
import copy
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "lib"))
import report as R  # noqa: E402

KINDS = ["tcp", "unix", "preload", "core"]


def results(pp=(20e3, 60e3, 2.2e6, 2.4e6), stream_64k=(2.5e9, 5e9, 11e9, 12e9), conn=(8000, 0, 8800, 0),
            msg_preload=None, pairs4=(100e3, 200e3), nginx=(1.6, 16, 16), verbs=(24e3, 29e3, 1650, 1694)):
    lat = [{"kind": k, "size": 64, "result": {"round_trips_per_s": v}} for k, v in zip(KINDS, pp)]
    cold = [{"kind": k, "rep": 0, "result": {"round_trips_per_s": v}} for k, v in zip(KINDS, (20e3, 60e3, 1.1e6, 1.2e6))]
    msg_preload = msg_preload or {1: 9e6, 4: 9e6, 16: 8.9e6, 64: 8.8e6}
    st = []
    for size, rate in msg_preload.items():
        st += [{"kind": "preload", "size": size, "result": {"msgs_per_s": rate, "bytes_per_s": rate * size}},
               {"kind": "tcp", "size": size, "result": {"msgs_per_s": 5e5, "bytes_per_s": 5e5 * size}}]
    st += [{"kind": k, "size": 65536, "result": {"bytes_per_s": v, "msgs_per_s": v / 65536}} for k, v in zip(KINDS, stream_64k)]
    busy = [{"kind": "tcp", "pairs": 4, "hogs": 0, "result": {"round_trips_per_s": pairs4[0]}},
            {"kind": "preload", "pairs": 4, "hogs": 0, "result": {"round_trips_per_s": pairs4[1]}}]
    return {
        "config": {"cold_iters": 20000, "msgrate_sizes": sorted(msg_preload), "memory_bytes": 1 << 30, "hold": 100},
        "machine": {"memcpy_bytes_per_s": 20e9, "cpus": 2},
        "sections": {
            "latency": {"rows": lat}, "cold_start": {"rows": cold}, "stream": {"rows": st},
            "connections": {"rows": [{"kind": k, "rep": 0, "result": {"connections_per_s": v}} for k, v in zip(KINDS, conn) if v]},
            "memory": {"rows": [{"kind": "tcp", "result": {"idle_conn_bytes": 0}},
                                {"kind": "preload", "result": {"idle_conn_bytes": 12288}}]},
            "descriptors": {"rows": [{"kind": k, "result": {"client_fds": c, "server_fds": c, "client_low_fds": c,
                                                            "server_low_fds": c}} for k, c in (("tcp", 103), ("preload", 103))]},
            "busy": {"rows": busy},
            "paced": {"rows": [{"kind": "preload", "fraction": 0.5, "rep": 0, "result": {"achieved_ratio": 0.97}}]},
            "servers": {"rows": [{"workload": "pgbench -S, 8 clients", "ratio": 1.4, "bg": "0.1"},
                                 {"workload": "redis GET, 50 clients", "ratio": 2.0, "bg": "0.1"},
                                 {"workload": "nginx 1 KiB, 16 keep-alive", "ratio": nginx[0], "bg": "0.1",
                                  "shm_conns": nginx[1], "conns": nginx[2]}]},
            "verbs": {"rows": [{"kind": k, "result": {"round_trips_per_s": v}}
                               for k, v in zip(("1guest:shim", "1guest:ibl", "2guests:auto", "2guests:tcp"), verbs)]},
        },
    }


def verdicts(res):
    return {t["figure"].split(" after ")[0]: t["verdict"] for t in R.targets(res)}


failures = []


def expect(res, figure, verdict, why):
    got = verdicts(res).get(figure)
    if got != verdict:
        failures.append(f"{why}: '{figure}' is {got}, expected {verdict}")


good = results()
for fig, v in [("64 B ping-pong, steady", "PASS"), ("64 B ping-pong, 20,000 iterations from a cold start", "PASS"),
               ("vs Unix domain sockets, 64 B ping-pong", "PASS"), ("64 KiB stream", "PASS"), ("64 B message rate", "PASS"),
               ("connections/s", "PASS"), ("memory per idle connection", "PASS"),
               ("descriptors per upgraded connection", "PASS"), ("pgbench -S, 8 clients", "PASS"),
               ("redis GET, 50 clients", "FAIL"), ("nginx + wrk, 16 keep-alive connections", "PASS"),
               ("4 ping-pong pairs on 2 cores", "PASS"), ("paced stream within 5% of target (rdmashim)", "PASS"),
               ("verbs 64 B ping-pong, one Soft-RoCE guest", "PASS"), ("across two Soft-RoCE guests, auto", "PASS")]:
    expect(good, fig, v, "good results")
if len(R.targets(good)) != 16:
    failures.append(f"{len(R.targets(good))} target rows, expected 16")

expect(results(pp=(20e3, 60e3, 1.9e6, 2.0e6)), "64 B ping-pong, steady", "FAIL", "95x TCP")
expect(results(pp=(20e3, 60e3, 2.2e6, 2.9e6)), "64 B ping-pong, steady", "FAIL", "0.76x the core API")
expect(results(pp=(20e3, 120e3, 2.2e6, 2.4e6)), "vs Unix domain sockets, 64 B ping-pong", "FAIL", "18x Unix")
expect(results(stream_64k=(3e9, 5e9, 11e9, 12e9)), "64 KiB stream", "FAIL", "3.7x TCP")
expect(results(stream_64k=(1e9, 5e9, 7e9, 12e9)), "64 KiB stream", "FAIL", "0.7x half memcpy")
expect(results(msg_preload={1: 6e6, 4: 9e6, 16: 9e6, 64: 9e6}), "64 B message rate", "FAIL", "the rate falls at 1 B")
expect(results(conn=(8000, 0, 7000, 0)), "connections/s", "FAIL", "0.875x TCP")
expect(results(pairs4=(100e3, 90e3)), "4 ping-pong pairs on 2 cores", "FAIL", "0.9x TCP")
expect(results(verbs=(16.5e3, 29e3, 1650, 1694)), "verbs 64 B ping-pong, one Soft-RoCE guest", "FAIL", "0.57x ib_write_lat")
expect(results(verbs=(24e3, 29e3, 650, 1694)), "across two Soft-RoCE guests, auto", "FAIL", "auto on verbs: 0.38x TCP")
expect(results(nginx=(1.4, 16, 16)), "nginx + wrk, 16 keep-alive connections", "FAIL", "nginx 1.4x TCP")
expect(results(nginx=(1.6, 0, 16)), "nginx + wrk, 16 keep-alive connections", "FAIL", "nginx faster but nothing on shm")
expect(results(nginx=(1.6, 12, 16)), "nginx + wrk, 16 keep-alive connections", "FAIL", "nginx: 4 connections on TCP")
bad_fds = results()
bad_fds["sections"]["descriptors"]["rows"][1]["result"]["server_fds"] = 403
expect(bad_fds, "descriptors per upgraded connection", "FAIL", "3 extra descriptors per connection")
missing = copy.deepcopy(good)
del missing["sections"]["latency"]
expect(missing, "64 B ping-pong, steady", "SKIP", "no latency section")
missing["sections"]["servers"] = {"rows": [], "skipped_reason": "--no-servers"}
expect(missing, "pgbench -S, 8 clients", "SKIP", "servers skipped")
missing["sections"]["verbs"] = {"rows": [], "skipped_reason": "not run"}
expect(missing, "verbs 64 B ping-pong, one Soft-RoCE guest", "SKIP", "verbs not run")
expect(missing, "nginx + wrk, 16 keep-alive connections", "SKIP", "servers skipped")
no_nginx = results()
no_nginx["sections"]["servers"]["rows"].pop()
expect(no_nginx, "nginx + wrk, 16 keep-alive connections", "SKIP", "no nginx row")

# Convergence: a latency row whose halves differ by more than 5% is flagged in summary.md.
conv = {"sections": {"latency": {"rows": [
    {"kind": "tcp", "size": 64, "result": {"half_change": 0.02, "converged": True}},
    {"kind": "preload", "size": 64, "result": {"half_change": -0.12, "converged": False}}]}}}
line = R.not_converged_line(conv)
if "NOT CONVERGED" not in line or "rdmashim (preload) (-12.0%)" not in line or "TCP" in line:
    failures.append(f"convergence: the unconverged row is not the one flagged: {line}")
conv["sections"]["latency"]["rows"].pop()
if "every row converged" not in R.not_converged_line(conv):
    failures.append(f"convergence: a converged run flagged: {R.not_converged_line(conv)}")

for f in failures:
    print("FAIL:", f)
print("ok: every target's verdict follows its threshold" if not failures else f"{len(failures)} wrong verdicts")
sys.exit(1 if failures else 0)
