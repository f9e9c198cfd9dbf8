# Agent harness CLIs (Claude Code, Codex, opencode, OpenClaw + Node 24) from npm, pinned, into a cache
# outside the repo (/opt/harness-rl/npm, override with HARNESS_RL_NPM_ROOT). Idempotent: each package is
# skipped when already installed, so on this machine the step takes ~1 s after the first run.
if ! command -v npm >/dev/null; then
  apt-get update -q
  apt-get install -y -q nodejs npm
fi
python -m harness_env.harnesses
