"""What goes into an image besides stoker (see image.py): stoker's dependencies pinned to the versions installed
where the image is built (`pins.txt`, pip constraints), and a training script's `requirements.txt`, checked to be
installable from the build context alone.

Why pins from the builder: stoker's pyproject has floors (`transformers>=4.40`), so an unpinned image gets what
PyPI serves on the day of the build; the builder's environment is where stoker was tested. There is no lock file
in the repository to pin to, so the builder's resolved versions are the reproducible choice.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from stoker.errors import ConfigError

_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?[^;]*(?:;(.*))?$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wanted(requires: Sequence[str], extras: set[str]) -> list[tuple[str, frozenset[str]]]:
    """(name, extras) of each requirement that applies with `extras` (markers other than extras are ignored: a
    pin on a package the image does not need constrains nothing)."""
    out = []
    for line in requires:
        m = _REQ.match(line)
        if not m:
            continue
        need = re.findall(r"extra\s*==\s*['\"]([^'\"]+)['\"]", m.group(3) or "")
        if need and not any(_norm(e) in extras for e in need):
            continue
        out.append((_norm(m.group(1)), frozenset(_norm(e) for e in (m.group(2) or "").split(",") if e.strip())))
    return out


def _installed(name: str) -> tuple[str, list[str]] | None:
    from importlib import metadata

    try:
        d = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    return d.version, list(d.requires or [])


def stoker_requires(wheel: Path | None = None) -> list[str]:
    """stoker's Requires-Dist: of the wheel going into the image, else of the stoker installed here."""
    if wheel is not None:
        with zipfile.ZipFile(wheel) as z:
            meta = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
            text = z.read(meta[0]).decode() if meta else ""
        return [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")]
    from importlib import metadata

    try:
        return list(metadata.requires("stoker") or [])
    except metadata.PackageNotFoundError:
        return []


def resolved_pins(requires: Sequence[str], extras: str, keep: str = "",
                  installed: Callable[[str], tuple[str, list[str]] | None] = _installed,
                  ) -> tuple[dict[str, str], list[str]]:
    """stoker's dependency closure with `extras` ("train,data,aws"), at the versions installed here: ({name:
    version}, [names not installed here, left to pip]). `keep` ("torch|numpy|..."): the base image's packages,
    neither pinned nor followed (what they need is the base image's business)."""
    kept = {_norm(n) for n in keep.split("|") if n} | {"stoker"}
    pins: dict[str, str] = {}
    missing: set[str] = set()
    todo = _wanted(requires, {_norm(e) for e in extras.split(",")})
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, ex = todo.pop()
        if name in kept or (name, ex) in seen:
            continue
        seen.add((name, ex))
        found = installed(name)
        if found is None:
            missing.add(name)
            continue
        pins[name] = found[0]
        todo += _wanted(found[1], set(ex))
    return dict(sorted(pins.items())), sorted(missing - set(pins))


def pins_text(pins: dict[str, str], missing: Sequence[str], extras: str) -> str:
    head = [f"# stoker[{extras}]'s dependencies at the versions installed where this image was built (pip",
            "# constraints; `stoker image build --no-pins` leaves them to pip). The base image's torch/Neuron stay."]
    if missing:
        head.append(f"# not installed there, so not pinned: {', '.join(missing)}")
    return "\n".join(head + [f"{k}=={v}" for k, v in pins.items()]) + "\n"


def read_requirements(path: Path) -> str:
    """A training script's requirements file, checked to be installable from the build context alone."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--requirements {path}: {e.strerror or e}") from None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if re.match(r"(-r|-c|-e|--requirement|--constraint|--editable)\b|[./~]|file:", line):
            raise ConfigError(f"{path}:{n}: {line!r} refers to a file or folder the image build cannot see: "
                              f"inline that file's requirements, or install a local package from a wheel index")
    return text
