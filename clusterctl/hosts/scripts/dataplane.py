"""The TCP data-plane check, run on every host at once: listen on this host's data-plane address and ring
port, connect to every peer's, report what worked as one JSON line. argv[1] is JSON: [me, address, port,
budget_s, [[peer, address, port], ...]]. The connecting side closes first, so TIME_WAIT never holds the
ring port that MLX will listen on next (docs/facts/launchers.md#mlx-launch-ring-ports)."""
import socket
import sys
import threading
import time

from .contract import read_request, reply


def check(me, addr, port, budget, peers):
    deadline = time.monotonic() + budget
    out = {"key": "dataplane", "address": addr, "port": port, "bind": None, "connect": {}, "accepted": []}
    srv = None
    try:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((addr, port))
        srv.listen(64)
        srv.settimeout(0.1)
    except OSError as e:
        out["bind"] = str(e)
        srv = None

    def accept():
        while srv is not None and time.monotonic() < deadline and len(out["accepted"]) < len(peers):
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            c.settimeout(2)
            data = b""
            try:
                while not data.endswith(b"\n"):
                    chunk = c.recv(256)
                    if not chunk:
                        break
                    data += chunk
                c.recv(1)
            except OSError:
                pass
            c.close()
            out["accepted"].append(data.decode(errors="replace").strip())

    def connect(name, paddr, pport):
        last, t0 = "no attempt", time.monotonic()
        while time.monotonic() < deadline:
            try:
                s = socket.create_connection((paddr, pport), timeout=max(0.1, min(2.0, deadline - time.monotonic())))
                s.sendall((me + "\n").encode())
                s.close()
                out["connect"][name] = {"ok": True, "ms": round((time.monotonic() - t0) * 1000, 1)}
                return
            except OSError as e:
                last = str(e)
                time.sleep(0.05)
        out["connect"][name] = {"ok": False, "error": last}

    threads = [threading.Thread(target=accept)] + [threading.Thread(target=connect, args=tuple(p)) for p in peers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if srv is not None:
        srv.close()
    return out


if __name__ == "__main__":
    reply(check(*read_request(sys.argv[1])))
