"""What `run --smoke` prints when it ends: what ran, what it cost, and what the full run would cost per hour."""

from __future__ import annotations

from typing import Any


def smoke_lines(flow: str, result: Any, store: Any) -> list[str]:
    from stoker.backends.aws.cost import run_cost
    from stoker.backends.aws.instances import price_per_hour
    from stoker.distributed.smoke import read_record

    shrunk = read_record(store, flow, result.run_id)
    cost = run_cost(store, flow, result.run_id)
    ok = result.status == "succeeded"
    lines = [f"smoke run {flow}/{result.run_id}: {'passed' if ok else result.status}"
             + ("" if ok else ": fix what failed above before the full run, which would fail the same way")]
    for row in cost.rows:
        if row.step not in shrunk:
            continue
        full, ran = shrunk[row.step]["full"], shrunk[row.step]["ran"]
        spent = f"{row.node_hours:.3f} node-hours" + (f", about ${row.cost:,.2f}" if row.cost is not None else "")
        lines.append(f"  step {row.step}: {ran} of {full} nodes, {spent}")
        price = price_per_hour(row.instance_type) if row.instance_type else None
        if price is not None:
            lines.append(f"  the full run: {full} x {row.instance_type} at ${price:,.2f}/h = ${full * price:,.2f} "
                         f"per hour (on-demand list price; `stoker show` gives the run's own estimate)")
        else:
            where = row.instance_type or f"the {row.backend} backend"
            lines.append(f"  the full run: {full} nodes on {where} (no list price known: set $STOKER_PRICES)")
    for step, sizes in shrunk.items():
        if not any(r.step == step for r in cost.rows):
            lines.append(f"  step {step}: ran on {sizes['ran']} of {sizes['full']} nodes")
    if ok:
        lines.append("  next: the same command without --smoke")
    return lines


def print_smoke_report(flow: str, result: Any) -> None:
    from stoker.store.blobs import open_store

    try:
        lines = smoke_lines(flow, result, open_store())
    except Exception as e:  # noqa: BLE001 - the run's own result stands; this is a summary of it
        lines = [f"smoke run {flow}/{result.run_id}: {result.status} (no cost summary: {e})"]
    print("\n".join(lines), flush=True)
