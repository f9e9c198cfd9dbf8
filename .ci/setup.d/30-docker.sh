# Docker engine for the docker sandbox tests: our own dockerd (own socket, data-root, no bridge, no
# iptables: containers run with network_mode=none and reach only the shim through a Unix socket),
# stopped by PID at exit; then the local sandbox image is built offline if missing.
#
# Runtime state (pid files, the managed containerd's socket) lives in a fresh directory per run: a
# run killed before its cleanup leaves pid files behind, and once their pid is reused by another
# process dockerd takes it for a live containerd and waits on a socket nobody serves (a CI run
# failed that way). The image store (data-root) is kept across runs; only state is per run.
HRL_DOCKER_SOCK=/run/harness-rl-docker.sock
HRL_DOCKER_ROOT=/var/lib/harness-rl-docker
export DOCKER_HOST="unix://$HRL_DOCKER_SOCK"
if ! docker info >/dev/null 2>&1; then
  # a daemon of ours left from a killed run still holds the data-root: stop it (by its command line)
  pkill -f -- "--data-root $HRL_DOCKER_ROOT" && sleep 2 || true
  rm -f "$HRL_DOCKER_SOCK"
  HRL_DOCKER_EXEC=$(mktemp -d /run/harness-rl-docker-exec.XXXXXX)
  dockerd --iptables=false --ip6tables=false --bridge=none --data-root "$HRL_DOCKER_ROOT" \
    --exec-root "$HRL_DOCKER_EXEC" --pidfile "$HRL_DOCKER_EXEC/dockerd.pid" \
    -H "$DOCKER_HOST" >/tmp/harness-rl-dockerd.log 2>&1 &
  HRL_DOCKERD_PID=$!
  CLEANUP+=("kill $HRL_DOCKERD_PID; wait $HRL_DOCKERD_PID 2>/dev/null; rm -rf $HRL_DOCKER_EXEC 2>/dev/null")
  for _ in $(seq 1 300); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  # the docker tests are part of CI: a daemon that does not start fails the run (it must not turn into skips)
  docker info >/dev/null 2>&1 || { echo "dockerd did not start:"; tail -20 /tmp/harness-rl-dockerd.log; exit 1; }
fi
python -m harness_env.images.build --if-missing
