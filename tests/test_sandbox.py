"""Isolation acceptance tests, for bwrap and (marked `docker`) the docker backend: host files, network,
reward files, fork bomb, memory hog, wall-clock tree kill, and clean-up after kill -9 of the owner."""
import asyncio
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from harness_env.sandbox import LABEL, Limits, SandboxSpec, get_backend
from harness_env.sandbox.reaper import STATE_DIR

REPO = pathlib.Path(__file__).resolve().parents[1]
BACKENDS = ["bwrap", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(params=BACKENDS)
def backend(request):
    b = get_backend(request.param)
    ok, why = b.available()
    if not ok:
        pytest.skip(why)
    return b


def _procs_with_argv(argv: list[str]) -> list[int]:
    out = []
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "cmdline").read_bytes().split(b"\0")[:-1] == [a.encode() for a in argv]:
                    out.append(int(p.name))
            except OSError:
                pass
    return out


def _run(coro):
    return asyncio.run(coro)


async def _with_sandbox(backend, tmp_path, fn, **spec_kw):
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    spec = SandboxSpec(workspace=ws, home=tmp_path / "home", name="test", **spec_kw)
    async with await backend.create(spec) as sbx:
        return await fn(sbx)


def test_host_files_outside_the_workspace_are_invisible(backend, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "mine.txt").write_text("mine")

    async def go(sbx):
        return [await sbx.exec(argv) for argv in (["cat", str(secret)], ["cat", "/etc/shadow"],
                                                  ["sh", "-c", "ls -a /root /home; cat /proc/1/environ"],
                                                  ["cat", "mine.txt"], ["id", "-u"])]

    leak, shadow, listing, mine, uid = _run(_with_sandbox(backend, tmp_path, go))
    assert leak.exit_code != 0 and "TOP SECRET" not in leak.stdout
    assert shadow.exit_code != 0
    assert "TOP SECRET" not in listing.stdout and ".bashrc" not in listing.stdout
    assert mine.stdout == "mine"
    assert uid.stdout.strip() == "1000"  # not root inside


def test_network_reaches_the_shim_and_nothing_else(backend, tmp_path):
    host_srv = socket.create_server(("0.0.0.0", 0))
    host_port = host_srv.getsockname()[1]
    host_ip = socket.gethostbyname(socket.gethostname())
    probe = textwrap.dedent(f"""
        import socket
        def tcp(host, port):
            try:
                s = socket.create_connection((host, port), timeout=2)
                s.sendall(b"ping"); s.shutdown(socket.SHUT_WR)
                return s.recv(100).decode() or "connected"
            except OSError as e:
                return type(e).__name__
        print("shim", tcp("127.0.0.1", 18080))
        print("host_ip", tcp("{host_ip}", {host_port}))
        print("host_lo", tcp("127.0.0.1", {host_port}))
        print("public", tcp("1.1.1.1", 443))
        try:
            socket.getaddrinfo("pypi.org", 443); print("dns ok")
        except OSError as e:
            print("dns", type(e).__name__)
    """)

    async def go(sbx):
        return await sbx.exec(["python3", "-c", probe])

    async def main():
        async def echo(r, w):
            w.write(b"pong:" + await r.read(100))
            await w.drain()
            w.close()

        srv = await asyncio.start_unix_server(echo, path=str(tmp_path / "shim.sock"))
        async with srv:
            return await _with_sandbox(backend, tmp_path, go, shim_socket=tmp_path / "shim.sock")

    try:
        res = _run(main())
    finally:
        host_srv.close()
    lines = dict(line.split(" ", 1) for line in res.stdout.strip().splitlines())
    assert lines["shim"] == "pong:ping", res
    for k in ("host_ip", "host_lo", "public"):
        assert lines[k] in ("OSError", "ConnectionRefusedError", "TimeoutError", "timeout"), (k, lines[k])
    assert lines["dns"] != "ok"


def test_reward_files_are_visible_only_after_copy_in(backend, tmp_path):
    reward = tmp_path / "reward"
    reward.mkdir()
    (reward / "reward.sh").write_text("echo 1.0\n")

    async def go(sbx):
        before = await sbx.exec(["sh", "-c", "cat /reward/reward.sh; find / -name reward.sh 2>/dev/null"])
        await sbx.copy_in(reward, "/reward")
        after = await sbx.exec(["bash", "/reward/reward.sh"])
        return before, after

    before, after = _run(_with_sandbox(backend, tmp_path, go))
    assert "echo" not in before.stdout and "reward.sh" not in before.stdout
    assert after.stdout.strip() == "1.0"


