"""`Runner`: run a flow from Python, as Metaflow's programmatic API (2.19) does.

    with Runner("flow.py", show_output=False).run(alpha=5) as running:
        print(running.status, running.run.data.x)

`Runner(flow_file, show_output=True, profile=None, env=None, cwd=None, file_read_timeout=3600, **top_level)`
starts `python flow.py [top-level options] run|resume [options]` in a subprocess. Keyword arguments become
options: `alpha=5` -> `--alpha 5`, `tags=["a"]` -> `--tag a`, `pylint=False` -> `--no-pylint`, a bool parameter
`flag=True|False` -> `--flag|--no-flag`, a dict or list given to a JSONType parameter -> its JSON. The flow
process hands the run id back through a runner attribute file (a FIFO). `run`/`resume` wait for the run to end;
`async_run`/`async_resume` return once it has started.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError
from stoker.runner.process import (
    CommandManager,
    SubprocessManager,
    _exited,
    process_error_message,
    read_fifo,
    temporary_fifo,
)

# Metaflow's top-level options (before the command) and the run/resume options, by keyword name
TOP_LEVEL = {"pylint": "pylint", "quiet": "quiet", "metadata": "metadata", "environment": "environment",
             "datastore": "datastore", "datastore_root": "datastore-root", "event_logger": "event-logger",
             "monitor": "monitor", "decospecs": "with", "config": "config", "package_suffixes": "package-suffixes",
             "force_rebuild_environments": "force-rebuild-environments", "local_config_file": "local-config-file",
             "mode": "mode", "warnings": "warnings", "config_value": "config-value"}
COMMON = {"tags": "tag", "max_workers": "max-workers", "max_num_splits": "max-num-splits", "decospecs": "with",
          "run_id_file": "run-id-file", "quiet": "quiet", "backend": "backend"}
RUN = {**COMMON, "config": "config", "set": "set"}
# Metaflow's run options that stoker's `run` does not have: refused before anything starts, with the reason.
UNSUPPORTED = {"user_namespace": "stoker's tasks read their own run's namespace; set the client's with namespace()",
               "max_log_size": "stoker keeps a task's whole log in the store (no size cap to set)"}
RESUME = {**COMMON, "origin_run_id": "origin-run-id", "step_to_rerun": None, "step": "step"}
_NO_FORM = {"pylint": "--no-pylint", "quiet": None, "warnings": "--no-warnings"}  # what False becomes


def _stoker_root() -> str:
    return str(Path(__file__).resolve().parents[2])  # the folder holding the `stoker` package


def flow_class_from_file(flow_file: str) -> type:
    """The FlowSpec subclass defined in `flow_file` (imported as Metaflow's Runner does, without running it)."""
    from stoker.flow.spec import FlowSpec
    from stoker.flow.user_decorators import flow_class_of

    if not os.path.exists(flow_file):
        raise FileNotFoundError(f"Flow file not present at '{flow_file}'")
    folder = os.path.dirname(os.path.abspath(flow_file))
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        name = os.path.splitext(os.path.basename(flow_file))[0]
        spec = importlib.util.spec_from_file_location(name, flow_file)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        found = [k for _, v in inspect.getmembers(module) if (k := flow_class_of(v)) is not None
                 and k is not FlowSpec and issubclass(k, FlowSpec) and k.__module__ == name]  # a bare @FlowMutator
        found = list(dict.fromkeys(found))
        if not found:
            raise ConfigError(f"No FlowSpec class found in {flow_file}")
        if len(found) > 1:
            raise ConfigError(f"Multiple FlowSpec classes found in {flow_file}")
        return found[0]
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


_PY_TYPES = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}


def _check_type(key: str, p: Any, value: Any) -> None:
    """A value of the wrong Python type for a parameter is a TypeError before anything starts, as in Metaflow."""
    allowed = _PY_TYPES.get(p.type)
    if allowed and (not isinstance(value, allowed) or (isinstance(value, bool) and p.type is not bool)):
        raise TypeError(f"Invalid type for '{key}' ({type(value)}), expected: 'Optional[{p.type.__name__}]', "
                        f"default is '{p.default}' but found '{value}'")


