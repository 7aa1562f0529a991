"""`python flow.py show` prints the flow's docstring and each step's whole docstring, as Metaflow's does."""

from __future__ import annotations

import subprocess
import sys

FLOW = '''
from stoker import FlowSpec, step

class DocFlow(FlowSpec):
    """A flow with a docstring.

    Its second paragraph.
    """

    @step
    def start(self):
        """The start step:
        1) loads the data.
        2) fans out.
        """
        self.next(self.end)

    @step
    def end(self):
        """End the flow."""

if __name__ == "__main__":
    DocFlow()
'''


def test_show_prints_whole_docstrings(tmp_path):
    (tmp_path / "doc_flow.py").write_text(FLOW)
    p = subprocess.run([sys.executable, "doc_flow.py", "show"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60, env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "A flow with a docstring.\n\nIts second paragraph." in out
    assert "    The start step:\n    1) loads the data.\n    2) fans out.\n    => end" in out
    assert "    End the flow." in out
