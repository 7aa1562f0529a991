"""A flow file run as a program ends without the interpreter's teardown (_process.end_program), as Python's exit
would otherwise end it: its exit status, everything it printed, its atexit handlers and the threads Python waits for
(an executor's workers included, which end through threading's own exit hook).
Under a runner (`runpy`, `python -m cProfile`) the runner's own code still runs after the flow."""

from __future__ import annotations

import subprocess
import sys

FLOW = '''
import atexit, concurrent.futures, sys, threading, time
from stoker import FlowSpec, step

atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread ended", flush=True))).start()
# an executor never shut down: its worker threads end through threading's exit hook, as at Python's exit
EXECUTOR = concurrent.futures.ThreadPoolExecutor(1)
EXECUTOR.submit(lambda: print("executor ran", flush=True))


class EndFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    print("x" * 200000)  # buffered, not yet flushed when the run ends
    EndFlow()
'''


def _run(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    (tmp_path / "end_flow.py").write_text(FLOW)
    env = {"STOKER_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


def test_the_program_ends_as_pythons_exit_would(tmp_path):
    p = _run(tmp_path, "end_flow.py", "run")
    assert p.returncode == 0, p.stderr
    assert "x" * 200000 in p.stdout and "thread ended" in p.stdout and p.stdout.rstrip().endswith("atexit ran")
    assert "executor ran" in p.stdout
    assert "succeeded" in p.stdout + p.stderr
    bad = _run(tmp_path, "end_flow.py", "run", "--no-such-option")
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr


def test_a_runner_gets_its_turn_after_the_flow(tmp_path):
    wrapper = ("import runpy, sys\nsys.argv = ['end_flow.py', 'run']\ntry:\n    runpy.run_path('end_flow.py', "
               "run_name='__main__')\nexcept SystemExit as e:\n    print('wrapper saw exit', e.code)\n")
    p = _run(tmp_path, "-c", wrapper)
    assert "wrapper saw exit 0" in p.stdout, p.stdout[-2000:] + p.stderr
    prof = _run(tmp_path, "-m", "cProfile", "end_flow.py", "run")
    assert prof.returncode == 0 and "function calls" in prof.stdout, prof.stderr  # cProfile printed its stats
