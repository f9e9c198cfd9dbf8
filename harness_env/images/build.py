"""Builds the local docker sandbox image offline: `python -m harness_env.images.build [--if-missing]`.

No registry is reachable, so the image is a `docker import` of a tiny rootfs made here: the
directory skeleton, merged-/usr symlinks (/bin -> usr/bin, ...), an `agent` user (uid 1000) and
mount points. The container bind-mounts the host's /usr (and a few /etc files) read-only at run
time, so the image is a few KB, builds in well under a second, and has exactly the host's tools
(python3, bash, coreutils, node when installed under /usr). Reproducible: same bytes every build.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile

IMAGE = "harness-rl/sandbox:latest"
OUR_SOCKET = "/run/harness-rl-docker.sock"  # the dockerd that .ci/setup.d/30-docker.sh starts
DIRS = ("usr", "etc", "tmp", "workspace", "home", "home/agent", "run", "run/hrl", "opt", "opt/hrl", "proc", "dev",
        "sys", "root", "var", "var/tmp", "reward")
LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64", "sbin": "usr/sbin"}
FILES = {
    "etc/passwd": "root:x:0:0::/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/bash\n",
    "etc/group": "root:x:0:\nagent:x:1000:\n",
    "etc/hosts": "127.0.0.1 localhost\n::1 localhost\n",
}
AGENT_OWNED = ("workspace", "home/agent", "reward", "tmp", "var/tmp")


def rootfs_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in DIRS:
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o1777 if d in ("tmp", "var/tmp") else 0o755
            if d in AGENT_OWNED:
                ti.uid = ti.gid = 1000
            tar.addfile(ti)
        for name, target in LINKS.items():
            ti = tarfile.TarInfo(name)
            ti.type, ti.linkname = tarfile.SYMTYPE, target
            tar.addfile(ti)
        for name, text in FILES.items():
            data = text.encode()
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def docker_client():
    """A client of our dockerd when it runs (else DOCKER_HOST / the default socket). Here, below the docker
    backend that also uses it: this module's `main` needs it too, and the backend imports this module."""
    import docker  # the SDK is slow to import: only where a client is made

    if "DOCKER_HOST" not in os.environ and os.path.exists(OUR_SOCKET):
        return docker.DockerClient(base_url=f"unix://{OUR_SOCKET}")
    return docker.from_env()


def build(client, image: str = IMAGE, if_missing: bool = False) -> str:
    """Imports the rootfs as `image`; returns its id. `client` is a docker.DockerClient."""
    import docker.errors

    if if_missing:
        try:
            return client.images.get(image).id
        except docker.errors.ImageNotFound:
            pass
    repo, _, tag = image.rpartition(":")
    client.api.import_image_from_data(rootfs_tar(), repository=repo, tag=tag,
                                      changes=['LABEL harness-rl.image="sandbox"', "WORKDIR /workspace"])
    return client.images.get(image).id


def main(argv: list[str]) -> int:
    image_id = build(docker_client(), if_missing="--if-missing" in argv)
    print(f"{IMAGE} {image_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
