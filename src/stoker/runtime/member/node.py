"""What a remote member runs: `python -m stoker.runtime.node --store URL --code KEY --spec KEY`.

It learns who it is from the engine's environment, reads the unit spec blob and the code package from the
store, sets the EFA / Neuron variables the step's request needs (`accel.node_env`), and runs the flow file in
this process as `python flow.py _task SPEC` would (as a local task does), except that `MyFlow()` calls the task
entrypoint directly (`flow_entry`), not the command line; its spec is in a file only this user can read. Its
output goes to the engine's log as usual and, in chunks while it runs, to the store (best effort: a failed
upload never fails the task), so `stoker logs` sees every node. A node of a gang also beats in the store while it
runs (runtime/member/heartbeat.py), so the driver tells a lost node from a failed one within seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import signal
import sys
import tempfile
import threading
import time
from collections.abc import MutableMapping
from dataclasses import replace

from stoker.distributed.accel import node_env, step_request
from stoker.errors import StokerError
from stoker.flow.spec import flow_entry
from stoker.runtime.member.heartbeat import Heartbeat
from stoker.runtime.member.nodeenv import GENERIC, NodeEngine, node_identity
from stoker.runtime.package import unpack_package
from stoker.runtime.spec import TaskSpec
from stoker.store.blobs import BlobStore, open_store
from stoker.store.goodput import record as record_phase
from stoker.store.goodput import timed as timed_phase
from stoker.store.manifest import log_name

UPLOAD_EVERY_S = float(os.environ.get("STOKER_LOG_UPLOAD_INTERVAL", "5"))


def part_name(log: str, seq: int) -> str:
    """Chunks of a live log: `<log>.parts/000001` ... (readers concatenate them until the log is final)."""
    return f"{log}.parts/{seq:06d}"


class LogShipper:
    """Tees fd 1 and 2 (this process and every child, torchrun's workers included) to the original streams
    and to the store: chunks while the task runs, the whole log when it ends.

    A spare that takes a lost member's node runs the same task attempt: the chunks the lost member shipped are kept
    (its numbering goes on after them) and its whole log starts with them, then a line saying who took over."""

    def __init__(self, store: BlobStore, spec: TaskSpec) -> None:
        self.store = store
        self.names = {s: log_name(spec.flow, spec.run_id, spec.step, spec.task_id, spec.attempt, s)
                      for s in ("stdout", "stderr")}
        self.buf = {s: bytearray() for s in self.names}  # not uploaded yet (memory stays bounded)
        self.spill = {s: tempfile.TemporaryFile() for s in self.names}  # the whole log, for the final upload
        par = spec.parallel
        takeover = par is not None and par.spares > 0 and par.member != par.node_index
        self.earlier = {s: self._shipped(n) if takeover else [] for s, n in self.names.items()}
        self.handover = (f"stoker: member {par.member} takes node {par.node_index} over; the lines above are the "
                         f"lost member's\n").encode() if takeover and par is not None else b""
        self.seq = {s: len(self.earlier[s]) for s in self.names}
        self.lock = threading.Lock()
        self.readers: list[threading.Thread] = []
        self.saved: dict[str, int] = {}
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            sys.stdout.flush() if fd == 1 else sys.stderr.flush()
            self.saved[stream] = os.dup(fd)
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            t = threading.Thread(target=self._pump, args=(r, stream), daemon=True)
            t.start()
            self.readers.append(t)
        self.stop = threading.Event()
        self.uploader = threading.Thread(target=self._upload_loop, daemon=True)
        self.uploader.start()

    def _shipped(self, name: str) -> list[str]:
        """The chunks of `name` already in the store (a lost member's), in order."""
        found: list[str] = []
        try:
            while self.store.exists(part := part_name(name, len(found) + 1)):
                found.append(part)
        except Exception:  # noqa: BLE001 - unreadable: this member's own log only
            pass
        return found

    def _pump(self, r: int, stream: str) -> None:
        while True:
            data = os.read(r, 65536)
            if not data:
                os.close(r)
                return
            os.write(self.saved[stream], data)
            with self.lock:
                self.buf[stream] += data
                self.spill[stream].write(data)

    def _upload_loop(self) -> None:
        while not self.stop.wait(UPLOAD_EVERY_S):
            self._ship_parts()

    def _ship_parts(self) -> None:
        for stream, name in self.names.items():
            with self.lock:
                chunk = bytes(self.buf[stream])
            if not chunk:
                continue
            try:
                self.seq[stream] += 1
                self.store.write(part_name(name, self.seq[stream]), chunk, durable=False)
                with self.lock:
                    del self.buf[stream][:len(chunk)]
            except Exception as e:  # noqa: BLE001 - best effort: the engine's own log still has it
                self.seq[stream] -= 1
                os.write(self.saved["stderr"], f"stoker: log upload failed ({e}); retrying later\n".encode())

    def close(self) -> None:
        """Restore fd 1 and 2, drain the pipes, write the whole logs (and drop the chunks)."""
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            os.dup2(self.saved[stream], fd)  # closes the pipe's last write end we hold
        for t in self.readers:
            t.join(timeout=5)  # children that outlive us may hold the pipe: don't wait for them forever
        self.stop.set()
        self.uploader.join(timeout=5)
        for stream, name in self.names.items():
            try:
                with self.lock:
                    self.spill[stream].seek(0)
                    data = self.spill[stream].read()
                    self.spill[stream].close()
                if self.earlier[stream]:
                    data = b"".join(self._read_part(p) for p in self.earlier[stream]) + self.handover + data
                self.store.write(name, data, durable=False)
                for i in range(1, self.seq[stream] + 1):
                    self.store.delete(part_name(name, i))
            except Exception as e:  # noqa: BLE001
                print(f"stoker: could not upload the {stream} log: {e}", file=sys.stderr)

    def _read_part(self, part: str) -> bytes:
        try:
            data = self.store.read(part)
        except Exception:  # noqa: BLE001 - a chunk that went missing: the rest is kept
            return b""
        return data if data.endswith(b"\n") or not data else data + b"\n"


def member_spec(doc: dict, env: dict[str, str] | None = None, engine: NodeEngine = GENERIC,
                package: str | None = None) -> TaskSpec:
    """This member's TaskSpec from the unit spec document, its gang position filled from the engine. A spare of a
    gang with spares (`doc["spares"]`) waits here until it is given a node (runtime/member/standby.py); one that is
    never needed exits 0 from here."""
    ident = node_identity(env, engine)
    specs = doc["specs"]
    spares = int(doc.get("spares") or 0)
    if not 0 <= ident.member < len(specs) + spares:
        raise SystemExit(f"stoker: member {ident.member} of a unit of {len(specs) + spares}: the engine started "
                         f"more members than were submitted")
    if spares:
        from stoker.runtime.member.standby import announce, slot_spec, wait_for_slot

        typed = [s if isinstance(s, TaskSpec) else TaskSpec.from_dict(s) for s in specs]
        first = doc.get("first_slots") or list(range(len(specs)))
        if ident.member in first:
            slot = first.index(ident.member)
            announce(typed, ident, "active")  # where a next generation's rendezvous can reach it
        else:
            warm_env = dict(os.environ)  # what the task's ranks will have: its launcher imports in it
            apply_node_env(doc, warm_env)
            slot = wait_for_slot(typed, ident, spares, package=package, warm_env=warm_env)
        if slot is None:
            raise SystemExit(0)  # a spare the gang did not need: nothing of any task is written
        return slot_spec(typed, slot, ident, spares)
    mine = specs[ident.member]  # a TaskSpec in a local unit's document, its JSON in a remote one's
    spec = mine if isinstance(mine, TaskSpec) else TaskSpec.from_dict(mine)
    if spec.parallel is not None:
        num_nodes = ident.num_nodes if doc["kind"] == "gang" else spec.parallel.num_nodes
        spec = replace(spec, parallel=spec.parallel.started(ident.main_addr, ident.port, num_nodes))
    return spec


def apply_node_env(doc: dict, env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the EFA / Neuron variables the step's request needs (`accel.node_env`) in `env` (this process's
    environment by default, so the task and torchrun's workers inherit them); the values already set win.
    Returns what was added."""
    env = os.environ if env is None else env
    added = node_env(step_request(doc.get("resources") or {}, doc.get("options") or {}), env)
    env.update(added)
    return added


def run_member(store_url: str, code_key: str, spec_key: str, engine: NodeEngine = GENERIC,
               beat: Heartbeat | None = None) -> int:
    started = time.time()
    store = open_store(store_url)
    doc = json.loads(store.get_blob(spec_key))
    with timed_phase("code_package"):  # first: a spare waits warm (runtime/member/standby.py)
        pkg = unpack_package(store, code_key)
    waiting = time.time()
    spec = member_spec(doc, engine=engine, package=str(pkg))
    waited = time.time() - waiting if doc.get("spares") else 0.0  # a spare's wait is not set-up time
    if beat is not None:  # a gang node beats from now on (the caller writes its last beat: runtime/member/heartbeat.py)
        beat.start(store, spec, node_identity(engine=engine).host)
    os.environ.update(STOKER_RUN_ID=spec.run_id, STOKER_TASK_PATHSPEC=spec.pathspec, STOKER_STORE=store.url)
    added = apply_node_env(doc)
    record_phase("node_setup", time.time() - started - waited)  # the ledger's start-up phases (stoker.store.goodput)
    flow_path = str(pkg / doc["flow_path"])
    spec.flow_file = flow_path
    private = tempfile.mkdtemp(prefix="stoker-spec-")  # 0700: the spec is readable by this user only
    spec_file = os.path.join(private, "spec.json")
    with open(os.open(spec_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(spec.to_json())
    shipper = LogShipper(store, spec)
    print(f"stoker: {spec.pathspec} attempt {spec.attempt} on {os.uname().nodename} "
          f"(set up in {time.time() - started:.2f} s)", file=sys.stderr, flush=True)
    if added:
        print(f"stoker: node environment {' '.join(f'{k}={v}' for k, v in sorted(added.items()))}",
              file=sys.stderr, flush=True)
    code = 1
    try:
        sys.path.insert(0, str(pkg))
        os.chdir(pkg)  # as on Metaflow's remote compute: relative paths resolve inside the code package
        from stoker.runtime.member.task import main_from_cli  # the flow's own imports load it anyway

        sys.argv = [flow_path, "_task", spec_file]
        with flow_entry(lambda cls: sys.exit(main_from_cli(cls, spec_file))):  # `MyFlow()` runs the task
            runpy.run_path(flow_path, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the task's log
        import traceback

        traceback.print_exc()
    finally:
        shipper.close()
        os.unlink(spec_file)
        os.rmdir(private)
    if code == 0 and engine.after_task is not None:
        engine.after_task(store, doc, spec, os.environ)
    return code


def _terminated(signum: int, _frame: object) -> None:
    """The engine stops this node (TerminateJob, scancel, @timeout, a failed gang node): unwind, so that
    torchrun is stopped and the logs (and a Neuron compile cache) are uploaded before the engine's SIGKILL."""
    # Engines send TERM more than once (Batch stops the other nodes when the main one exits, after its own
    # TerminateJob): the first one unwinds; the engine's SIGKILL after its grace is the backstop.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("stoker: SIGTERM: stopping this node", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None, engine: NodeEngine = GENERIC) -> None:
    """The node entrypoint; an engine's own (backends/<engine>/node.py) passes how to read its environment."""
    ap = argparse.ArgumentParser(prog=f"stoker node ({engine.name})")
    ap.add_argument("--store", required=True)
    ap.add_argument("--code", required=True)
    ap.add_argument("--spec", required=True)
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    beat, code = Heartbeat(), 1
    try:
        code = run_member(a.store, a.code, a.spec, engine, beat)
    except StokerError as e:  # the store, the spec or the code package cannot be read: one line, no traceback
        print(f"stoker node: error: {e}", file=sys.stderr, flush=True)
        code = 1
    finally:
        beat.stop(code)  # however it ended: the driver must not take this node for a lost one
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no atexit surprises from the flow's imports after the manifest and logs are written


if __name__ == "__main__":
    main()
