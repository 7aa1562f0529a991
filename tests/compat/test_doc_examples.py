"""Metaflow's documentation examples: custom decorators, mutators, configs, cards, @project, tags, Runner.

Flows this project did not write: each example of tests/flows/metaflow/docs/ (verbatim from docs.metaflow.org, its
page named in each file) runs with the command lines its page gives, on Metaflow and on stoker with only the import
changed; the runs' output and what the client reads of them are compared. A difference stoker keeps is an
xfail(strict) test naming it, and is listed in docs/from-metaflow.md.
"""

from __future__ import annotations

import os
import re
import textwrap

import pytest

from tests.compat.conftest import compare
from tests.compat.doc_examples import Example, Played, play_all

pytestmark = pytest.mark.slow

_STDOUT = """
    from metaflow import Flow
    run = Flow("{flow}").latest_run
    result = {{"successful": run.successful,
              "stdout": {{s.id: [t.stdout for t in s] for s in run}}}}
"""
_CARDS = """
    import base64, html, re
    from metaflow import Flow
    from metaflow.cards import get_cards

    def text(h):  # Metaflow's card pages keep their data base64-encoded
        for b in re.findall(r'__MF_DATA__\\[[^\\]]*\\] = "([A-Za-z0-9+/=]+)"', h):
            h += base64.b64decode(b).decode()
        return html.unescape(h)

    def cards(task):
        try:
            return sorted([c.id or "", c.type, text(c.get())] for c in get_cards(task))
        except Exception as e:
            return type(e).__name__
"""


def _cards(snippet: str) -> str:
    """A client snippet with `cards(task)`: [[id or "", type, HTML]] of the task's cards, or the exception's name."""
    return textwrap.dedent(_CARDS) + textwrap.dedent(snippet)

