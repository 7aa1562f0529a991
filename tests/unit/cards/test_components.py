"""Card components: their JSON (the stored form), their HTML, the escaping of user text, and the offline charts."""

from __future__ import annotations

import json
import re
import struct
import zlib
from html.parser import HTMLParser

import pytest

from stoker.cards import Artifact, Error, Image, Markdown, ProgressBar, Table, VegaChart
from stoker.cards.markdown import markdown_to_html
from stoker.cards.render import component_html, render_card_html
from stoker.cards.svg import line_chart, thin, vega_to_svg

EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def tiny_png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


def html_of(component) -> str:
    data = component.render()
    json.dumps(data)  # the stored form must be JSON
    return component_html(data)


class _Tags(HTMLParser):
    """What a browser would parse: every tag and attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))


def no_active_markup(text: str) -> None:
    """No script element, no event-handler attribute, no javascript: URL, as a browser's parser sees the HTML."""
    p = _Tags()
    p.feed(text)
    for tag, attrs in p.tags:
        assert tag not in ("script", "iframe", "object", "embed"), f"<{tag}> in the HTML"
        for name, value in attrs:
            assert not name.startswith("on"), f"<{tag} {name}=...> in the HTML"
            assert not (value or "").strip().lower().startswith(("javascript:", "vbscript:")), f"<{tag} {name}={value}>"
    assert "<script" not in text.lower()


def test_markdown_renders_markup_and_escapes_html():
    md = Markdown(f"""
        # Title {EVIL}
        Some **bold**, *italic* and `<code>` text, a [link](https://example.org/a?b=1&c=2).

        - one
        - two
        """)
    data = md.render()
    assert data["type"] == "markdown" and data["text"].startswith("\n# Title")  # dedented like Metaflow
    out = component_html(data)
    assert "<h1>Title &lt;script&gt;" in out
    assert "<strong>bold</strong>" in out and "<em>italic</em>" in out and "<code>&lt;code&gt;</code>" in out
    assert '<a href="https://example.org/a?b=1&amp;c=2"' in out
    assert "<ul><li>one</li><li>two</li></ul>" in out
    no_active_markup(out)


@pytest.mark.parametrize("url", ["javascript:alert(1)", "data:text/html,<script>x</script>", "JaVaScRiPt:x"])
def test_markdown_never_links_script_urls(url):
    out = markdown_to_html(f"[click]({url})")
    assert "<a " not in out
    no_active_markup(out)


def test_markdown_update_changes_the_text():
    md = Markdown("# one")
    md.update("# two")
    assert md.render()["text"] == "# two"


def test_table_json_and_html_with_nested_components_and_escaping():
    t = Table([[EVIL, 3, 2.5, None, Markdown("**x**")], ["b", True, [1, 2], {"k": "v"}, Artifact([1, 2])]],
              headers=["who", "n", "f", "none", "nested"])
    data = t.render()
    assert data["type"] == "table" and data["headers"] == ["who", "n", "f", "none", "nested"]
    assert data["data"][0][:4] == [EVIL, 3, 2.5, None]
    assert data["data"][0][4]["type"] == "markdown" and data["data"][1][4]["type"] == "artifact"
    out = html_of(t)
    assert "<th>who</th>" in out and out.count("<tr>") == 3
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in out
    assert "<strong>x</strong>" in out
    no_active_markup(out)


def test_table_rejects_data_that_is_not_rows():
    with pytest.raises(TypeError, match="list of rows"):
        Table("not rows")


def test_table_from_dataframe():
    pd = pytest.importorskip("pandas")
    t = Table.from_dataframe(pd.DataFrame({"a": [1, 2], "b": ["x", "<y>"]}))
    data = t.render()
    assert data["headers"] == ["a", "b"] and data["data"] == [[1, "x"], [2, "<y>"]]
    assert "&lt;y&gt;" in component_html(data)


def test_image_is_an_embedded_data_uri():
    img = Image(tiny_png(), label=EVIL)
    data = img.render()
    assert data["type"] == "image" and data["src"].startswith("data:image/png;base64,")
    out = component_html(data)
    assert 'src="data:image/png;base64,' in out and "http" not in out
    no_active_markup(out)


def test_image_of_bad_bytes_is_an_error_entry_not_an_exception():
    data = Image(b"not an image").render()
    assert data["type"] == "error" and "PNG" in data["message"]


def test_image_never_takes_a_remote_url():
    data = Image("https://example.org/cat.png").render()
    assert data["type"] == "error"
    assert "<img" not in component_html({"type": "image", "src": "https://example.org/x.png"})


def test_image_from_matplotlib():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    assert Image.from_matplotlib(fig).render()["src"].startswith("data:image/png;base64,")


