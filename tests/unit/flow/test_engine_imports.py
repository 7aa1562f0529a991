"""The flow engine must not import torch (DESIGN: only a step that uses it pays for it)."""

import subprocess
import sys


def test_engine_and_cli_do_not_import_torch():
    code = ("import sys, stoker, stoker.cli.flow_cli, stoker.cli.main, stoker.runtime.driver.launch, "
            "stoker.backends.local, stoker.store; "
            "bad = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