EXAMPLES = {
    # custom-decorators: a decorator imported by the flow, the same one for every step with --with, an artifact
    "profile": Example("profiler", (("waiterflow.py", "run"),), _STDOUT.format(flow="WaiterFlow")),
    "profile_with": Example("profiler", (("waiterflow.py", "run", "--with", "myprofiler.my_profile"),),
                            _STDOUT.format(flow="WaiterFlow")),
    "stats_profile": Example("profiler", (("waiterflow.py", "run", "--with", "statsprofiler.stats_profile:silent=1"),),
                             """
        from metaflow import Flow
        run = Flow("WaiterFlow").latest_run
        timings = run.data.timings
        result = [run.successful, type(timings).__name__, {k: len(v) for k, v in timings.items()},
                  "Step timings" in run["end"].task.stdout]
    """),
    "trace": Example("trace", (("traceflow.py", "run"),), """
        from metaflow import Flow
        task = Flow("TracingFlow").latest_run["start"].task
        timings = task.data.timings
        result = [sorted(timings), timings["database access"] >= 900, timings["process data"] >= 450,
                  "trace" in [a.id for a in task]]
    """),
    # advanced-custom-decorators and mutators
    "ai_debug": Example("ai_debug", (("failflow.py", "run"),)),
    "fallback": Example("fallback", (("failflow.py", "run", "--with", "retry", "--with",
                                      "fallback.fallback:indicator=failed"),), timeout=40),
    "robust_flow": Example("robust_flow", (("failflow.py", "run"),), timeout=40),
    "flow_linter": Example("flow_linter", (("hungryflow.py", "run", "--with", "resources:memory=64000"),)),
    # configuring-flows
    "timeout_config": Example("timeout_config", (("timeout_config.py", "run"),
                                                 ("timeout_config.py", "--config", "config", "myconfig2.json", "run")),
                              """
        from metaflow import Flow
        runs = list(Flow("TimeoutConfigFlow"))
        result = [[r.successful for r in runs], dict(Flow("TimeoutConfigFlow").latest_successful_run.data.config)]
    """),
    "config_env": Example("timeout_config", (("timeout_config.py", "run"),),
                          env={"METAFLOW_FLOW_CONFIG_VALUE": '{"config": {"timeout": 3}}'}),
    "config_value": Example("timeout_config", (("timeout_config.py", "--config-value", "config", '{"timeout": 3}',
                                                "run"),)),
    "toml_config": Example("toml_config", (("toml_config.py", "run"),), """
        from metaflow import Flow
        run = Flow("TomlConfigFlow").latest_run
        result = [run.successful, dict(run.data.config), "Config loaded:" in run["start"].task.stdout]
    """),
    "tracked_flow": Example("tracked_flow", (("mytrackedflow.py", "run"),
                                             ("mytrackedflow.py", "run", "--with", "card")), _cards("""
        result = []
        for run in sorted(Flow("MyTrackedFlow"), key=lambda r: r.id):
            start = run["start"].task
            got = cards(start)
            result.append([run.successful, sorted(start.data.git_info), start.data.git_info["branch"],
                           dict(start.data.config), "deployment info" in start.stdout,
                           got if isinstance(got, str) else [[c[0], c[1], "Deployment info" in c[2], "Commit" in c[2]]
                                                             for c in got]])
    """), git=True),
    "git_info": Example("git_info", (("git_info.py", "run"),), _cards("""
        start = Flow("GitInfoFlow").latest_run["start"].task
        got = cards(start)
        result = [sorted(start.data.git_info), start.data.git_info["message"],
                  [[c[0], c[1], "Deployment info" in c[2], "Commit" in c[2]] for c in got] if got != str(got) else got]
    """), git=True),
    # visualizing-results
    "cards": Example("cards", (("defaultcard.py", "run"), ("guesscard.py", "run"), ("manycards.py", "run")),
                     _cards("""
        def shown(flow, step, *texts):
            got = cards(Flow(flow).latest_run[step].task)
            return got if isinstance(got, str) else [[c[0], c[1], [t in c[2] for t in texts]] for c in got]

        result = {"default": shown("DefaultCardFlow", "start", "first_key", "second_key"),
                  "default_end": shown("DefaultCardFlow", "end"),
                  "guess": shown("GuessCardFlow", "start", "Guess my number", "larger"),
                  "many": shown("ManyCardsFlow", "start", "I am the first card", "I am the second card")}
    """)),
    # production: @project; scaling: tagging and current
    "project": Example("project", (("project_flow.py", "run"), ("project_flow.py", "--production", "run"),
                                   ("project_flow.py", "--branch", "better_version", "run"),
                                   ("project_flow.py", "--branch", "better_version", "--production", "run"))),
    "tagging": Example("tagging", (("current_flow.py", "run"), ("current_flow.py", "resume", "start"),
                                   ("helloworld.py", "run", "--tag", "crazy_test"),
                                   ("helloworld.py", "tag", "remove", "--run-id", "{last_run}", "crazy_test"),
                                   ("helloworld.py", "tag", "add", "--run-id", "{last_run}", "crazy_test"),
                                   ("helloworld.py", "tag", "list")), """
        from metaflow import Flow
        runs = sorted(Flow("CurrentFlow"), key=lambda r: r.id)
        tagged = list(Flow("HelloFlow").runs("crazy_test"))[0]
        result = {"current": [[ln.split(":")[0] for ln in r["start"].task.stdout.splitlines()] for r in runs],
                  "origin": [r["start"].task.stdout.split("origin run id: ")[1].split()[0] == want
                             for r, want in zip(runs, ["None", runs[0].id])],
                  "tagged": [tagged.id == Flow("HelloFlow").latest_run.id, "crazy_test" in tagged.user_tags]}
    """, helloworld=True),
    # scaling/failures: @exit_hook after a run that succeeded and one that failed
    "exit_hook": Example("exit_hook", (("exithookflow.py", "run"),
                                       ("exithookflow.py", "run", "--should-fail", "True"))),
    # production: decorators that act where a flow is deployed; `run` ignores them
    "deploy": Example("deploy", (("hourlyflow.py", "run"), ("freshdataflow.py", "run"), ("secondflow.py", "run"))),
    # managing-flows: Runner
    "runner": Example("runner", (("run_status.py",), ("run_tags.py",)), """
        from metaflow import Flow
        result = [sorted(r.user_tags) for r in sorted(Flow("SlowFlow"), key=lambda r: r.id)]
    """),
}


