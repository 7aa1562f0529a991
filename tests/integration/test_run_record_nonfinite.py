"""A run whose parameter or config holds NaN or infinity starts (as before signing): the signed run record is
strict JSON, so such values are recorded as strings ('nan'), and the steps still get the real floats."""

from __future__ import annotations

import json
import textwrap

from stoker.store import open_store
from stoker.store.manifest import read_run_record
from tests.helpers import run_flow

FLOW = textwrap.dedent('''
    import math
    from stoker import Config, FlowSpec, Parameter, step

    class NanFlow(FlowSpec):
        x = Parameter("x", type=float, default=1.0)
        cfg = Config("cfg", default="cfg.toml")

        @step
        def start(self):
            assert math.isnan(self.x) and math.isinf(self.cfg.lr), (self.x, self.cfg.lr)
            self.next(self.end)

        @step
        def end(self):
            pass

    if __name__ == "__main__":
        NanFlow()
''')


def test_nan_parameter_and_inf_config_value_do_not_break_the_run_record(tmp_path, _stoker_home):
    (tmp_path / "nan_flow.py").write_text(FLOW)
    (tmp_path / "cfg.toml").write_text("lr = inf\n")
    p = run_flow(tmp_path / "nan_flow.py", "run", "--x", "nan", cwd=tmp_path, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    run_id = next(line for line in p.stdout.splitlines() if "started" in line).split("NanFlow/")[1].split()[0]
    record = read_run_record(open_store(str(_stoker_home / "store")), "NanFlow", run_id)  # signature verified
    assert record["params"]["x"] == "nan" and record["config"]["cfg"]["lr"] == "inf"
    json.loads(json.dumps(record, allow_nan=False))
