"""Metaflow's own tutorials 00-03, copied from the installed metaflow wheel and run with their READMEs' commands.

Flows this project did not write: `metaflow/tutorials/` of the Metaflow venv is copied at test time (nothing of it
is committed), the `from metaflow import` lines are changed for stoker, and each episode runs as its README.md
says, from the tutorials folder (`python 01-playlist/playlist.py run --genre comedy`), all in one home per engine
so that 03 reads 02's latest successful run. Random picks differ between engines; what is compared is what is
deterministic: the playlists as sets, the bonus pick's genre, 02's statistics exactly.
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.compat.conftest import compare
from tests.compat.engines import ENGINES, Engine, FlowRun, metaflow_tutorials, run_command

pytestmark = pytest.mark.slow

EPISODES = ("00-helloworld", "01-playlist", "02-statistics", "03-playlist-redux")
# Each README's "To play this episode" commands (the notebooks left out), in the order a user runs them.
COMMANDS = (
    ("00-helloworld/helloworld.py", "show"), ("00-helloworld/helloworld.py", "run"),
    ("01-playlist/playlist.py", "show"), ("01-playlist/playlist.py", "run"),
    ("01-playlist/playlist.py", "run", "--genre", "comedy"),
    ("02-statistics/stats.py", "show"), ("02-statistics/stats.py", "run"),
    ("03-playlist-redux/playlist.py", "show"), ("03-playlist-redux/playlist.py", "run"),
)


def copy_tutorials(src: Path, dst: Path, engine: Engine) -> None:
    for episode in EPISODES:
        shutil.copytree(src / episode, dst / episode, ignore=shutil.ignore_patterns("__pycache__", "*.ipynb"))
        for py in (dst / episode).glob("*.py"):
            py.write_text(engine.source(py.read_text()))


@pytest.fixture(scope="module")
def played(engines, tmp_path_factory) -> dict[str, dict[str, FlowRun]]:
    """{engine: {"episode/file.py command args": FlowRun}}: every README command, in order, one home per engine."""
    src = metaflow_tutorials(engines["metaflow"])
    folders = {n: tmp_path_factory.mktemp("tutorials") / "metaflow-tutorials" for n in ENGINES}

    def play(name: str) -> dict[str, FlowRun]:
        folder = folders[name]
        copy_tutorials(src, folder, engines[name])
        runs = {" ".join(argv): run_command(engines[name], list(argv), folder, folder.parent / "home", timeout=120)
                for argv in COMMANDS}
        (folder.parent / "outputs.log").write_text("".join(f"=== {c} (exit {r.proc.returncode})\n{r.output}\n"
                                                           for c, r in runs.items()))
        return runs

    with ThreadPoolExecutor(len(ENGINES)) as pool:  # the engines side by side: each mostly waits on its tasks
        return dict(zip(ENGINES, pool.map(play, ENGINES), strict=True))


def _runs(played, command: str) -> dict[str, FlowRun]:
    return {n: played[n][command] for n in ENGINES}


def _exit(runs: dict[str, FlowRun]) -> dict[str, int]:
    return {n: r.proc.returncode for n, r in runs.items()}


def _fail_text(runs: dict[str, FlowRun]) -> str:
    return "\n".join(f"--- {n} (exit {r.proc.returncode})\n{r.output[-3000:]}" for n, r in runs.items())


_SHOWN = {  # each step and the first line of its docstring
    "00-helloworld/helloworld.py show": {"start": "This is the 'start' step.", "hello": "A step for metaflow to",
                                         "end": "This is the 'end' step."},
    "01-playlist/playlist.py show": {"start": "Parse the CSV file", "bonus_movie": "This step chooses a random",
                                     "genre_movies": "Filter the movies by genre.", "join": "Join our parallel",
                                     "end": "Print out the playlist"},
    "02-statistics/stats.py show": {"start": "The start step:", "compute_statistics": "Compute statistics for a",
                                    "join": "Join our parallel branches", "end": "End the flow."},
    "03-playlist-redux/playlist.py show": {"start": "Use the Metaflow client", "bonus_movie": "This step chooses a",
                                           "genre_movies": "Select the top performing", "join": "Join our parallel",
                                           "end": "Print out the playlist"},
}


def _shown(text: str, steps: dict[str, str]) -> list[str]:
    """The steps whose `Step NAME` line is followed (before the next step) by its docstring's first line."""
    parts = re.split(r"(?m)^Step (\w+)", text)  # [before, name, body, name, body, ...]
    bodies = dict(zip(parts[1::2], parts[2::2], strict=True))
    return [s for s, doc in steps.items() if doc in bodies.get(s, "")]


@pytest.mark.parametrize("command", sorted(_SHOWN))
def test_show(played, request, command):
    """`show` of each episode prints every step with its docstring's first line."""
    runs = _runs(played, command)
    compare(request, f"{command}: exit status", _exit(runs), 0)
    steps = _SHOWN[command]
    compare(request, f"{command}: every step with its docstring", {n: _shown(r.proc.stdout, steps)
                                                                   for n, r in runs.items()}, list(steps))


def test_show_prints_whole_docstrings(played, request):
    """`show` prints the flow's docstring and each step's whole docstring."""
    runs = _runs(played, "02-statistics/stats.py show")
    compare(request, "the flow's docstring and a step's last docstring line", {
        n: ["2) Fan-out over genre using Metaflow foreach." in r.output,
            "3) Launches parallel statistics computation for each genre." in r.output]
        for n, r in runs.items()}, [True, True])


