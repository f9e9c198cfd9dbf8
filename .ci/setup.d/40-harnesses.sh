# Agent harness CLIs (Claude Code, Codex, opencode, OpenClaw + Node 24; @playwright/mcp) from npm, pinned, into a cache
# outside the repo (/opt/harness-rl/npm, override with HARNESS_RL_NPM_ROOT). Idempotent: each package is
# skipped when already installed, so on this machine the step takes ~1 s after the first run. PyPI harnesses
# (browser-use) get a pinned venv each under /opt/harness-rl/pypi (HARNESS_RL_PYPI_ROOT) the same way.
# strace: the harness tests prove (connect tracing) that a harness talks to its endpoint only.
hrl_need=()
command -v npm >/dev/null || hrl_need+=(nodejs npm)
command -v strace >/dev/null || hrl_need+=(strace)
if [ ${#hrl_need[@]} -gt 0 ]; then
  apt-get update -q
  apt-get install -y -q "${hrl_need[@]}"
fi
python -m harness_env.harnesses
