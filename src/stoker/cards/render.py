"""Cards as HTML: from a card's JSON (its stored form) to a self-contained page, no script and no network.

    render_card_html(card)   the whole page (what `<card_id>.html` holds and `stoker card view` opens)
    card_body_html(card)     the card's body only (the report and the UI embed it)
    component_html(comp)     one component dict

Every user string goes through html.escape (Markdown through the safe converter), so a card cannot run code.
"""

from __future__ import annotations

import datetime as dt
import html
import json
from typing import Any

from stoker.cards.markdown import markdown_to_html
from stoker.cards.svg import vega_to_svg

CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
main{max-width:1040px;margin:0 auto;padding:18px 22px}
header.card-head{border-bottom:1px solid #dde1e7;margin-bottom:14px;padding-bottom:8px}
header.card-head h1{font-size:20px;margin:0 0 4px}
.meta{color:#5b6474;font-size:12px}
section.component{background:#fff;border:1px solid #e3e6eb;border-radius:6px;padding:10px 14px;margin:10px 0;
  overflow-x:auto}
table{border-collapse:collapse;font-size:13px}
th,td{border-bottom:1px solid #e8eaee;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f1f3f6;font-weight:600}
pre{background:#f4f5f7;padding:8px;border-radius:4px;overflow-x:auto;font-size:12px;white-space:pre-wrap}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.progress{height:14px;background:#e7e9ee;border-radius:7px;overflow:hidden;max-width:520px}
.progress>div{height:100%;background:#4c78a8}
.error{color:#b3261e}
.ok{color:#1e7b34}.failed{color:#b3261e}.running{color:#a15c00}
figure{margin:0}figcaption{color:#5b6474;font-size:12px}
img.card-image{max-width:100%}
iframe.custom-card{width:100%;min-height:480px;border:1px solid #e3e6eb;border-radius:6px;background:#fff}
details summary{cursor:pointer;color:#5b6474;font-size:12px}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v), quote=True)


def _scalar(v: Any) -> str:
    if isinstance(v, float):
        return _e(f"{v:.6g}")
    if isinstance(v, (dict, list)):
        return f"<code>{_e(json.dumps(v, default=str)[:2000])}</code>"
    return _e(v)


def component_html(c: dict[str, Any]) -> str:
    """One component dict as an HTML fragment."""
    t = c.get("type") if isinstance(c, dict) else None
    if t == "markdown":
        return f'<div class="markdown">{markdown_to_html(c.get("text") or "")}</div>'
    if t == "table":
        head = "".join(f"<th>{_e(h)}</th>" for h in c.get("headers") or [])
        rows = []
        for row in c.get("data") or []:
            cells = "".join(f"<td>{component_html(v) if isinstance(v, dict) and 'type' in v else _scalar(v)}</td>"
                            for v in row)
            rows.append(f"<tr>{cells}</tr>")
        return f"<table>{f'<thead><tr>{head}</tr></thead>' if head else ''}<tbody>{''.join(rows)}</tbody></table>"
    if t == "image":
        src = str(c.get("src") or "")
        if not src.startswith("data:image/"):  # only embedded images: a card never fetches anything
            return '<p class="error">image: not an embedded data: URI</p>'
        label = c.get("label")
        cap = f"<figcaption>{_e(label)}</figcaption>" if label else ""
        return f'<figure><img class="card-image" alt="{_e(label or "image")}" src="{_e(src)}">{cap}</figure>'
    if t == "vega":
        spec = c.get("spec") or {}
        svg = vega_to_svg(spec)
        if svg is None:
            svg = ('<p class="meta">This Vega-Lite chart uses features the offline renderer does not draw; '
                   'its spec is below and in the card\'s JSON.</p>')
        spec_text = json.dumps(spec, separators=(",", ":"), default=str)
        if len(spec_text) > 20000:
            spec_text = spec_text[:20000] + "\n..."
        return (f'<div class="vega">{svg}<details><summary>Vega-Lite spec</summary><pre>{_e(spec_text)}</pre>'
                f"</details></div>")
    if t == "progress":
        try:
            mx, val = float(c.get("max") or 0), float(c.get("value") or 0)
        except (TypeError, ValueError):
            mx, val = 0.0, 0.0
        pct = 0.0 if mx <= 0 else max(0.0, min(100.0, 100.0 * val / mx))
        unit = f" {c['unit']}" if c.get("unit") else ""
        text = f"{_e(c.get('label') or '')} {_scalar(c.get('value'))}/{_scalar(c.get('max'))}{_e(unit)}"
        details = f' <span class="meta">{_e(c["details"])}</span>' if c.get("details") else ""
        return (f'<div class="progress-wrap"><div>{text.strip()}{details}</div><div class="progress" '
                f'role="progressbar" aria-valuenow="{pct:.1f}"><div style="width:{pct:.1f}%"></div></div></div>')
    if t == "artifact":
        name = f"<strong>{_e(c['name'])}</strong> " if c.get("name") else ""
        return (f'<div class="artifact">{name}<span class="meta">{_e(c.get("type_name"))}</span>'
                f'<pre>{_e(c.get("repr"))}</pre></div>')
    if t == "error":
        return f'<pre class="error">{_e(c.get("message"))}</pre>'
    return f'<pre class="meta">unknown component: {_e(json.dumps(c, default=str)[:500])}</pre>'


def _when(t: Any) -> str:
    try:
        return dt.datetime.fromtimestamp(float(t)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OSError):
        return "-"


def card_body_html(card: dict[str, Any], heading: bool = True) -> str:
    """The card's header and components (no <html> wrapper)."""
    parts = []
    if heading:
        state = "final" if card.get("final") else "live (the step is running)"
        parts.append(f'<header class="card-head"><h1>{_e(card.get("title") or card.get("id"))}</h1>'
                     f'<div class="meta">{_e(card.get("pathspec") or "")} · card {_e(card.get("id"))} '
                     f'({_e(card.get("type"))}) · updated {_e(_when(card.get("updated")))} · {_e(state)}</div>'
                     f"</header>")
    for comp in card.get("components") or []:
        parts.append(f'<section class="component">{component_html(comp)}</section>')
    if card.get("custom"):  # a custom card type's own HTML, in a sandbox: its scripts never run here
        parts.append(f'<iframe class="custom-card" sandbox="" title="{_e(card.get("type"))}" '
                     f'srcdoc="{_e(card.get("html") or "")}"></iframe>')
    elif not card.get("components"):
        parts.append('<p class="meta">This card has no components.</p>')
    return "\n".join(parts)


def page(title: str, body: str) -> str:
    """A self-contained HTML page: inline CSS, no script, no external reference."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>{_e(title)}</title><style>{CSS}</style></head>'
            f"<body><main>\n{body}\n</main></body></html>\n")


def render_card_html(card: dict[str, Any]) -> str:
    """The card as a whole HTML page."""
    return page(f"{card.get('title') or card.get('id')} · {card.get('pathspec') or ''}", card_body_html(card))
