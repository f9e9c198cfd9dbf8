# Web agents: Debian's headless Chromium (every browser harness drives it by its executable path: no browser
# download is possible here), a font, and the system Python's venv module (browser-use gets its own venv over
# /usr/bin/python3, installed by `python -m harness_env.harnesses` in 40-harnesses.sh with the npm
# @playwright/mcp server). Idempotent: nothing is fetched when they are present.
hrl_web_need=()
[ -x /usr/lib/chromium/chromium ] || hrl_web_need+=(chromium)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || hrl_web_need+=(fonts-dejavu-core)
/usr/bin/python3 -c "import venv" 2>/dev/null || hrl_web_need+=(python3-venv)
if [ ${#hrl_web_need[@]} -gt 0 ]; then
  apt-get update -q
  apt-get install -y -q "${hrl_web_need[@]}"
fi