def _options(kwargs: dict[str, Any], known: dict[str, str | None], params: dict[str, Any]) -> list[str]:
    """`--name value` items for `kwargs`, checked against the known options and the flow's parameters."""
    from stoker.flow.parameters import JSONType

    out: list[str] = []
    positional: list[str] = []
    for key, value in kwargs.items():
        if value is None:
            continue
        if key in params:
            p = params[key]
            _check_type(key, p, value)
            if p.type is bool:
                out.append(f"--{p.cli_name}" if value else f"--no-{p.cli_name}")
            elif p.type is JSONType or isinstance(value, (dict, list, tuple)):
                out += [f"--{p.cli_name}", json.dumps(value if not isinstance(value, tuple) else list(value))]
            else:
                out += [f"--{p.cli_name}", str(value)]
            continue
        if key in UNSUPPORTED:
            raise ValueError(f"'{key}' is a Metaflow option stoker does not support: {UNSUPPORTED[key]}")
        if key not in known:
            raise ValueError(f"Unknown argument: '{key}', possible args are: "
                             + ", ".join([*params, *known]))
        flag = known[key]
        if flag is None:
            positional.append(str(value))
        elif isinstance(value, bool):
            if value:
                out.append(f"--{flag}")
            elif _NO_FORM.get(key):
                out.append(_NO_FORM[key])  # type: ignore[arg-type]
        elif isinstance(value, (list, tuple)):
            for item in value:
                out += [f"--{flag}", *(map(str, item) if isinstance(item, (list, tuple)) else [str(item)])]
        else:
            out += [f"--{flag}", str(value)]
    return positional + out


class ExecutingProcess:
    """A flow process started by a Runner: `status`, `returncode`, `stdout`, `stderr`, `wait()`, `stream_log()`.

    A context manager: leaving it cleans up the Runner's temporary files (use it or the Runner, not both)."""

    def __init__(self, runner: Runner, command_obj: CommandManager) -> None:
        self.runner = runner
        self.command_obj = command_obj

    def __enter__(self) -> ExecutingProcess:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.runner.__exit__(exc_type, exc_value, traceback)

    async def wait(self, timeout: float | None = None, stream: str | None = None) -> ExecutingProcess:
        """Wait for the process to end (awaitable); after `timeout` seconds it is killed (status `timeout`);
        with `stream` ("stdout" or "stderr") that stream is printed meanwhile."""
        await self.command_obj.wait(timeout, stream)
        return self

    @property
    def returncode(self) -> int | None:
        """The exit code of the flow process, None while it runs."""
        return self.command_obj.process.returncode

    @property
    def status(self) -> str:
        """`timeout`, `running`, `failed` or `successful` (of the process)."""
        if self.command_obj.timeout:
            return "timeout"
        if self.command_obj.process.returncode is None:
            return "running"
        return "failed" if self.command_obj.process.returncode != 0 else "successful"

    def _read(self, stream: str) -> str:
        with open(self.command_obj.log_files[stream], encoding="utf-8") as f:
            return f.read()

    @property
    def stdout(self) -> str:
        """The process's stdout so far (all of it once it has ended)."""
        return self._read("stdout")

    @property
    def stderr(self) -> str:
        """The process's stderr so far (all of it once it has ended)."""
        return self._read("stderr")

    async def stream_log(self, stream: str, position: int | None = None) -> Any:
        """`async for position, line in running.stream_log("stdout")`: each line as it is written; `position`
        resumes from a position yielded before."""
        async for pos, line in self.command_obj.stream_log(stream, position):
            yield pos, line


class ExecutingRun(ExecutingProcess):
    """An ExecutingProcess with `run`, the client Run of the flow's run."""

    def __init__(self, runner: Runner, command_obj: CommandManager, run_obj: Any) -> None:
        super().__init__(runner, command_obj)
        self.run = run_obj


_DBS: dict[str, Any] = {}


def _client_run(attrs: dict[str, str], cmd: CommandManager, timeout: float) -> Any:
    """The client Run named by the runner attributes, read where the flow process writes it. The process names
    its run a moment before registering it: wait for it (until `timeout`, or the process has ended)."""
    from stoker.client import Run
    from stoker.store.blobs import open_store
    from stoker.store.metadata import MetadataDB

    pathspec = f"{attrs['flow_name']}/{attrs['run_id']}"
    db_path = attrs.get("db")
    deadline = time.time() + timeout
    while True:
        ended = _exited(cmd.process)
        if db_path and os.path.exists(db_path):
            db = _DBS.get(db_path) or _DBS.setdefault(db_path, MetadataDB(db_path))
            if db.get_run(attrs["flow_name"], attrs["run_id"]) is not None:
                return Run(pathspec, db=db, store=open_store(attrs["store"]), _namespace_check=False)
        if ended or time.time() > deadline:
            code = cmd.process.returncode
            raise RuntimeError(process_error_message(cmd)) from subprocess.CalledProcessError(code or 0, cmd.command)
        time.sleep(0.05)