@pytest.fixture(scope="module")
def played(engines, tmp_path_factory) -> dict[str, dict[str, Played]]:
    only = os.environ.get("STOKER_DOC_EXAMPLES")  # while working on some: their keys, comma-separated
    chosen = {k: v for k, v in EXAMPLES.items() if not only or k in only.split(",")}
    return play_all(engines, chosen, tmp_path_factory.mktemp("docs"))


def _text(runs: dict[str, Played]) -> str:
    return "\n".join(f"=== {n}\n{p.text()}" for n, p in runs.items())


def _exits(runs: dict[str, Played]) -> dict[str, list[int]]:
    return {n: p.exits for n, p in runs.items()}


_TASK_PREFIX = re.compile(r"^(?:\d{4}-\d\d-\d\d [\d:.]+ )?\[[^\]]*/[^\]]*\] ")  # Metaflow's and stoker's


def _lines(runs: dict[str, Played], mark: str, i: int = -1) -> dict[str, list[str]]:
    """The distinct lines with `mark` (a task's log prefix dropped: Metaflow prints a mutator's lines per process)."""
    return {n: sorted({_TASK_PREFIX.sub("", ln).strip() for ln in p.output(i).splitlines() if mark in ln})
            for n, p in runs.items()}


def _steps(result: dict, mark: str) -> dict[str, int]:
    return {s: sum(mark in out for out in outs) for s, outs in result["stdout"].items()}


def test_custom_decorator(played, request):
    """custom-decorators: `@my_profile` imported by the flow times the foreach steps that carry it."""
    runs = played["profile"]
    compare(request, "exit status", _exits(runs), [0])
    compare(request, "tasks that printed a timing, per step",
            {n: _steps(p.result, "⏰ Task [") for n, p in runs.items()}, {"start": 0, "wait": 5, "join": 0, "end": 0})


def test_custom_decorator_with(played, request):
    """custom-decorators: `run --with myprofiler.my_profile` adds it to every step (once where the flow has it)."""
    runs = played["profile_with"]
    compare(request, "exit status", _exits(runs), [0])
    compare(request, "tasks that printed a timing, per step",
            {n: _steps(p.result, "⏰ Task [") for n, p in runs.items()}, {"start": 1, "wait": 5, "join": 1, "end": 1})


def test_decorator_state_in_artifacts(played, request):
    """custom-decorators: `--with statsprofiler.stats_profile:silent=1` merges timings through the join; silent."""
    runs = played["stats_profile"]
    compare(request, "exit status", _exits(runs), [0])
    compare(request, "timings per step, the artifact's type, whether the end printed them",
            {n: p.result for n, p in runs.items()}, [True, "defaultdict", {"start": 5, "wait": 5, "join": 1, "end": 1},
                                                     False])


def test_decorator_api_for_user_code(played, request):
    """custom-decorators: `@trace_profile` gives the step `self.trace` and deletes it before the artifacts are kept."""
    runs = played["trace"]
    compare(request, "exit status", _exits(runs), [0])
    compare(request, "timings of the traced sections; no `trace` artifact", {n: p.result for n, p in runs.items()},
            [["database access", "process data"], True, True, False])


def test_decorator_catches_a_failure(played, request):
    """advanced-custom-decorators: `@ai_debug` sees the step's exception, prints, re-raises: the run fails."""
    runs = played["ai_debug"]
    compare(request, "exit status is not 0", {n: p.exits[0] != 0 for n, p in runs.items()}, True)
    compare(request, "the decorator's lines", _lines(runs, "Step failed:"), check=lambda v: len(v) == 1)
    compare(request, "no API key: the decorator says so", {n: "Specify OPENAI_API_KEY" in p.output()
                                                            for n, p in runs.items()}, True)


def _fell_back(runs: dict[str, Played]) -> dict[str, list]:
    """[the run ended before its time limit, the fallback ran]. (Metaflow 2.19.39 then fails the run: the fallback
    function calls no self.next, 'self.next() was called with .'; its exit status is not compared.)"""
    return {n: [p.exits[0] != 124, "step failed: executing a fallback" in p.output()] for n, p in runs.items()}