def test_helloworld(played, request):
    """00-helloworld: `run` prints Metaflow's greeting from the hello step; the client sees the three steps."""
    runs = _runs(played, "00-helloworld/helloworld.py run")
    compare(request, "exit status", _exit(runs), 0)
    got = {n: r.client("""
        from metaflow import Flow
        run = Flow("HelloFlow").latest_run
        result = [run.successful, sorted(s.id for s in run), run["hello"].task.stdout.strip()]
    """) for n, r in runs.items()}
    compare(request, "successful, steps, the hello step's output", got,
            [True, ["end", "hello", "start"], "Metaflow says: Hi!"])


_PLAYLISTS = """
    from metaflow import Flow
    result = {}
    for run in Flow("PlayListFlow"):
        if not run.successful or "genre_stats" in [a.id for a in run["start"].task]:
            continue  # 03's runs (same flow name) are read by test_playlist_redux
        data, frame = run.data, run["start"].task.data.dataframe
        titles = dict(zip(frame["movie_title"], frame["genres"]))
        result[data.genre] = {
            "recommendations": data.recommendations, "rows": len(titles),
            "playlist": sorted(data.playlist), "in_genre": all(data.genre.lower() in titles[m].lower()
                                                               for m in data.playlist),
            "bonus": [type(data.bonus).__name__, len(data.bonus), titles.get(data.bonus[0]) == data.bonus[1],
                      data.genre.lower() in data.bonus[1].lower()],
            "movie_data_lines": len(data.movie_data.splitlines()),
            "end_artifacts": sorted(a.id for a in run["end"].task if not a.id.startswith("_") and a.id != "name"),
            "printed": [ln for ln in run["end"].task.stdout.splitlines() if ln.startswith(("Playlist", "Pick"))],
        }
"""


def test_playlist(played, request):
    """01-playlist: `run` and `run --genre comedy` build the same playlists (as sets) from the IncludeFile'd CSV."""
    for command in ("01-playlist/playlist.py run", "01-playlist/playlist.py run --genre comedy"):
        compare(request, f"{command}: exit status", _exit(_runs(played, command)), 0)
    runs = _runs(played, "01-playlist/playlist.py run --genre comedy")
    got = {n: r.client(_PLAYLISTS) for n, r in runs.items()}
    for genre in ("Sci-Fi", "comedy"):
        each = {n: {k: v for k, v in g[genre].items() if k != "printed"} for n, g in got.items()}
        compare(request, f"genre {genre}: playlist (as a set), bonus pick, parameters, CSV", each)
        one = each["stoker"]
        assert one["in_genre"] and one["recommendations"] == 5 and one["playlist"], _fail_text(runs)
        assert one["bonus"] == ["tuple", 2, True, False], one["bonus"]
        printed = {n: [g[genre]["printed"][0], len(g[genre]["printed"])] for n, g in got.items()}
        compare(request, f"genre {genre}: the end step prints the genre and 5 picks", printed,
                [f"Playlist for movies in genre '{genre}'", 6])


_STATS = """
    import hashlib, json
    from metaflow import Flow
    run = Flow("MovieStatsFlow").latest_successful_run
    stats = run.data.genre_stats
    result = {"genres": sorted(stats), "tasks": len(list(run["compute_statistics"])),
              "quartiles": {g: v["quartiles"] for g, v in sorted(stats.items())},
              "dataframes": hashlib.sha256(json.dumps({g: v["dataframe"] for g, v in stats.items()},
                                                      sort_keys=True).encode()).hexdigest(),
              "start_genres": sorted(run["start"].task.data.genres), "run": run.id}
"""


def test_statistics(played, request):
    """02-statistics: a foreach over every genre; the joined genre_stats (quartiles, sorted frames) are equal."""
    runs = _runs(played, "02-statistics/stats.py run")
    compare(request, "exit status", _exit(runs), 0)
    got = {n: r.client(_STATS) for n, r in runs.items()}
    compare(request, "genres, one task per genre, quartiles and per-genre frames",
            {n: {k: v for k, v in g.items() if k != "run"} for n, g in got.items()})
    one = got["stoker"]
    assert one["tasks"] == len(one["start_genres"]) == len(one["genres"]) > 10, one
    assert one["quartiles"]["sci-fi"] == sorted(one["quartiles"]["sci-fi"]), one["quartiles"]["sci-fi"]


_REDUX = """
    from metaflow import Flow
    stats = Flow("MovieStatsFlow").latest_successful_run
    run = Flow("PlayListFlow").latest_run
    data, genre_stats = run.data, stats.data.genre_stats
    top = genre_stats["sci-fi"]
    frame = dict(zip(top["dataframe"]["movie_title"], top["dataframe"]["gross"]))
    result = {"successful": run.successful, "same_stats": run["start"].task.data.genre_stats == genre_stats,
              "playlist": sorted(data.playlist),
              "top_quartile": all(frame[m] >= top["quartiles"][-1] for m in data.playlist),
              "bonus_not_genre": "sci-fi" not in data.bonus[1].lower(),
              "names_stats_run": f"MovieStatsFlow/{stats.id}" in run["start"].task.stdout}
"""


def test_playlist_redux(played, request):
    """03-playlist-redux reads 02's latest successful run through the client and recommends its top quartile."""
    runs = _runs(played, "03-playlist-redux/playlist.py run")
    compare(request, "exit status", _exit(runs), 0)
    got = {n: r.client(_REDUX) for n, r in runs.items()}
    compare(request, "genre_stats from 02, top-quartile playlist (as a set), bonus genre", got)
    assert got["stoker"]["playlist"] and all(v is True for k, v in got["stoker"].items() if k != "playlist"), \
        _fail_text(runs)