class Runner:
    """Run a flow file from Python: `Runner(flow_file, show_output=True, profile=None, env=None, cwd=None,
    file_read_timeout=3600, **top_level_options)`; `run`, `resume`, `async_run`, `async_resume`.

    A context manager (sync and async): leaving it deletes the temporary log files."""

    def __init__(self, flow_file: str, show_output: bool = True, profile: str | None = None,
                 env: dict[str, str] | None = None, cwd: str | None = None, file_read_timeout: int = 3600,
                 **kwargs: Any) -> None:
        self.flow_file = flow_file if os.path.isabs(flow_file) else os.path.abspath(flow_file)
        self.show_output = show_output
        self.env_vars = os.environ.copy()
        self.env_vars.update(env or {})
        if profile:
            self.env_vars["METAFLOW_PROFILE"] = profile
        root = _stoker_root()  # the flow process imports this stoker (as Metaflow's does its metaflow), also when
        if "-packages" not in root:  # this one was found through a path added at run time (a notebook's sys.path)
            parts = [p for p in self.env_vars.get("PYTHONPATH", "").split(os.pathsep) if p]
            self.env_vars["PYTHONPATH"] = os.pathsep.join([root, *[p for p in parts if p != root]])
        self.cwd = cwd or os.getcwd()
        self.file_read_timeout = file_read_timeout
        self.spm = SubprocessManager()
        self.top_level_kwargs = kwargs
        self.flow_cls = flow_class_from_file(self.flow_file)
        from stoker.flow.parameters import Parameter

        self._params = {p.name.replace("-", "_").lower(): p for p in self.flow_cls._run_inputs().values()
                        if isinstance(p, Parameter)}
        self._top = self._top_level()

    def _top_level(self) -> tuple[list[str], list[str]]:
        """(options before the command, options stoker takes after it) from the top-level keyword arguments."""
        kw = dict(self.top_level_kwargs)
        after = ["--quiet"] if kw.pop("quiet", False) else []  # stoker's --quiet is an option of run/resume
        if kw.get("config_value"):  # [(NAME, a dict or its text)], as Metaflow's: `--config-value NAME JSON`
            kw["config_value"] = [(name, v if isinstance(v, str) else json.dumps(v)) for name, v in kw["config_value"]]
        return _options(kw, TOP_LEVEL, {}), after

    def _command(self, command: str, kwargs: dict[str, Any], attribute_file: str) -> list[str]:
        before, after = self._top
        if command == "run":
            opts = _options(kwargs, RUN, self._params)
        else:
            opts = _options(kwargs, RESUME, {})
        return [sys.executable, self.flow_file, *before, command, *opts, *after,
                "--runner-attribute-file", attribute_file]

    def __enter__(self) -> Runner:
        return self

    async def __aenter__(self) -> Runner:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.spm.cleanup()

    async def __aexit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.spm.cleanup()

    def cleanup(self) -> None:
        """Delete the temporary files (the logs of the processes started)."""
        self.spm.cleanup()

    def _sync(self, command: str, kwargs: dict[str, Any]) -> ExecutingRun:
        with temporary_fifo() as (path, fd):
            pid = self.spm.run_command(self._command(command, kwargs, path), env=self.env_vars, cwd=self.cwd,
                                       show_output=self.show_output)
            cmd = self.spm.get(pid)
            assert cmd is not None
            try:
                content = read_fifo(fd, cmd, self.file_read_timeout)
            except (subprocess.CalledProcessError, TimeoutError) as e:
                cmd.sync_wait() if not isinstance(e, TimeoutError) else None
                raise RuntimeError(process_error_message(cmd)) from e
        cmd.sync_wait()
        return ExecutingRun(self, cmd, _client_run(json.loads(content), cmd, self.file_read_timeout))

    async def _async(self, command: str, kwargs: dict[str, Any]) -> ExecutingRun:
        import asyncio

        with temporary_fifo() as (path, fd):
            pid = await self.spm.async_run_command(self._command(command, kwargs, path), env=self.env_vars,
                                                   cwd=self.cwd)
            cmd = self.spm.get(pid)
            assert cmd is not None
            try:
                content = await asyncio.to_thread(read_fifo, fd, cmd, self.file_read_timeout)
            except (subprocess.CalledProcessError, TimeoutError) as e:
                raise RuntimeError(process_error_message(cmd)) from e
        attrs = json.loads(content)
        run = await asyncio.to_thread(_client_run, attrs, cmd, self.file_read_timeout)
        return ExecutingRun(self, cmd, run)

    def run(self, **kwargs: Any) -> ExecutingRun:
        """Run the flow and wait for it to end. Keyword arguments are the options of `run`: the flow's
        parameters, `tags`, `max_workers`, ... Returns an ExecutingRun (`.run` is the client Run)."""
        return self._sync("run", kwargs)

    def resume(self, **kwargs: Any) -> ExecutingRun:
        """Resume a run and wait for it to end: `origin_run_id=`, `step_to_rerun=`, `tags=`, ..."""
        return self._sync("resume", kwargs)

    async def async_run(self, **kwargs: Any) -> ExecutingRun:
        """Start the flow and return once its run has started (`await running.wait()` to wait for the end)."""
        return await self._async("run", kwargs)

    async def async_resume(self, **kwargs: Any) -> ExecutingRun:
        """Start a resume and return once its run has started."""
        return await self._async("resume", kwargs)