def test_image_from_pil():
    PIL = pytest.importorskip("PIL.Image")
    data = Image.from_pil_image(PIL.new("RGB", (4, 4), "red"), label="red").render()
    assert data["src"].startswith("data:image/png;base64,") and data["label"] == "red"


def test_progress_bar_update_and_html():
    bar = ProgressBar(max=20, label="epochs", value=0, unit="ep")
    bar.update(5, metadata="1.5 it/s")
    data = bar.render()
    assert (data["type"], data["max"], data["value"], data["label"], data["details"]) == \
        ("progress", 20, 5, "epochs", "1.5 it/s")
    out = component_html(data)
    assert 'style="width:25.0%"' in out and "epochs 5/20" in out


def test_artifact_component():
    data = Artifact({"lr": 0.1, "note": EVIL}, name="cfg").render()
    assert data["type"] == "artifact" and data["name"] == "cfg" and data["type_name"] == "dict"
    out = component_html(data)
    assert "cfg" in out and "&lt;script&gt;" in out
    no_active_markup(out)


def test_error_component():
    out = component_html(Error(ValueError(EVIL), title="bad").render())
    assert "ValueError" in out
    no_active_markup(out)


def _line_spec(n: int) -> dict:
    return {"title": "loss", "mark": "line", "data": {"values": [{"step": i, "loss": 1 / (i + 1)} for i in range(n)]},
            "encoding": {"x": {"field": "step", "type": "quantitative"},
                         "y": {"field": "loss", "type": "quantitative"}}}


def test_vega_line_chart_is_drawn_as_inline_svg_and_keeps_its_spec():
    chart = VegaChart(_line_spec(7))
    data = chart.render()
    assert data["type"] == "vega" and data["spec"]["mark"] == "line" and len(data["spec"]["data"]["values"]) == 7
    out = component_html(data)
    assert "<svg" in out and 'data-points="7"' in out and "<script" not in out
    chart.update(_line_spec(9))
    assert 'data-points="9"' in component_html(chart.render())


def test_vega_bar_chart_and_color_series():
    bars = {"mark": {"type": "bar"}, "data": {"values": [{"k": "a", "v": 1}, {"k": "b", "v": 3}]},
            "encoding": {"x": {"field": "k", "type": "nominal"}, "y": {"field": "v", "type": "quantitative"}}}
    svg = vega_to_svg(bars)
    assert svg is not None and svg.count('class="bar"') == 2
    multi = {"mark": "line",
             "data": {"values": [{"t": i, "v": i * s, "s": f"core{s}"} for s in (1, 2) for i in range(4)]},
             "encoding": {"x": {"field": "t"}, "y": {"field": "v"}, "color": {"field": "s"}}}
    svg = vega_to_svg(multi)
    assert svg.count("<polyline") == 2 and "core1" in svg and "core2" in svg


def test_vega_spec_the_renderer_cannot_draw_is_shown_as_its_spec():
    spec = {"mark": "line", "data": {"url": "https://example.org/data.json"},
            "encoding": {"x": {"field": "a"}, "y": {"field": "b"}}}
    assert vega_to_svg(spec) is None
    out = component_html(VegaChart(spec).render())
    assert "<svg" not in out and "Vega-Lite spec" in out and "<script" not in out


def test_user_text_in_chart_titles_is_escaped():
    svg = line_chart({EVIL: [(0, 1), (1, 2)], "b": [(0, 2), (1, 1)]}, title=EVIL, x_label=EVIL)
    no_active_markup(svg)
    assert "&lt;script&gt;" in svg


def test_long_series_are_thinned_but_keep_peaks():
    pts = [(i, 1.0) for i in range(10000)]
    pts[5000] = (5000, 99.0)
    out = thin(pts, 600)
    assert len(out) <= 620 and (5000, 99.0) in out


def test_a_whole_card_page_is_self_contained():
    card = {"id": "c", "type": "blank", "title": EVIL, "updated": 0, "final": True, "pathspec": "F/1/s/2",
            "components": [Markdown(EVIL).render(), Table([[EVIL]]).render(), VegaChart(_line_spec(3)).render(),
                           Image(tiny_png()).render(), ProgressBar(max=2, value=1).render()]}
    page = render_card_html(card)
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    no_active_markup(page)
    assert not re.search(r"<(script|link|iframe)\b", page, re.I)
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "a card must not reference anything remote"


def test_vega_y_scale_domain_is_honoured():
    spec = _line_spec(3)
    spec["encoding"]["y"]["scale"] = {"domain": [0, 100]}
    svg = vega_to_svg(spec)
    assert ">100</text>" in svg and ">0</text>" in svg  # the axis spans the domain, not just the data (0.33..1)