def test_fork_bomb_is_stopped_by_the_pids_limit(backend, tmp_path):
    counter = textwrap.dedent("""
        import os, time
        n = 0
        try:
            while n < 5000:
                if os.fork() == 0:
                    time.sleep(20); os._exit(0)
                n += 1
        except OSError:
            pass
        print(n)
    """)

    async def go(sbx):
        forks = await sbx.exec(["python3", "-c", counter], timeout=30)
        alive = await sbx.exec(["echo", "alive"])
        bomb = await sbx.exec(["bash", "-c", "b(){ b | b & }; b; sleep 2; echo survived"], timeout=8)
        return forks, alive, bomb

    forks, alive, bomb = _run(_with_sandbox(backend, tmp_path, go, limits=Limits(pids=64, memory_mb=512)))
    assert 0 < int(forks.stdout.strip()) < 64, forks  # fork() starts failing at the limit
    assert alive.stdout.strip() == "alive"  # the forked children did not take the sandbox down
    # The classic bomb: bwrap's exec ends with its pid namespace; docker's background bombs keep the
    # exec open until the wall-clock limit kills the container. Either way it is over, and quickly. With the
    # counter's children still holding the pids, docker's runtime may not even get to start the bomb (runc's
    # init is a Go process whose threads count against the limit): "exec failed", also the limit at work.
    assert bomb.timed_out or "survived" in bomb.stdout or "exec failed" in bomb.stdout, bomb
    assert _procs_with_argv(["bash", "-c", "b(){ b | b & }; b; sleep 2; echo survived"]) == []


def test_memory_hog_is_killed_by_the_memory_limit(backend, tmp_path):
    async def go(sbx):
        return await sbx.exec(["python3", "-c", "x = bytearray(1 << 30); x[::4096] = b'1' * len(x[::4096])"],
                              timeout=60)

    res = _run(_with_sandbox(backend, tmp_path, go, limits=Limits(memory_mb=256)))
    assert res.exit_code in (137, -9) and res.oom_killed, res


def test_cpu_limit_throttles_a_busy_loop(backend, tmp_path):
    """0.2 CPUs: ~1.5 s of wall-clock busy looping gets ~0.3 s of CPU (unthrottled it would be ~1.5 s)."""
    busy = ("import time; t = time.time()\nwhile time.time() - t < 1.5: pass\n"
            "print(time.process_time())")

    async def go(sbx):
        return await sbx.exec(["python3", "-c", busy], timeout=30)

    res = _run(_with_sandbox(backend, tmp_path, go, limits=Limits(cpus=0.2)))
    assert res.exit_code == 0, res
    assert float(res.stdout) < 0.45, res.stdout  # quota: at most 0.2 x 1.5 s = 0.3 s, plus start-up


