"""Runs INSIDE a sandbox (stdlib only, python3 -I -S): exposes the shim's Unix socket as a loopback port.

The sandbox has no network (its own empty net namespace / docker network_mode=none), so the only
address the harness can reach is 127.0.0.1:PORT, which this process forwards, byte for byte, to the
shim's Unix socket bind-mounted into the sandbox. `--forward PORT=SOCKET` (repeatable) adds more such
ports: a task's web app, which runs in a sandbox of its own (harness_env/web/env.py), appears on
127.0.0.1:PORT. `--listen-unix PATH --socket HOST:PORT` is the reverse, used inside that app's sandbox:
its Unix socket (bind-mounted out) forwards to the app's loopback TCP port. With a command after `--`
it binds first, then runs the command as its child and exits with the child's status (so the ports are
up before the harness starts); without one it serves until killed (the docker container's main process).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading

READY = "hrl-forwarder: listening"


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _upstream(target: str) -> socket.socket:
    """`/path` -> the Unix socket; `host:port` -> TCP (kubernetes: the shim's service, via NetworkPolicy)."""
    if target.startswith("/"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(target)
        return s
    host, _, port = target.rpartition(":")
    return socket.create_connection((host, int(port)))


def _handle(conn: socket.socket, target: str) -> None:
    try:
        up = _upstream(target)
    except OSError:
        conn.close()
        return
    t = threading.Thread(target=_pump, args=(up, conn), daemon=True)
    t.start()
    _pump(conn, up)
    t.join()
    conn.close()
    up.close()


def _serve(lsock: socket.socket, target: str) -> None:
    while True:
        try:
            conn, _ = lsock.accept()
        except OSError:
            return
        threading.Thread(target=_handle, args=(conn, target), daemon=True).start()


def _listen(where: int | str) -> socket.socket:
    """A listening socket: a loopback TCP port, or a Unix socket path (replacing a stale file)."""
    if isinstance(where, str):
        if os.path.exists(where):
            os.unlink(where)
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(where)
        os.chmod(where, 0o666)  # another sandbox's uid 1000 connects to it
    else:
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(("127.0.0.1", where))
    lsock.listen(128)
    return lsock


def main(argv: list[str]) -> int:
    cmd: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, help="loopback port for --socket")
    p.add_argument("--socket", help="shim Unix socket path, or host:port for a TCP upstream")
    p.add_argument("--forward", action="append", default=[], metavar="PORT=TARGET", help="another loopback port")
    p.add_argument("--listen-unix", help="listen on this Unix socket (instead of --port) and forward to --socket")
    args = p.parse_args(argv)
    if not cmd:  # as PID 1 (docker) SIGTERM has no default action: wait for it explicitly
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    routes: list[tuple[int | str, str]] = [(int(port), target) for port, _, target in
                                           (f.partition("=") for f in args.forward)]
    if args.socket is not None:
        routes.insert(0, (args.listen_unix or args.port, args.socket))
    for listen, target in routes:
        threading.Thread(target=_serve, args=(_listen(listen), target), daemon=True).start()
    if not cmd:
        print(READY, flush=True)  # the docker backend waits for this line before the first exec
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
        return 0
    try:
        child = subprocess.Popen(cmd)
    except OSError as e:
        print(f"forwarder: cannot run {cmd[0]!r}: {e}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    rc = child.wait()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv[1:]))
