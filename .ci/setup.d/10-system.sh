# System packages: bubblewrap (the default sandbox), docker.io (docker sandbox), debootstrap, g++ (the engine's
# CPU decode kernels, research/serving/cpu_kernels/kernels.cc, built in 20-python.sh).
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v g++ >/dev/null || need+=(g++)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q
  apt-get install -y -q "${need[@]}"
fi