def test_fallback_with_retry(played, request):
    """advanced-custom-decorators: `run --with retry --with fallback.fallback:indicator=failed` runs the fallback
    on the retry."""
    compare(request, "the run ended within 40 s and ran the fallback", _fell_back(played["fallback"]), [True, True])


def test_flow_mutator_adds_retry_and_fallback(played, request):
    """mutators: `@robust_flow(fallback_indicator='failed')` adds @retry and @fallback to every step."""
    compare(request, "the run ended within 40 s and ran the fallback", _fell_back(played["robust_flow"]),
            [True, True])


def test_flow_linter_mutator(played, request):
    """mutators: `@flow_linter` reads a Config and lowers `@resources` above its limits (`--with resources:...`)."""
    runs = played["flow_linter"]
    compare(request, "exit status", _exits(runs), [0])
    compare(request, "the linter's warnings", _lines(runs, "⚠️"), check=lambda v: len(v) == 2)
    compare(request, "the linter's warnings, as printed", _lines(runs, "⚠️"))


def test_config_in_a_decorator(played, request):
    """basic-configuration: `@timeout(seconds=config.timeout)` fails the 7 s step; `--config config FILE` fixes it."""
    runs = played["timeout_config"]
    compare(request, "exit status of each command", {n: [e != 0 for e in p.exits] for n, p in runs.items()},
            [True, False])
    compare(request, "the step printed the config's timeout", {n: "timing out after 5 seconds" in p.output(0)
                                                               for n, p in runs.items()}, True)
    compare(request, "[successful] per run, the config of the successful one", {n: p.result for n, p in runs.items()},
            check=lambda v: sorted(v[0]) == [False, True] and v[1] == {"timeout": 10})


def test_config_value_from_the_environment(played, request):
    """basic-configuration: `METAFLOW_FLOW_CONFIG_VALUE='{"config": {"timeout": 3}}' python timeout_config.py run`."""
    runs = played["config_env"]
    compare(request, "the step printed the timeout from the environment",
            {n: "timing out after 3 seconds" in p.output() for n, p in runs.items()}, True)


def test_config_value_option(played, request):
    """basic-configuration: `python timeout_config.py --config-value config '{"timeout": 3}' run`."""
    runs = played["config_value"]
    compare(request, "the step printed the timeout given", {n: "timing out after 3 seconds" in p.output()
                                                            for n, p in runs.items()}, True)


def test_toml_config_with_a_dotted_parser(played, request):
    """parsing-configs: `Config(..., parser="tomllib.loads")` (a parser named by a string) feeds `@resources`."""
    runs = played["toml_config"]
    compare(request, "exit status", _exits(runs), [0])
    compare(request, "the parsed config", {n: p.result for n, p in runs.items()},
            [True, {"general": {"a": 5}, "resources": {"cpu": 1}}, True])


def test_parser_generating_a_config_and_a_card(played, request):
    """custom-parsers: `Config(default_value="", parser=git_info)` runs git; a blank card with id "git" shows it."""
    runs = played["git_info"]
    compare(request, "exit status", _exits(runs), [0])
    compare(request, "git_info's keys, the commit message, the card", {n: p.result for n, p in runs.items()},
            [["branch", "commit", "message"], "docs", [["git", "blank", True, True]]])


def test_flowspec_template_card_guard(played, request):
    """custom-parsers: a TrackedFlowSpec base adds a Config; its `hasattr(current, "card")` guard adds a card only
    `--with card`."""
    runs = played["tracked_flow"]
    compare(request, "exit status of `run` and `run --with card`", _exits(runs), [0, 0])
    compare(request, "per run: git_info, config, output, the start step's cards",
            {n: p.result for n, p in runs.items()},
            [[True, ["branch", "commit", "message"], "main", {"timeout": 5}, True, "CardNotPresentException"],
             [True, ["branch", "commit", "message"], "main", {"timeout": 5}, True, [["", "default", True, True]]]])
    compare(request, "no warning about current.card", {n: "card" in p.output(0).lower() for n, p in runs.items()},
            False)


