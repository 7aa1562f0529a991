"""`stoker goodput FLOW/RUN [--json]`: where the wall time of every training step went (the goodput ledger,
stoker.client.goodput), and the short summary `stoker show` prints under a run.

The cost of the time comes from the backend's price table (backends/aws/instances.py, `$STOKER_PRICES`): only
attempts whose job recorded an instance type (Batch) are priced.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from stoker.client.goodput import LABELS
from stoker.errors import ConfigError
from stoker.store.checkpoint_advice import advice_line


def run_ledger(store: Any, flow: str, run_id: str) -> dict[str, Any]:
    """The run's ledger, priced with the backend's table."""
    from stoker.backends.aws.instances import price_per_hour
    from stoker.client.goodput import run_goodput

    return run_goodput(store, flow, run_id, price=price_per_hour)


def secs(s: float | None) -> str:
    if s is None:
        return "-"
    if abs(s) < 100:
        return f"{s:.1f}s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m}m{sec:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def summary(doc: dict[str, Any]) -> dict[str, Any] | None:
    """What `stoker show --json` keeps of the ledger: the run's totals, and each training step's; None when the run
    has no training step (no trainer wrote a ledger)."""
    if not doc["steps"]:
        return None
    keys = ("goodput", "ettr", "node_seconds", "paid_s", "seconds", "tokens")
    return {**{k: doc["total"][k] for k in keys}, "cost": doc["total"]["cost"],
            "steps": [{"step": s["step"], "nodes": s["nodes"], "wall_s": s["wall_s"], "failures": s["failures"],
                       "checkpoint": s["checkpoint"], **{k: s[k] for k in keys}} for s in doc["steps"]],
            "notes": doc["notes"]}


def _biggest(seconds: dict[str, float], total: float, n: int = 4) -> str:
    rest = sorted(((v, k) for k, v in seconds.items() if k != "productive" and v > 0.005 * total), reverse=True)
    return ", ".join(f"{LABELS[k]} {secs(v)}" for v, k in rest[:n])


def summary_lines(s: dict[str, Any] | None, pathspec: str = "FLOW/RUN", *, advice: bool = True) -> list[str]:
    """`stoker show`'s lines: the productive share, the biggest other shares, the cost of the lost time, and (with
    ``advice``) each training step's checkpoint interval advice."""
    if not s:
        return []
    if "error" in s:
        return [f"goodput: not available ({s['error']})"]
    head = (f"goodput: {pct(s['goodput'])} of {secs(s['paid_s'])} paid node-time was productive training "
            f"(ETTR {pct(s['ettr'])} of {secs(s['node_seconds'])})")
    others = _biggest(s["seconds"], s["node_seconds"])
    out = [head + (f"; the rest: {others}" if others else "")]
    cost = s.get("cost")
    if cost:
        out.append(f"  lost work cost about ${cost['lost_usd']:,.2f}, all non-productive time about "
                   f"${cost['not_productive_usd']:,.2f} (on-demand prices)")
    for step in s.get("steps") or [] if advice else []:
        if a := (step.get("checkpoint") or {}).get("advice"):
            out.append(f"  step {step['step']}: {advice_line(a, auto=a.get('auto', False))}")
    out.append(f"  where the time went, per attempt and node: stoker goodput {pathspec}")
    return out


def _table(seconds: dict[str, float], total: float, startup: dict[str, float]) -> list[str]:
    lines = [f"    {'category':<16} {'node-time':>10} {'share':>7}"]
    for key, value in seconds.items():
        if abs(value) < 0.0005 and key not in ("productive", "other"):
            continue
        line = f"    {LABELS[key]:<16} {secs(value):>10} {pct(value / total if total else None):>7}"
        if key == "startup" and startup:
            line += "   " + ", ".join(f"{k.replace('_', ' ')} {secs(v)}" for k, v in startup.items())
        lines.append(line)
    return lines


def _attempt_line(a: dict[str, Any]) -> str:
    parts = [f"{LABELS[k]} {secs(v)}" for k, v in a["seconds"].items() if abs(v) >= 0.05]
    line = f"      attempt {a['attempt']} ({a['status']}, {secs(a['wall_s'])}): " + ", ".join(parts)
    st = a["steps"]
    if st:
        line += f"; steps {st['first']}->{st['last']}"
        if st["lost"]:
            line += f", {st['lost']} recomputed (kept to {st['kept']})"
        if st["mean_step_s"]:
            line += f", {st['mean_step_s'] * 1000:.0f} ms/step"
    return line


def ledger_lines(doc: dict[str, Any]) -> list[str]:
    """`stoker goodput`'s text: per training step its categories (node-time, summed over nodes), then per node
    and attempt; the run's totals and the cost when priced."""
    pathspec = f"{doc['flow']}/{doc['run_id']}"
    if not doc["steps"]:
        return [f"{pathspec}: no training step wrote a goodput ledger (stoker.train in a flow step writes one)"]
    out = summary_lines(summary(doc), pathspec, advice=False)[:-1]  # the advice: under each step
    for s in doc["steps"]:
        out.append(f"  step {s['step']}: {s['nodes']} node{'s' if s['nodes'] != 1 else ''}, wall {secs(s['wall_s'])}, "
                   f"goodput {pct(s['goodput'])}, {s['tokens']:,} tokens kept, "
                   f"{(s['tokens_per_s'] or 0):,.0f} tokens/s of wall time, {s['failures']} failed attempt(s)")
        startup: dict[str, float] = {}
        for t in s["tasks"]:
            for a in t["attempts"]:
                for k, v in a["startup"].items():
                    startup[k] = startup.get(k, 0.0) + v
        out += _table(s["seconds"], s["node_seconds"], startup)
        ck = s["checkpoint"]
        if ck["saves"]:
            out.append(f"    checkpoints: {ck['saves']} saves, {secs(ck['mean_blocking_s'])} blocking each"
                       + (f", every {ck['every_steps']} steps" if ck["every_steps"] else "")
                       + (f"; mean step {s['mean_step_s'] * 1000:.0f} ms" if s["mean_step_s"] else ""))
        if ck.get("advice"):
            out.append(f"    {advice_line(ck['advice'], auto=ck['advice'].get('auto', False))}")
        elif not ck["saves"]:
            out.append("    no checkpoint was saved: no save time to advise an interval from (set checkpoint.every, "
                       "or checkpoint.every=auto)")
        for t in s["tasks"]:
            out.append(f"    node {t['node'] if t['node'] is not None else '?'} (task {t['task_id']}):")
            out += [_attempt_line(a) for a in t["attempts"]]
    out += [f"note: {n}" for n in doc["notes"]]
    return out


def cmd_goodput(args: argparse.Namespace) -> int:
    from stoker.client import Run

    parts = args.pathspec.strip("/").split("/")
    if len(parts) != 2:
        raise ConfigError(f"goodput {args.pathspec}: give FLOW/RUN (see `stoker runs`)")
    run = Run(args.pathspec)
    doc = run_ledger(run._store, run.flow_name, run.id)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print("\n".join(ledger_lines(doc)))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("goodput", help="where the wall time of every training step of FLOW/RUN went")
    p.add_argument("pathspec", help="FLOW/RUN")
    p.add_argument("--json", action="store_true", help="print the ledger as one JSON object (docs/operations.md)")
    p.set_defaults(fn=cmd_goodput)
