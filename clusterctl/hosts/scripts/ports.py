"""A port on this host, for serve (serve/service.py), one JSON line:

    python -c PROGRAM free                  {"port": N}: one nothing listens on in the loopback (rank 0 binds it)
    python -c PROGRAM check ADDRESS PORT    {"free": true}, or {"why": the errno's name, or UNRESOLVED, "said"}

Standard library only."""
import errno
import socket
import sys

from .contract import UNRESOLVED, reply


def free():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return {"port": s.getsockname()[1]}


def check(address, port):
    try:
        socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET).bind((address, port))
    except socket.gaierror as e:
        return {"why": UNRESOLVED, "said": e.strerror}
    except OSError as e:
        return {"why": errno.errorcode.get(e.errno, "OTHER"), "said": e.strerror}
    return {"free": True}


if __name__ == "__main__":
    reply(free() if sys.argv[1] == "free" else check(sys.argv[2], int(sys.argv[3])))
