"""Desktop tasks: a per-task X desktop (Xvfb, a window manager, real Debian apps) inside a sandbox, driven by
screenshots and xdotool actions (session.py, its in-sandbox half inside.py), and the checkers' and plans' library
of the desktop task family (harness_env/tasks/desktop_family.py)."""