def test_cards(played, request):
    """default-cards and card-components: the default card, a blank card with Markdown, two cards with ids;
    get_cards of a task without a card raises CardNotPresentException."""
    runs = played["cards"]
    compare(request, "exit status", _exits(runs), [0, 0, 0])
    compare(request, "[id, type, texts shown] of each card", {n: p.result for n, p in runs.items()},
            {"default": [["", "default", [True, True]]], "default_end": "CardNotPresentException",
             "guess": [["", "blank", [True, True]]],
             "many": [["first", "blank", [True, False]], ["second", "blank", [False, True]]]})


def test_project_branches(played, request):
    """coordinating-larger-metaflow-projects: `run`, `--production run`, `--branch better_version [--production]
    run`."""
    runs = played["project"]
    compare(request, "exit status", _exits(runs), [0, 0, 0, 0])
    marks = ("project name:", "project branch:", "is this a production run?")
    got = {n: [[t for t in (_TASK_PREFIX.sub("", ln).strip() for ln in p.output(i).splitlines()) if t.startswith(marks)]
               for i in range(4)] for n, p in runs.items()}
    compare(request, "what each run printed of current.project_name, branch_name and is_production", got, [
        ["project name: example_project", f"project branch: {b}", f"is this a production run? {prod}"]
        for b, prod in (("user.tester", False), ("prod", True), ("test.better_version", False),
                        ("prod.better_version", True))])


def test_current_and_tags(played, request):
    """tagging: `current`'s ids in a step, `resume start`'s origin run id; `run --tag`, `tag remove|add|list`,
    `Flow.runs(tag)`."""
    runs = played["tagging"]
    compare(request, "exit status of each command", _exits(runs), [0, 0, 0, 0, 0, 0])
    compare(request, "what the start step printed (names), origin run ids, the tagged run",
            {n: p.result for n, p in runs.items()})
    one = runs["stoker"].result
    assert one["origin"] == [True, True] and one["tagged"] == [True, True], _text(runs)


def test_runner(played, request):
    """runner: `Runner('slowflow.py', show_output=False).run(seconds=5)`'s status, stdout and data; tags."""
    runs = played["runner"]
    compare(request, "exit status of the two scripts", _exits(runs), [0, 0])
    compare(request, "the first script's lines", {n: [ln.split(" ")[0] for ln in p.output(0).splitlines()
                                                     if ln.startswith(("✅", "❌", "⏰", "--"))]
                                                 for n, p in runs.items()}, ["✅", "--", "--", "⏰"])
    compare(request, "the flow waited", {n: "The flow waited for 5 seconds" in p.output(0) for n, p in runs.items()},
            True)
    compare(request, "user tags of the runs", {n: p.result for n, p in runs.items()},
            [[], ["another_tag", "myrun"]])


def test_exit_hooks(played, request):
    """scaling/failures: @exit_hook runs `success_print` after a run that succeeded, and `failure_print(run)`
    after one that failed, naming the failed task from the client's Run."""
    runs = played["exit_hook"]
    compare(request, "exit statuses", _exits(runs), [0, 1])
    compare(request, "the success hook's line", _lines(runs, "Flow completed", 0), ["✅ Flow completed successfully!"])
    failed = {n: [re.sub(r"/\d+", "/N", ln) for ln in lines] for n, lines in _lines(runs, "💥", 1).items()}
    compare(request, "the error hook's line", failed, ["💥 Run ExitHookFlow/N failed. Failed tasks:"])
    compare(request, "the failed task it names", {n: len(v) for n, v in _lines(runs, "→", 1).items()}, 1)


def test_deploy_only_decorators_are_ignored_by_run(played, request):
    """scheduling / event-triggering: @schedule, @trigger and @trigger_on_finish flows run with `run`."""
    runs = played["deploy"]
    compare(request, "exit statuses", _exits(runs), [0, 0, 0])
    compare(request, "the trigger flow's line", _lines(runs, "processing fresh data", 1), ["processing fresh data!"])
