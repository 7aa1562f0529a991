"""The generations of a gang with hot spares (`@torchrun(spares=k)`), read from the store for `stoker show`, the UI
and the goodput ledger.

The objects are those the driver and the node agents share (their model and writer: stoker.distributed.gangboard;
the client layer does not import it, so the layout is read here by name, the same way). Under each gang attempt,
``runs/<flow>/<run>/<step>/<node 0's task id>/<attempt>/gang/``:

    gen-000001.json      {gen, slots, decided_at, lost: {slot, member, host, why, at} | null, joined}
    started-000001.json  {gen, first_step_at}: the generation's first training step
    member-3.json        {member, addr, host, state, at}
    end.json             {state, at}

:func:`step_gangs` gives one dict per gang attempt of a step (or of every step)::

    {"step", "task_id" (node 0's task), "attempt", "nodes", "members" (the member numbers known), "spares",
     "ended": "done" | "stopped" | None,
     "generations": [{"gen", "slots", "decided_at", "started_at", "lost", "joined", "joined_host",
                      "recovery_s"}]}

A generation's recovery time is its first training step minus the loss that made it (``lost.at``: the lost node's
last heartbeat, or when its process was seen gone); None for generation 0, or while it has not trained yet.
"""

from __future__ import annotations

import json
from typing import Any

from stoker.store.manifest import attempt_prefix, run_prefix

GANG = "gang/"


def gang_prefix(flow: str, run_id: str, step: str, task_id: str, attempt: int) -> str:
    """The folder of a gang attempt's generation objects (as stoker.distributed.gangboard.gang_prefix)."""
    return attempt_prefix(flow, run_id, step, task_id, attempt) + GANG


def _json(store: Any, name: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(store.read(name))
    except Exception:  # noqa: BLE001 - missing, torn or unreadable: as if not there (the rest still shows)
        return None
    return doc if isinstance(doc, dict) else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_gang(store: Any, flow: str, run_id: str, step: str, task_id: str, attempt: int,
              names: list[str] | None = None) -> dict[str, Any] | None:
    """One gang attempt's generations (see the module docstring); None when it has none (no spares).
    ``names``: the objects under its folder, when the caller listed them already."""
    prefix = gang_prefix(flow, run_id, step, task_id, attempt)
    names = sorted(store.list(prefix)) if names is None else sorted(names)
    gens, started, members = [], {}, {}
    for name in names:
        base = name[len(prefix):]
        if base.startswith("gen-") and base.endswith(".json"):
            doc = _json(store, name)
            if doc is not None and isinstance(doc.get("gen"), int) and isinstance(doc.get("slots"), list):
                gens.append(doc)
        elif base.startswith("started-") and base.endswith(".json"):
            doc = _json(store, name) or {}
            if isinstance(doc.get("gen"), int) and _num(doc.get("first_step_at")) is not None:
                started[doc["gen"]] = float(doc["first_step_at"])
        elif base.startswith("member-") and base.endswith(".json") and base[7:-5].isdigit():
            members[int(base[7:-5])] = _json(store, name) or {}
    if not gens:
        return None
    out = []
    for g in sorted(gens, key=lambda d: d["gen"]):
        lost = g.get("lost") if isinstance(g.get("lost"), dict) else None
        at = _num((lost or {}).get("at"))
        first = started.get(g["gen"])
        joined = g.get("joined") if isinstance(g.get("joined"), int) else None
        out.append({"gen": g["gen"], "slots": [int(m) for m in g["slots"]], "decided_at": _num(g.get("decided_at")),
                    "started_at": first, "lost": lost, "joined": joined,
                    "joined_host": (members.get(joined) or {}).get("host") if joined is not None else None,
                    "recovery_s": max(0.0, first - at) if first is not None and at is not None else None})
    end = _json(store, prefix + "end.json") if prefix + "end.json" in names else None
    nodes = len(out[0]["slots"])
    known = sorted(set(members) | {m for g in out for m in g["slots"]})
    return {"step": step, "task_id": task_id, "attempt": int(attempt), "nodes": nodes, "members": known,
            "spares": max(0, len(known) - nodes), "ended": (end or {}).get("state"), "generations": out}


def step_gangs(store: Any, flow: str, run_id: str, step: str | None = None) -> list[dict[str, Any]]:
    """Every gang attempt with generations of ``step`` (of every step when None), by step, attempt and task."""
    base = run_prefix(flow, run_id) + (f"{step}/" if step else "")
    folders: dict[tuple[str, str, int], list[str]] = {}
    for name in store.list(base):
        parts = name[len(run_prefix(flow, run_id)):].split("/")
        # <step>/<task>/<attempt>/gang/<object>
        if len(parts) == 5 and parts[3] == GANG[:-1] and parts[2].isdigit():
            folders.setdefault((parts[0], parts[1], int(parts[2])), []).append(name)
    out = []
    for (s, task, attempt), names in sorted(folders.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        gang = read_gang(store, flow, run_id, s, task, attempt, names)
        if gang is not None:
            out.append(gang)
    return out


def generation_lines(gang: dict[str, Any]) -> list[str]:
    """A gang attempt's generations in words (`stoker show`, docs/spares.md "What you see")."""
    spares = gang["spares"]
    gens = gang["generations"]
    replaced = len(gens) - 1
    head = (f"gang (attempt {gang['attempt']}): {gang['nodes']} node{'s' if gang['nodes'] != 1 else ''} + "
            f"{spares} spare{'s' if spares != 1 else ''}, {len(gens)} generation{'s' if len(gens) != 1 else ''}"
            + (f", {replaced} node{'s' if replaced != 1 else ''} replaced" if replaced else ", no node lost"))
    out = [head]
    for g in gens:
        lost = g["lost"]
        if lost is None:
            out.append(f"generation {g['gen']}: members {', '.join(map(str, g['slots']))} run nodes "
                       f"0-{len(g['slots']) - 1}" if len(g["slots"]) > 1 else
                       f"generation {g['gen']}: member {g['slots'][0]} runs node 0")
            continue
        rec = g["recovery_s"]
        took = f"recovered in {rec:.1f} s" if rec is not None else "not training yet"
        host = f" (host {g['joined_host']})" if g.get("joined_host") else ""
        out.append(f"generation {g['gen']}: node {lost.get('slot')} left (member {lost.get('member')}, host "
                   f"{lost.get('host') or '?'}): {lost.get('why') or 'lost'}; spare member {g['joined']}{host} took "
                   f"its place; {took}")
    return out
