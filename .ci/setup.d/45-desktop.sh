# Desktop tasks (harness_env/desktop, harness_env/tasks/desktop_family.py): a virtual X server, a window manager,
# the X tools the session drives it with, and the real applications of the family. Installed on the host: both
# sandboxes bind-mount the host's /usr read-only, so the same binaries run inside bwrap and docker.
#   xvfb: Xvfb (the X server, in memory)            openbox: a light window manager (focus, dialogs as windows)
#   xdotool: clicks, typing, key combos, window lookup   x11-apps: xwd (the screenshot's raw dump)
#   x11-utils: xprop (a non-openbox WM's readiness), xwininfo (debugging a session)
#   dbus: dbus-daemon, a private session bus per desktop (GTK apps register on one)
#   mousepad / galculator / pcmanfm / gnumeric: the apps (gnumeric: ~100 MiB peak RSS, ~1.2 s to its window here)
# --no-install-recommends: 62 packages, 134 MB on Debian 12 (measured).
# Idempotent: nothing is fetched when every command is present.
hrl_desktop_need=()
command -v Xvfb >/dev/null || hrl_desktop_need+=(xvfb)
command -v openbox >/dev/null || hrl_desktop_need+=(openbox)
command -v xdotool >/dev/null || hrl_desktop_need+=(xdotool)
command -v xwd >/dev/null || hrl_desktop_need+=(x11-apps)
command -v xprop >/dev/null || hrl_desktop_need+=(x11-utils)
command -v dbus-daemon >/dev/null || hrl_desktop_need+=(dbus)
command -v mousepad >/dev/null || hrl_desktop_need+=(mousepad)
command -v galculator >/dev/null || hrl_desktop_need+=(galculator)
command -v pcmanfm >/dev/null || hrl_desktop_need+=(pcmanfm)
command -v gnumeric >/dev/null || hrl_desktop_need+=(gnumeric)
if [ ${#hrl_desktop_need[@]} -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${hrl_desktop_need[@]}"
fi
