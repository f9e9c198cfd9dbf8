"""The sites' look: one inline stylesheet (layout, a coloured header, cards, buttons, striped tables) and a logo.

Why: a screenshot of unstyled HTML (black text on white) carries nothing that the accessibility text lacks, so a
policy that sees would learn nothing from seeing. Each site gets an accent colour from its title, so two sites
look different. Everything is inline: the CSP-free page loads nothing from anywhere. The logo and colour swatches
are `aria-hidden`, so the accessibility text is exactly what it was without the style.
"""

import hashlib

from .render import esc

ACCENTS = ("#1f6feb", "#8250df", "#bf3989", "#cf222e", "#bc4c00", "#1a7f37", "#0a7ea4", "#6e5494")

CSS = """
*{box-sizing:border-box}
body{margin:0;font:15px/1.5 "DejaVu Sans",Arial,sans-serif;color:#1f2328;background:#eef1f5}
header{display:flex;align-items:center;gap:18px;padding:10px 28px;background:var(--accent);color:#fff;
 box-shadow:0 2px 6px rgba(0,0,0,.18)}
header p{margin:0;font-size:20px;font-weight:bold;letter-spacing:.3px}
header nav{color:rgba(255,255,255,.45)}
header nav a{color:#fff;text-decoration:none;padding:5px 12px;border-radius:14px;background:rgba(255,255,255,.16);
 margin-right:4px}
header nav a:hover{background:rgba(255,255,255,.32)}
main{max-width:980px;margin:24px auto;padding:22px 30px;background:#fff;border-radius:10px;
 box-shadow:0 1px 4px rgba(0,0,0,.10)}
h1{margin-top:0;font-size:24px;color:var(--accent)}
button{font:inherit;padding:6px 14px;border:0;border-radius:6px;background:var(--accent);color:#fff;cursor:pointer}
button:hover{filter:brightness(1.12)}
input,select,textarea{font:inherit;padding:5px 8px;border:1px solid #c6ccd4;border-radius:5px}
label{font-weight:bold;margin-right:6px}
fieldset{border:1px solid #d0d7de;border-radius:8px;margin:10px 0}
table{border-collapse:collapse;width:100%;margin:10px 0}
th{background:#f0f3f7;text-align:left}
th,td{padding:7px 10px;border-bottom:1px solid #e4e8ee}
tbody tr:nth-child(even){background:#f8fafc}
form.inline{display:inline}
[role=alert]{border-left:5px solid #cf222e;background:#ffebe9;padding:2px 12px;border-radius:4px}
.note{border-left:5px solid #1a7f37;background:#dafbe1;padding:6px 12px;border-radius:4px}
.grid{display:flex;flex-wrap:wrap;gap:18px;margin:14px 0}
.card{width:150px;padding:12px;border:1px solid #e4e8ee;border-radius:10px;text-align:center;background:#fcfdfe}
.swatch{display:block;width:120px;height:80px;margin:0 auto 10px;border-radius:8px;border:1px solid rgba(0,0,0,.2)}
.light{display:inline-block;width:18px;height:18px;border-radius:50%;border:1px solid rgba(0,0,0,.3)}
.icon{display:block;margin:0 auto 8px}
"""


def accent(title: str) -> str:
    return ACCENTS[int(hashlib.sha256(title.encode()).hexdigest()[:8], 16) % len(ACCENTS)]


def head_style(title: str) -> str:
    return f"<style>:root{{--accent:{accent(title)}}}{CSS}</style>"


def logo(title: str) -> str:
    """A round badge with the site's initial (decorative: hidden from the accessibility tree)."""
    letter = esc((title.strip() or "S")[0].upper())
    return ('<svg aria-hidden="true" width="34" height="34" viewBox="0 0 34 34"><circle cx="17" cy="17" r="16" '
            'fill="#fff" fill-opacity=".22" stroke="#fff"/><text x="17" y="23" font-size="17" text-anchor="middle" '
            f'fill="#fff" font-family="DejaVu Sans,Arial" font-weight="bold">{letter}</text></svg>')
