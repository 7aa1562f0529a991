"""Card components with Metaflow's names and signatures: Markdown, Table, Image, VegaChart, ProgressBar, Artifact.

A component keeps what the user gave it and renders to a small JSON dict (`render()`), the card's stored form;
`stoker.cards.render` turns those dicts into HTML. Components that change while a step runs (`update()`)
are re-rendered at the next `current.card.refresh()`.

    from stoker.cards import Markdown, ProgressBar       # was: from metaflow.cards import ...
    bar = ProgressBar(max=100, label="epochs")
    current.card.append(bar)
    bar.update(10); current.card.refresh()
"""

from __future__ import annotations

import base64
import copy
import io
import logging
import textwrap
import uuid
from typing import Any

log = logging.getLogger(__name__)

_PNG, _JPEG, _GIF = b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", (b"GIF87a", b"GIF89a")


class MetaflowCardComponent:
    """Base of every component (Metaflow's name): `render()` returns the component's JSON dict."""

    type = "component"
    REALTIME_UPDATABLE = False
    component_id: str | None = None

    def render(self) -> dict[str, Any]:
        raise NotImplementedError

    def update(self, *args: Any, **kwargs: Any) -> None:
        log.warning("@card: %s cannot be updated in place; append a new component instead",
                    type(self).__name__)

    def _with_id(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.component_id is None:
            self.component_id = f"{type(self).__name__.lower()}_{uuid.uuid4().hex[:6]}"
        return {"id": self.component_id, **data}


UserComponent = MetaflowCardComponent


def _cell(value: Any) -> Any:
    """A table cell: a nested component renders to its dict; a plain value stays a JSON scalar or its text."""
    if isinstance(value, MetaflowCardComponent):
        return value.render()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value) if not isinstance(value, (list, tuple, dict)) else _jsonable(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    try:  # numpy scalars and the like
        return _jsonable(value.item())
    except Exception:  # noqa: BLE001
        return str(value)


class Markdown(MetaflowCardComponent):
    """A block of Markdown text (headings, emphasis, code, lists, links). Raw HTML in it is shown as text."""

    type = "markdown"
    REALTIME_UPDATABLE = True

    def __init__(self, text: str | None = None) -> None:
        self._text = textwrap.dedent(text) if text is not None else None

    def update(self, text: str | None = None) -> None:
        self._text = textwrap.dedent(text) if text is not None else None

    def render(self) -> dict[str, Any]:
        return self._with_id({"type": self.type, "text": "" if self._text is None else str(self._text)})


class Table(MetaflowCardComponent):
    """A table: `Table(data=[[...], ...], headers=[...])`; a cell may be text, a number or a component."""

    type = "table"
    REALTIME_UPDATABLE = True

    def __init__(self, data: list[list[Any]] | None = None, headers: list[str] | None = None,
                 disable_updates: bool = False) -> None:
        data = data if data is not None else [[]]
        if not isinstance(data, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in data):
            raise TypeError("Table(data=...) takes a list of rows, each a list of cells")
        self._data = [list(r) for r in data]
        self._headers = [str(h) for h in (headers or [])]
        if disable_updates:
            self.REALTIME_UPDATABLE = False

    @classmethod
    def from_dataframe(cls, dataframe: Any = None, truncate: bool = True) -> Table:
        """A table of a pandas DataFrame (its first 100 rows when `truncate`)."""
        if type(dataframe).__name__ != "DataFrame" or not hasattr(dataframe, "columns"):
            return cls(headers=[f"Object type {type(dataframe).__name__} not supported"], disable_updates=True)
        df = dataframe.head(100) if truncate else dataframe
        rows = [[_jsonable(v) for v in row] for row in df.itertuples(index=False, name=None)]
        return cls(data=rows, headers=[str(c) for c in df.columns], disable_updates=True)

    def update(self, *args: Any, **kwargs: Any) -> None:
        log.warning("@card: a Table cannot be updated; update the components inside it instead")

    def render(self) -> dict[str, Any]:
        rows = [[_cell(c) for c in row] for row in self._data if row]
        return self._with_id({"type": self.type, "headers": list(self._headers), "data": rows})


def _image_data_uri(data: bytes) -> str:
    if data.startswith(_PNG):
        mime = "image/png"
    elif data.startswith(_JPEG):
        mime = "image/jpeg"
    elif data.startswith(_GIF):
        mime = "image/gif"
    else:
        raise ValueError("the bytes are not a PNG, JPEG or GIF image")
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


class Image(MetaflowCardComponent):
    """An image embedded in the card (a data: URI, nothing fetched): PNG/JPEG/GIF bytes, a data URI string,
    or `Image.from_matplotlib(fig)` / `Image.from_pil_image(img)`."""

    type = "image"
    REALTIME_UPDATABLE = False

    def __init__(self, src: bytes | str | None = None, label: str | None = None,
                 disable_updates: bool = True) -> None:
        self.REALTIME_UPDATABLE = not disable_updates
        self._label = label
        self._set(src)

    def _set(self, src: Any) -> None:
        self._src: str | None = None
        self._error: str | None = None
        if src is None:
            self._error = "Image: src is None"
        elif isinstance(src, (bytes, bytearray)):
            try:
                self._src = _image_data_uri(bytes(src))
            except ValueError as e:
                self._error = f"Image: {e}"
        elif isinstance(src, str) and src.startswith("data:image/"):
            self._src = src
        else:
            self._error = (f"Image: src must be PNG/JPEG/GIF bytes or a data:image/ URI, got "
                           f"{type(src).__name__}")

    @classmethod
    def from_matplotlib(cls, plot: Any, label: str | None = None, disable_updates: bool = False) -> Image:
        """An image of a matplotlib Figure or Axes (saved as PNG; the figure is closed)."""
        img = cls(None, label=label, disable_updates=disable_updates)
        img._set(_matplotlib_png(plot) if plot is not None else None)
        return img

    @classmethod
    def from_pil_image(cls, pilimage: Any, label: str | None = None, disable_updates: bool = False) -> Image:
        """An image of a PIL image (saved as PNG)."""
        img = cls(None, label=label, disable_updates=disable_updates)
        try:
            buf = io.BytesIO()
            pilimage.save(buf, format="PNG")
            img._set(buf.getvalue())
        except Exception as e:  # noqa: BLE001 - a card must never fail the step
            img._error = f"Image.from_pil_image: {type(e).__name__}: {e}"
        return img

    def update(self, image: Any, label: str | None = None) -> None:
        if not self.REALTIME_UPDATABLE:
            log.warning("@card: this Image was created with disable_updates=True; pass disable_updates=False")
            return
        if label is not None:
            self._label = label
        if isinstance(image, (bytes, bytearray, str)):
            self._set(image)
        elif hasattr(image, "save") and not hasattr(image, "savefig"):
            self._set(Image.from_pil_image(image)._src)
        else:
            self._set(_matplotlib_png(image))

    def render(self) -> dict[str, Any]:
        if self._error:
            return self._with_id({"type": "error", "message": self._error})
        return self._with_id({"type": self.type, "src": self._src, "label": self._label})


def _matplotlib_png(plot: Any) -> bytes | None:
    fig = plot if hasattr(plot, "savefig") else getattr(plot, "get_figure", lambda: None)()
    if fig is None:
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    try:
        import matplotlib.pyplot as plt

        plt.close(fig)
    except Exception:  # noqa: BLE001
        pass
    return buf.getvalue()


class VegaChart(MetaflowCardComponent):
    """A Vega-Lite chart: `VegaChart(spec)` or `VegaChart.from_altair_chart(chart)`. The spec is kept in the card's
    JSON; line, bar, point and area charts of inline data are also drawn as inline SVG (no script, no network)."""

    type = "vega"
    REALTIME_UPDATABLE = True

    def __init__(self, spec: dict[str, Any], show_controls: bool = False) -> None:
        self._spec = spec
        self._show_controls = show_controls

    def update(self, spec: Any = None) -> None:
        if spec is not None and hasattr(spec, "to_dict") and not isinstance(spec, dict):
            spec = spec.to_dict()
        if spec is not None:
            self._spec = spec

    @classmethod
    def from_altair_chart(cls, altair_chart: Any) -> VegaChart:
        if not hasattr(altair_chart, "to_dict") or "altair" not in type(altair_chart).__module__:
            raise ValueError(f"{type(altair_chart).__module__}.{type(altair_chart).__name__} is not an altair chart")
        return cls(altair_chart.to_dict())

    def render(self) -> dict[str, Any]:
        return self._with_id({"type": self.type, "spec": _jsonable(copy.deepcopy(self._spec))})


class ProgressBar(MetaflowCardComponent):
    """A progress bar: `ProgressBar(max=100, label=None, value=0, unit=None, metadata=None)`, `.update(value)`."""

    type = "progress"
    REALTIME_UPDATABLE = True

    def __init__(self, max: int = 100, label: str | None = None, value: int = 0, unit: str | None = None,
                 metadata: str | None = None) -> None:
        self._max, self._label, self._value, self._unit, self._metadata = max, label, value, unit, metadata

    def update(self, new_value: int, metadata: str | None = None) -> None:
        self._value = new_value
        if metadata is not None:
            self._metadata = metadata

    def render(self) -> dict[str, Any]:
        return self._with_id({"type": self.type, "max": _jsonable(self._max), "value": _jsonable(self._value),
                              "label": self._label, "unit": self._unit, "details": self._metadata})


class Artifact(MetaflowCardComponent):
    """Any Python object, pretty-printed (truncated with reprlib when `compressed`)."""

    type = "artifact"
    REALTIME_UPDATABLE = True

    def __init__(self, artifact: Any, name: str | None = None, compressed: bool = True) -> None:
        self._artifact, self._name, self._compressed = artifact, name, compressed

    def update(self, artifact: Any) -> None:
        self._artifact = artifact

    def render(self) -> dict[str, Any]:
        from stoker.store.artifacts import short_repr, type_name

        value = self._artifact
        text = short_repr(value, limit=400) if self._compressed else _full_repr(value)
        return self._with_id({"type": self.type, "name": None if self._name is None else str(self._name),
                              "type_name": type_name(value), "repr": text})


def _full_repr(value: Any) -> str:
    try:
        import pprint

        return pprint.pformat(value, width=100)
    except Exception as e:  # noqa: BLE001 - a user __repr__ may fail
        return f"<repr failed: {type(e).__name__}>"


class Error(MetaflowCardComponent):
    """An exception shown in the card: `Error(exception, title=None)`."""

    type = "error"

    def __init__(self, exception: BaseException, title: str | None = None) -> None:
        self._exception, self._title = exception, title

    def render(self) -> dict[str, Any]:
        msg = repr(self._exception) if self._title is None else f"{self._title}\n\n{self._exception!r}"
        return self._with_id({"type": self.type, "message": msg})


def render_component(c: Any) -> dict[str, Any]:
    """A component's JSON dict; a component whose render fails becomes an error entry (a card never fails)."""
    try:
        if isinstance(c, MetaflowCardComponent):
            return c.render()
        if isinstance(c, dict) and "type" in c:
            return _jsonable(c)
        return {"type": "markdown", "text": str(c)}
    except Exception as e:  # noqa: BLE001
        return {"type": "error", "message": f"{type(c).__name__} failed to render: {type(e).__name__}: {e}"}