def test_wall_clock_limit_kills_the_whole_process_tree(backend, tmp_path):
    async def go(sbx):
        return await sbx.exec(["sh", "-c", "sleep 311 & (sleep 311 &) ; setsid sleep 311 & sleep 311"], timeout=1.0)

    t0 = time.monotonic()
    res = _run(_with_sandbox(backend, tmp_path, go))
    assert res.timed_out and time.monotonic() - t0 < 150  # the tree sleeps 311 s: the 1 s limit ended it
    deadline = time.monotonic() + 5
    while _procs_with_argv(["sleep", "311"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with_argv(["sleep", "311"]) == []


ORPHAN = textwrap.dedent("""
    # A real runner (bwrap/docker sandbox, harness that hangs in `sleep 317`), killed -9 by the test.
    import asyncio, pathlib, sys, types
    from harness_env.harnesses.base import Harness, HarnessOutcome, register
    from harness_env.runner import Runner, RunnerConfig, plan
    from harness_env.tasks import family

    @register
    class Sleeper(Harness):
        name, api = "test_sleeper", "openai_chat"
        def argv(self, prompt, ctx):
            return ["sleep", "317"]
        def parse_output(self, r):
            return HarnessOutcome(completed=False, exit_code=r.exit_code)

    class NoShim:  # the gateway a runner needs; no model is ever called
        unix_socket = None
        async def open_session(self, rollout_id, group_id, harness, meta=None):
            return types.SimpleNamespace(session_id="s", api_key="k", base_url="http://127.0.0.1:1/s/s")
        async def close_session(self, session_id):
            return []

    root = pathlib.Path(sys.argv[2])
    task = family.write_task(root / "tasks", "notes.txt", "apple")
    runner = Runner(RunnerConfig(out_dir=root / "run", backend=sys.argv[1], progress=False), NoShim())
    asyncio.run(runner.run(plan([task], ["test_sleeper"], 1)))
""")



def test_kill_9_of_the_owner_leaves_no_orphans_after_the_next_start(backend, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN, backend.name, str(tmp_path)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 30
    while not _procs_with_argv(["sleep", "317"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with_argv(["sleep", "317"]), "the sandboxed process never started"
    sids = _our_sandboxes(backend, proc.pid)
    assert len(sids) == 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    reaped = _run(get_backend(backend.name).reap())  # what the next start of any orchestrator does
    assert reaped >= 1
    deadline = time.monotonic() + 10
    while _procs_with_argv(["sleep", "317"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with_argv(["sleep", "317"]) == []
    assert _our_sandboxes(backend, proc.pid) == []
    # ... and the rollout's disk-capped workspace/HOME mounts were detached too
    assert not [m for m in _mount_points() if str(tmp_path) in m]
    if backend.name == "bwrap":
        assert not any(pathlib.Path("/sys/fs/cgroup").glob(f"*/harness-rl.sandbox/{sids[0]}"))


def _mount_points() -> list[str]:
    return [line.split()[4] for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines()]


def _our_sandboxes(backend, owner_pid: int) -> list[str]:
    """Sandboxes (bwrap state dirs / docker containers) whose recorded owner is `owner_pid`."""
    if backend.name == "bwrap":
        out = []
        for d in STATE_DIR.iterdir() if STATE_DIR.is_dir() else []:
            try:
                if json.loads((d / "owner.json").read_text())["owner"]["pid"] == owner_pid:
                    out.append(d.name)
            except (OSError, ValueError, KeyError):
                pass
        return out
    return [c.name.removeprefix("hrl-") for c in backend.client.containers.list(all=True, filters={"label": LABEL})
            if json.loads(c.labels.get(f"{LABEL}.owner", "{}")).get("pid") == owner_pid]


def test_forwarder_tcp_upstream_mode_and_exit_status(tmp_path):
    """The kubernetes mode (TCP upstream); also: the port is up before the command starts, and the
    command's exit status is the forwarder's."""
    from harness_env.sandbox.base import FORWARDER_HOST

    up = socket.create_server(("127.0.0.1", 0))
    port = up.getsockname()[1]

    def serve():
        conn, _ = up.accept()
        conn.sendall(b"hello:" + conn.recv(10))
        conn.close()

    import threading

    threading.Thread(target=serve, daemon=True).start()
    inner = socket.socket()
    inner.bind(("127.0.0.1", 0))
    inner_port = inner.getsockname()[1]
    inner.close()
    client = (f"import socket, sys; s = socket.create_connection(('127.0.0.1', {inner_port})); s.sendall(b'x'); "
              "print(s.recv(20).decode()); sys.exit(7)")
    out = subprocess.run([sys.executable, "-I", "-S", str(FORWARDER_HOST), "--port", str(inner_port),
                          "--socket", f"127.0.0.1:{port}", "--", sys.executable, "-c", client],
                         capture_output=True, text=True, timeout=30)
    up.close()
    assert out.returncode == 7 and out.stdout.strip() == "hello:x", out


def test_docker_container_config_without_a_daemon(tmp_path):
    from harness_env.sandbox import Mount
    from harness_env.sandbox.docker_sandbox import DockerBackend

    spec = SandboxSpec(workspace=tmp_path / "ws", home=tmp_path / "home", shim_socket=tmp_path / "s.sock",
                       limits=Limits(cpus=1.5, memory_mb=700, pids=99), mounts=[Mount("/opt/x", "/opt/x")],
                       labels={"harness-rl.rollout": "r"})
    kw = DockerBackend(client=object(), reap=False, build_if_missing=False).run_kwargs("sid", spec)
    assert kw["network_mode"] == "none" and kw["user"] == "1000:1000" and kw["cap_drop"] == ["ALL"]
    assert (kw["mem_limit"], kw["memswap_limit"], kw["pids_limit"], kw["nano_cpus"]) == ("700m", "700m", 99, 1.5e9)
    assert kw["labels"]["harness-rl.sandbox"] == "1" and kw["labels"]["harness-rl.rollout"] == "r"
    targets = {m["Target"]: m for m in kw["mounts"]}
    assert targets["/usr"]["ReadOnly"] and targets["/opt/x"]["ReadOnly"] and not targets["/workspace"]["ReadOnly"]
    assert targets["/run/hrl/shim.sock"]["Source"] == str(tmp_path / "s.sock")
    assert kw["command"][:4] == ["/usr/bin/python3", "-I", "-S", "/opt/hrl/forwarder.py"]


def test_rlimit_fallback_caps_memory_without_cgroups(tmp_path):
    """Hosts without writable cgroups: RLIMIT_AS stops the memory hog (MemoryError instead of the OOM killer)."""
    from harness_env.sandbox.bwrap import BwrapBackend

    b = BwrapBackend(mode="rlimit")
    if not b.available()[0]:
        pytest.skip("no bwrap")

    async def go(sbx):
        hog = await sbx.exec(["python3", "-c", "x = bytearray(1 << 30)"], timeout=30)
        ok = await sbx.exec(["python3", "-c", "x = bytearray(1 << 20); print('small ok')"], timeout=30)
        return sbx, hog, ok

    sbx, hog, ok = _run(_with_sandbox(b, tmp_path, go, limits=Limits(memory_mb=256)))
    assert hog.exit_code != 0 and "MemoryError" in hog.stderr, hog
    assert ok.stdout.strip() == "small ok"
    assert sbx.cgroup.dirs == [] and not list(pathlib.Path("/sys/fs/cgroup").glob(f"*/{LABEL}/{sbx.id}"))


def test_stdin_env_cwd_and_copy_in_a_file(backend, tmp_path):
    (tmp_path / "ws" / "sub").mkdir(parents=True)
    (tmp_path / "note.txt").write_text("copied")

    async def go(sbx):
        a = await sbx.exec(["sh", "-c", "cat; echo \" $FOO $(pwd) $HOME\""], stdin=b"piped", env={"FOO": "bar"},
                           cwd="/workspace/sub")
        await sbx.copy_in(tmp_path / "note.txt", "/workspace/sub/note.txt")
        await sbx.copy_in(tmp_path / "note.txt", "/opt/extra/note.txt")
        b = await sbx.exec(["cat", "sub/note.txt", "/opt/extra/note.txt"])
        return a, b

    a, b = _run(_with_sandbox(backend, tmp_path, go))
    assert a.stdout.strip() == "piped bar /workspace/sub /home/agent", a
    assert b.stdout == "copiedcopied" and (tmp_path / "ws" / "sub" / "note.txt").read_text() == "copied"


def test_close_during_an_exec_ends_it_as_killed_not_as_an_error(backend, tmp_path):
    """An owner's teardown can close a sandbox while an exec still runs there (a web app's server, a tool
    call): the exec ends as killed, an ExecResult, never a raw backend error (docker: the container is gone
    by the time the exec's exit status is inspected)."""
    deadline = time.monotonic() + 30

    async def go():
        ws = tmp_path / "ws"
        ws.mkdir()
        sbx = await backend.create(SandboxSpec(workspace=ws, home=tmp_path / "home", name="test"))
        if backend.name == "docker":  # the teardown wins the race: the container is gone before the exit status is read
            api, real = backend.client.api, backend.client.api.exec_inspect

            def late(exec_id):
                while time.monotonic() < deadline:
                    try:
                        backend.client.containers.get(sbx.container.id)
                    except Exception:  # docker.errors.NotFound: removed
                        break
                    time.sleep(0.05)
                return real(exec_id)

            api.exec_inspect = late
        run = asyncio.ensure_future(sbx.exec(["sleep", "313"], timeout=120))
        while not _procs_with_argv(["sleep", "313"]) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await sbx.close()
        return await asyncio.wait_for(run, 30)

    try:
        res = _run(go())
    finally:
        if backend.name == "docker":
            vars(backend.client.api).pop("exec_inspect", None)
    assert res.exit_code != 0 and not res.timed_out, res
    assert _procs_with_argv(["sleep", "313"]) == []
