"""`stoker image`: Dockerfiles as golden files (regenerate with STOKER_UPDATE_GOLDEN=1), the kind a flow needs,
the deterministic build context and its content tag, and the docker/ECR commands.

There is no Docker daemon here, so `docker build/login/push` run through an injected runner that records their
argv (and stdin) and answers like docker; the ECR login's token comes from the real ecr:GetAuthorizationToken
call against moto's server on loopback (fixture `aws`). The daemon check is also run against the real docker
CLI where one is installed without a daemon, as on this machine.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stoker.backends.aws.image import (
    NEURON_DLC_TAG,
    NO_REPOSITORY,
    BuildPlan,
    ImageSpec,
    build_wheel,
    check_docker,
    content_tag,
    docker_login,
    ecr_password,
    flow_kind,
    parse_repository,
    plan_build,
    prepare_context,
    pushed_digest,
    read_requirements,
    render_dockerfile,
    resolved_pins,
    run_plan,
    source_root,
    wheel_digest,
)
from stoker.cli.errors import run_cli
from stoker.cli.image import load_flow_class, register
from stoker.errors import BackendError, ConfigError

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "aws_image"
REPO = "123456789012.dkr.ecr.us-east-1.amazonaws.com/stoker"

CASES = {
    "cpu": dict(kind="cpu"),
    "cpu_pypi": dict(kind="cpu", from_pypi=True),
    "gpu": dict(kind="gpu"),
    "gpu_efa_cu128": dict(kind="gpu", efa=True, torch_index="https://download.pytorch.org/whl/cu128"),
    "neuron": dict(kind="neuron", efa=True),
    "neuron_regional": dict(kind="neuron", base_region="us-west-2", base_tag="2.9.0-neuronx-py312-sdk2.28.0-"
                            "ubuntu24.04", user="stoker"),
    "neuron_requirements": dict(kind="neuron", efa=True, requirements=True),
    "cpu_unpinned": dict(kind="cpu", pins=False),
}
# examples/training/llama/requirements.txt of aws-neuron/neuronx-distributed at its Neuron 2.29 release
NXD_LLAMA_REQUIREMENTS = ("transformers==4.48.0\nregex\ntensorboard\ndatasets<=3.6.0\nsentencepiece\ntenacity\n"
                          "s3transfer\nawscrt\nhuggingface-hub>=0.27.1\n")


def spec(name: str) -> ImageSpec:
    return ImageSpec(stoker_version="0.1.0", **CASES[name])


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_dockerfiles(name):
    text = render_dockerfile(spec(name))
    path = GOLDEN / f"{name}.Dockerfile"
    if os.environ.get("STOKER_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with STOKER_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name}: the Dockerfile changed; if on purpose, rerun with STOKER_UPDATE_GOLDEN=1"
    assert text == render_dockerfile(spec(name))  # deterministic


def test_dockerfile_shape():
    cpu, gpu, neuron = (render_dockerfile(spec(n)) for n in ("cpu", "gpu_efa_cu128", "neuron"))
    assert cpu.startswith("# stoker image, kind cpu") and "FROM python:3.11-slim\n" in cpu
    assert "--index-url https://download.pytorch.org/whl/cpu torch==2.13.0" in cpu
    assert "COPY stoker-0.1.0-py3-none-any.whl pins.txt /tmp/stoker/" in cpu
    assert '"/tmp/stoker/stoker-0.1.0-py3-none-any.whl[train,data,aws]"' in cpu
    assert "USER stoker\nWORKDIR /workspace\n" in cpu
    assert f"FROM public.ecr.aws/neuron/pytorch-training-neuronx:{NEURON_DLC_TAG}\n" in neuron
    assert "efa_installer" not in neuron and "USER" not in neuron  # the DLC has EFA; Neuron tools run as root
    assert "efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify" in gpu and "/opt/venv/bin" in gpu
    assert "--index-url https://download.pytorch.org/whl/cu128 torch==2.13.0" in gpu
    pypi = render_dockerfile(spec("cpu_pypi"))
    assert '"stoker[train,data,aws]==0.1.0"' in pypi and "COPY pins.txt /tmp/stoker/" in pypi
    for text in (cpu, gpu, neuron, pypi):
        assert "CMD" not in text.replace("# No CMD", "") and "ENTRYPOINT" not in text
        # the base image's torch build stays; stoker's dependencies are the builder's versions
        assert "--constraint /tmp/stoker/keep.txt --constraint /tmp/stoker/pins.txt" in text
        assert not any(w in text.lower() for w in ("aws_secret", "password", "token"))
        assert "requirements" not in text
    unpinned = render_dockerfile(spec("cpu_unpinned"))
    assert "pins.txt" not in unpinned and "COPY stoker-0.1.0-py3-none-any.whl /tmp/stoker/" in unpinned
    req = render_dockerfile(spec("neuron_requirements"))
    assert "COPY stoker-0.1.0-py3-none-any.whl pins.txt requirements.txt /tmp/stoker/" in req
    # after stoker, holding only the base image's builds: the script's pins (transformers==4.48.0) win
    stoker_at, req_at = req.index("[train,data,aws]"), req.index(
        "pip install --no-cache-dir --constraint /tmp/stoker/keep.txt --requirement /tmp/stoker/requirements.txt")
    assert stoker_at < req_at < req.index("rm -rf /tmp/stoker")


def test_spec_is_validated():
    with pytest.raises(ConfigError, match="use one of cpu, gpu, neuron"):
        ImageSpec(kind="tpu")
    with pytest.raises(ConfigError, match="--base-region 'moon': use an AWS region name"):
        ImageSpec(kind="neuron", base_region="moon")
    with pytest.raises(ConfigError, match="without spaces or quotes"):
        ImageSpec(kind="cpu", base="python:3.11; rm -rf /")
    with pytest.raises(ConfigError, match="--user 'Bad User'"):
        ImageSpec(kind="cpu", user="Bad User")
    s = ImageSpec(kind="neuron", base_region="eu-west-1")
    assert s.base_image == f"763104351884.dkr.ecr.eu-west-1.amazonaws.com/pytorch-training-neuronx:{NEURON_DLC_TAG}"
    assert s.login_registries == ["763104351884.dkr.ecr.eu-west-1.amazonaws.com"]
    assert ImageSpec(kind="neuron").login_registries == [] and ImageSpec(kind="neuron").user == "root"
    assert ImageSpec(kind="gpu", base="my/cuda:1").base_image == "my/cuda:1"


# -- the kind a flow needs ---------------------------------------------------------------------------------------

FLOW = '''
from stoker import FlowSpec, batch, resources, step


class Demo(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=4)

    {train_decorators}
    @step
    def train(self):
        self.next(self.join)

    @step
    def join(self, inputs):
        self.next(self.end)

    {end_decorators}
    @step
    def end(self):
        pass


{main}
'''


def flow_file(tmp_path, train="", end="", main='if __name__ == "__main__":\n    Demo()') -> str:
    path = tmp_path / "demo_flow.py"
    path.write_text(FLOW.format(train_decorators=train, end_decorators=end, main=main))
    return str(path)


def test_kind_follows_the_batch_steps(tmp_path):
    cls = load_flow_class(flow_file(tmp_path, train="@batch(trainium=16, efa=8)", end="@batch(cpu=2)"))
    assert cls.__name__ == "Demo"
    assert flow_kind(cls) == ("neuron", True, {"end": "cpu", "train": "neuron"})
    assert flow_kind(cls, "end") == ("cpu", False, {"end": "cpu"})
    with pytest.raises(ConfigError, match="--step nope: the flow Demo has no such step; its steps: end, join"):
        flow_kind(cls, "nope")


def test_kind_without_batch_steps_follows_resources(tmp_path):
    cls = load_flow_class(flow_file(tmp_path, train="@resources(gpu=8)"))
    assert flow_kind(cls)[:2] == ("gpu", False)
    cls = load_flow_class(flow_file(tmp_path, train="@batch(instance_type='p5.48xlarge', efa=32)"))
    assert flow_kind(cls)[:2] == ("gpu", True)  # the instance type tells the devices


def test_neuron_and_cuda_steps_need_two_images(tmp_path):
    cls = load_flow_class(flow_file(tmp_path, train="@batch(trainium=16)", end="@batch(gpu=1)"))
    with pytest.raises(ConfigError, match=r"end \(gpu\), train \(neuron\) need different images: build one per "
                                          r"step with --step STEP"):
        flow_kind(cls)


def test_loading_a_flow_file_never_runs_it(tmp_path, capsys):
    argv, entries = list(sys.argv), list(__import__("stoker.flow.spec", fromlist=["x"])._entries)
    cls = load_flow_class(flow_file(tmp_path, main="Demo()  # not guarded: called at import"))
    assert cls.__name__ == "Demo" and sys.argv == argv
    assert __import__("stoker.flow.spec", fromlist=["x"])._entries == entries
    cls = load_flow_class(flow_file(tmp_path, main=""))  # no call at all: the one FlowSpec class defined
    assert cls.__name__ == "Demo"
    with pytest.raises(ConfigError, match="no such file"):
        load_flow_class(str(tmp_path / "missing.py"))
    assert capsys.readouterr().out == ""


# -- the build context -------------------------------------------------------------------------------------------

def fake_wheel(path: Path, date=(2020, 1, 1, 0, 0, 0), body=b"print('hi')\n") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in (("stoker/__init__.py", body), ("stoker-0.1.0.dist-info/METADATA", b"Name: stoker\n")):
            z.writestr(zipfile.ZipInfo(name, date_time=date), data)
    return path


def test_wheel_digest_ignores_zip_timestamps(tmp_path):
    a = wheel_digest(fake_wheel(tmp_path / "a.whl"))
    assert a == wheel_digest(fake_wheel(tmp_path / "b.whl", date=(2024, 5, 6, 7, 8, 10)))
    assert a != wheel_digest(fake_wheel(tmp_path / "c.whl", body=b"print('changed')\n"))


def test_context_is_deterministic_and_tagged_by_content(tmp_path):
    wheel = fake_wheel(tmp_path / "stoker-0.1.0-py3-none-any.whl")
    one = prepare_context(spec("cpu"), tmp_path / "one", wheel=wheel)
    two = prepare_context(spec("cpu"), tmp_path / "two", wheel=wheel)
    assert one.tag == two.tag and one.tag.startswith("cpu-") and len(one.tag) == 20
    assert sorted(p.name for p in one.path.iterdir()) == ["Dockerfile", "pins.txt", "stoker-0.1.0-py3-none-any.whl"]
    assert (one.path / "Dockerfile").read_text() == render_dockerfile(spec("cpu"))
    assert prepare_context(spec("gpu"), tmp_path / "three", wheel=wheel).tag != one.tag
    other = fake_wheel(tmp_path / "other.whl", body=b"x = 1\n")
    assert prepare_context(spec("cpu"), tmp_path / "four", wheel=other).tag != one.tag
    pypi = prepare_context(spec("cpu_pypi"))  # default folder: $STOKER_HOME/images/TAG
    assert pypi.path.name == pypi.tag and sorted(p.name for p in pypi.path.iterdir()) == ["Dockerfile", "pins.txt"]
    assert content_tag("cpu", "FROM x\n", {}) == content_tag("cpu", "FROM x\n", {})
    with pytest.raises(ConfigError, match="--wheel .*nope.whl: no such file"):
        prepare_context(spec("cpu"), tmp_path / "five", wheel=tmp_path / "nope.whl")


def test_pins_follow_stokers_dependency_closure():
    requires = ["numpy>=1.24", "rich>=13", "tomli>=2.0; python_version < '3.11'", 'torch>=2.4; extra == "train"',
                'transformers>=4.40; extra == "train"', 'boto3>=1.34; extra == "aws"', 'pytest>=8; extra == "dev"']
    installed = {"rich": ("14.0.0", ["markdown-it-py>=2.2", 'ipywidgets>=7; extra == "jupyter"']),
                 "markdown-it-py": ("3.0.0", ["mdurl~=0.1"]), "mdurl": ("0.1.2", []),
                 "transformers": ("4.57.1", ["tokenizers<=0.23,>=0.22", "huggingface-hub[hf-xet]>=0.34",
                                             'torch>=2.2; extra == "torch"']),
                 "tokenizers": ("0.22.1", []), "boto3": ("1.40.0", ["botocore<1.41,>=1.40"]),
                 "botocore": ("1.40.2", [])}
    asked: list[str] = []

    def lookup(name):
        asked.append(name)
        return installed.get(name)

    pins, missing = resolved_pins(requires, "train,data,aws", keep="torch|numpy", installed=lookup)
    assert pins == {"boto3": "1.40.0", "botocore": "1.40.2", "markdown-it-py": "3.0.0", "mdurl": "0.1.2",
                    "rich": "14.0.0", "tokenizers": "0.22.1", "transformers": "4.57.1"}
    assert missing == ["huggingface-hub", "tomli"]  # not installed here: left to pip, and said so
    # the base image's builds are neither pinned nor followed; extras nobody asked for are not followed
    assert not {"torch", "numpy", "pytest", "ipywidgets"} & set(asked)


def test_context_with_pins_and_the_scripts_requirements(tmp_path):
    wheel = fake_wheel(tmp_path / "stoker-0.1.0-py3-none-any.whl")
    req = tmp_path / "requirements.txt"
    req.write_text(NXD_LLAMA_REQUIREMENTS)
    pins = ({"rich": "14.0.0", "transformers": "4.57.1"}, ["tomli"])
    ctx = prepare_context(spec("neuron_requirements"), tmp_path / "a", wheel=wheel, requirements=req, pins=pins)
    assert ctx.files == ["pins.txt", "requirements.txt", "stoker-0.1.0-py3-none-any.whl"]
    assert (ctx.path / "requirements.txt").read_text() == NXD_LLAMA_REQUIREMENTS
    text = (ctx.path / "pins.txt").read_text()
    assert "rich==14.0.0\ntransformers==4.57.1\n" in text and "not pinned: tomli" in text
    assert ctx.unpinned == ["tomli"]
    # the tag follows the content of every file: other requirements or other pins, another image
    again = prepare_context(spec("neuron_requirements"), tmp_path / "b", wheel=wheel, requirements=req, pins=pins)
    assert again.tag == ctx.tag
    req.write_text(NXD_LLAMA_REQUIREMENTS.replace("4.48.0", "4.49.0"))
    assert prepare_context(spec("neuron_requirements"), tmp_path / "c", wheel=wheel, requirements=req,
                           pins=pins).tag != ctx.tag
    assert prepare_context(spec("neuron_requirements"), tmp_path / "d", wheel=wheel, requirements=req,
                           pins=({"rich": "14.0.1"}, [])).tag != ctx.tag
    with pytest.raises(ConfigError, match="give both or neither"):
        prepare_context(spec("neuron"), tmp_path / "e", wheel=wheel, requirements=req)


@pytest.mark.parametrize("line", ["-r base.txt", "--requirement=base.txt", "-e .", "./my_pkg", "file:///x.whl",
                                  "-c constraints.txt"])
def test_requirements_must_be_installable_from_the_context(tmp_path, line):
    req = tmp_path / "requirements.txt"
    req.write_text(f"regex\n{line}\n")
    with pytest.raises(ConfigError, match=r"requirements.txt:2: .* the image build cannot see: inline"):
        read_requirements(req)
    req.write_text(NXD_LLAMA_REQUIREMENTS + "# a comment\n--extra-index-url https://example.com/simple\n")
    assert read_requirements(req).startswith("transformers==4.48.0")
    with pytest.raises(ConfigError, match="--requirements .*nope.txt"):
        read_requirements(tmp_path / "nope.txt")


@pytest.mark.slow
def test_a_wheel_of_this_checkout_is_built_reproducibly(tmp_path):
    if importlib.util.find_spec("setuptools") is None:  # not imported here: the build runs in its own process, and
        pytest.skip("setuptools is not installed")  # setuptools' distutils shim fails where stdlib's is loaded
    root = source_root()
    assert root is not None, "the tests run from a checkout (an editable install)"
    snap = tmp_path / "checkout"  # a frozen copy: the checkout may change while the test runs
    shutil.copytree(root / "src", snap / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, snap / name)
    one, two = build_wheel(snap, tmp_path / "one"), build_wheel(snap, tmp_path / "two")
    assert one.name == "stoker-0.1.0-py3-none-any.whl" and one.read_bytes() == two.read_bytes()
    with zipfile.ZipFile(one) as z:
        names = set(z.namelist())
    assert {"stoker/backends/aws/image.py", "stoker/recipes/llama_pretrain.toml"} <= names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    a = prepare_context(spec("cpu"), tmp_path / "a", wheel=one)
    assert a.tag == prepare_context(spec("cpu"), tmp_path / "b", wheel=two).tag
    built = prepare_context(spec("cpu"), tmp_path / "c")  # no --wheel: this checkout is built
    assert (built.path / "stoker-0.1.0-py3-none-any.whl").is_file() and built.tag.startswith("cpu-")


# -- docker and ECR ----------------------------------------------------------------------------------------------

class Docker:
    """Records each docker call (argv, stdin) and answers with the exit code set for that subcommand."""

    DIGEST = "sha256:" + "ab" * 32

    def __init__(self, digests: list[str] | None = None, **codes: int) -> None:
        self.calls: list[tuple[list[str], bytes | None]] = []
        self.codes = codes
        self.digests = digests  # RepoDigests docker reports (default: the pushed repository's)
        self.pushed: set[str] = set()

    def __call__(self, argv, input=None, capture=False):
        self.calls.append((list(argv), input))
        code = self.codes.get(argv[1], 0)
        out = b""
        if argv[1] == "push" and not code:
            self.pushed.add(argv[2].rsplit(":", 1)[0])
        if argv[1] == "image" and not code:  # image inspect: docker records the digest on push
            digests = self.digests if self.digests is not None else [f"{r}@{self.DIGEST}" for r in self.pushed]
            out = json.dumps(digests).encode() + b"\n"
        return subprocess.CompletedProcess(argv, code, out, b"boom\n" if code else b"")

    @property
    def argvs(self) -> list[list[str]]:
        return [a for a, _ in self.calls]


def context(tmp_path, name="cpu"):
    return prepare_context(spec(name), tmp_path / "ctx", wheel=fake_wheel(tmp_path / "w.whl"))


def test_build_and_push_to_ecr_against_moto(aws, tmp_path):
    uri = aws.client("ecr").create_repository(repositoryName="stoker")["repository"]["repositoryUri"]
    ctx = context(tmp_path)
    plan = plan_build(ctx, uri, push=True)
    docker = Docker()
    assert run_plan(plan, runner=docker) == f"{uri}@{Docker.DIGEST}"  # the digest, not a tag that can move
    registry = uri.split("/")[0]
    assert docker.argvs == [
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        ["docker", "login", "--username", "AWS", "--password-stdin", registry],
        ["docker", "build", "--platform", "linux/amd64", "--tag", f"{uri}:{ctx.tag}", "--tag", f"{uri}:latest",
         str(ctx.path)],
        ["docker", "push", f"{uri}:{ctx.tag}"],
        ["docker", "push", f"{uri}:latest"],
        ["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", f"{uri}:{ctx.tag}"],
    ]
    password = docker.calls[1][1]
    assert password == b"123456789012-auth-token"  # moto's token, decoded: only ever on stdin
    assert not any(password.decode() in " ".join(a) for a in docker.argvs)


def test_ecr_password_is_get_authorization_token(aws):
    user, password = ecr_password("123456789012.dkr.ecr.us-east-1.amazonaws.com", "us-east-1")
    token = aws.client("ecr").get_authorization_token()["authorizationData"][0]["authorizationToken"]
    assert f"{user}:{password}" == base64.b64decode(token).decode()
    with pytest.raises(ConfigError, match="not an ECR registry"):
        ecr_password("ghcr.io", "us-east-1")


def test_a_regional_dlc_base_logs_in_to_aws_dlc_registry_first(aws, tmp_path):
    ctx = context(tmp_path, "neuron_regional")
    plan = plan_build(ctx, None, push=False, latest=False)
    assert plan.logins == [("763104351884.dkr.ecr.us-west-2.amazonaws.com", "us-west-2")]
    docker = Docker()
    assert run_plan(plan, runner=docker) == f"stoker:{ctx.tag}"
    assert docker.argvs[1][-1] == "763104351884.dkr.ecr.us-west-2.amazonaws.com"
    assert docker.argvs[2] == ["docker", "build", "--platform", "linux/amd64", "--tag", f"stoker:{ctx.tag}",
                               str(ctx.path)]


def test_dry_run_script(tmp_path):
    ctx = context(tmp_path)
    script = plan_build(ctx, REPO, push=True).script()
    assert script.splitlines() == [
        "aws ecr get-login-password --region us-east-1 | docker login --username AWS --password-stdin "
        "123456789012.dkr.ecr.us-east-1.amazonaws.com",
        f"docker build --platform linux/amd64 --tag {REPO}:{ctx.tag} --tag {REPO}:latest {ctx.path}",
        f"docker push {REPO}:{ctx.tag}",
        f"docker push {REPO}:latest",
        f"# the image to run: REPOSITORY@sha256:..., from docker image inspect --format '{{{{json .RepoDigests}}}}' "
        f"{REPO}:{ctx.tag}",
    ]
    other = plan_build(ctx, "ghcr.io/me/stoker", push=True)
    assert other.logins == []  # not ECR: docker must be logged in already


def test_missing_docker_or_daemon_names_the_fix(tmp_path):
    def missing(argv, input=None, capture=False):
        raise FileNotFoundError("docker")

    with pytest.raises(ConfigError, match=r"docker is not installed: install Docker Engine .* or use --dry-run"):
        check_docker(missing)
    with pytest.raises(ConfigError, match=r"the Docker daemon is not reachable \(boom\)\. Fix: start it"):
        check_docker(Docker(info=1))
    plan = plan_build(context(tmp_path), REPO, push=True)
    docker = Docker(info=1)
    with pytest.raises(ConfigError, match="Docker daemon is not reachable"):
        run_plan(plan, runner=docker)
    assert len(docker.calls) == 1  # nothing else was tried


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI")
def test_the_real_docker_cli_without_a_daemon():
    if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        pytest.skip("a Docker daemon runs here")
    with pytest.raises(ConfigError, match="Docker daemon is not reachable .*Cannot connect to the Docker daemon"):
        check_docker()


def test_docker_failures_are_reported(aws, tmp_path):
    plan = plan_build(context(tmp_path), REPO, push=True)
    with pytest.raises(BackendError, match=r"docker build failed \(exit code 1\): see docker's output above"):
        run_plan(plan, runner=Docker(build=1))
    with pytest.raises(BackendError, match=r"docker push failed .*stoker infra status"):
        run_plan(plan, runner=Docker(push=1))
    with pytest.raises(BackendError, match="docker login 123456789012.dkr.ecr.us-east-1.amazonaws.com failed"):
        docker_login("123456789012.dkr.ecr.us-east-1.amazonaws.com", "us-east-1", Docker(login=1))


def test_the_pushed_digest_is_the_repositorys(tmp_path):
    image = f"{REPO}:cpu-0123456789abcdef"
    other = f"ghcr.io/me/stoker@{Docker.DIGEST}"
    assert pushed_digest(image, Docker(digests=[other, f"{REPO}@{Docker.DIGEST}"])) == f"{REPO}@{Docker.DIGEST}"
    for docker in (Docker(digests=[other]), Docker(digests=[]), Docker(image=1)):
        with pytest.raises(BackendError, match=r"no digest of it in .*aws ecr describe-images .*@batch\(image="):
            pushed_digest(image, docker)


def test_repository_is_required_to_push_and_checked(tmp_path):
    with pytest.raises(ConfigError, match="--push needs a repository: run `stoker infra apply`"):
        plan_build(context(tmp_path), None, push=True)
    assert NO_REPOSITORY.startswith("--push needs a repository")
    assert parse_repository(REPO) == ("123456789012.dkr.ecr.us-east-1.amazonaws.com", "us-east-1")
    assert parse_repository("ghcr.io/me/stoker") == ("ghcr.io", None)
    with pytest.raises(ConfigError, match="without a tag"):
        parse_repository(f"{REPO}:v1")
    assert isinstance(plan_build(context(tmp_path), None, push=False), BuildPlan)


# -- the command line --------------------------------------------------------------------------------------------

def stoker_image(*argv: str) -> int:
    ap = argparse.ArgumentParser(prog="stoker")
    register(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(["image", *argv])
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: args.fn(args))
    return int(e.value.code or 0)


def test_cli_render_prints_the_flows_dockerfile(tmp_path, capsys):
    flow = flow_file(tmp_path, train="@batch(trainium=16, efa=8)")
    assert stoker_image("render", flow) == 0
    assert capsys.readouterr().out == render_dockerfile(ImageSpec(kind="neuron", efa=True))
    assert stoker_image("render", flow, "--kind", "cpu", "--from-pypi") == 0
    assert capsys.readouterr().out == render_dockerfile(ImageSpec(kind="cpu", efa=True, from_pypi=True))
    assert stoker_image("render", "--step", "train") == 1
    assert "--step needs the flow file" in capsys.readouterr().err
    assert stoker_image("render") == 1
    assert "give the flow file (stoker image render flow.py) or --kind" in capsys.readouterr().err
    out = tmp_path / "ctx"
    assert stoker_image("render", flow, "--output", str(out), "--wheel", str(fake_wheel(tmp_path / "w.whl"))) == 0
    assert "tag neuron-" in capsys.readouterr().out and (out / "Dockerfile").is_file()


def test_cli_build_dry_run_and_missing_repository(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("STOKER_IMAGE_REPOSITORY", raising=False)
    wheel = str(fake_wheel(tmp_path / "w.whl"))
    assert stoker_image("build", "--kind", "gpu", "--efa", "--wheel", wheel, "--repository", REPO, "--push",
                        "--dry-run", "--context", str(tmp_path / "c")) == 0
    out = capsys.readouterr().out
    assert out.startswith("aws ecr get-login-password --region us-east-1 | docker login")
    assert f"docker push {REPO}:gpu-" in out and "efa_installer" in (tmp_path / "c" / "Dockerfile").read_text()
    state_repo = None
    try:  # `stoker infra`'s state, where that module is there
        from stoker.backends.aws.infra.state import load_outputs

        state_repo = (load_outputs() or {}).get("ecr_repository_uri")
    except ImportError:
        pass
    if state_repo is None:
        assert stoker_image("build", "--kind", "cpu", "--wheel", wheel, "--push", "--dry-run") == 1
        assert "--push needs a repository" in capsys.readouterr().err
    monkeypatch.setenv("STOKER_IMAGE_REPOSITORY", "ghcr.io/me/stoker")
    assert stoker_image("build", "--kind", "cpu", "--wheel", wheel, "--push", "--dry-run", "--no-latest") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("docker push ghcr.io/me/stoker:cpu-")
    assert lines[-1].startswith("# the image to run: REPOSITORY@sha256:..., from docker image inspect")


def test_cli_installs_the_requirements_next_to_the_flow(tmp_path, capsys):
    flow = flow_file(tmp_path, train="@batch(trainium=16, efa=8)")
    wheel = str(fake_wheel(tmp_path / "w.whl"))
    (tmp_path / "requirements.txt").write_text(NXD_LLAMA_REQUIREMENTS)
    assert stoker_image("render", flow, "--output", str(tmp_path / "a"), "--wheel", wheel) == 0
    assert "installing " + str(tmp_path / "requirements.txt") in capsys.readouterr().err
    assert (tmp_path / "a" / "requirements.txt").read_text() == NXD_LLAMA_REQUIREMENTS
    assert "--requirement /tmp/stoker/requirements.txt" in (tmp_path / "a" / "Dockerfile").read_text()
    assert stoker_image("render", flow, "--no-requirements", "--no-pins", "--output", str(tmp_path / "b"),
                        "--wheel", wheel) == 0
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["Dockerfile", "stoker-0.1.0-py3-none-any.whl"]
    other = tmp_path / "nxd.txt"
    other.write_text("-r requirements.txt\n")
    assert stoker_image("render", "--kind", "neuron", "--requirements", str(other)) == 0  # printing needs no file
    assert stoker_image("render", "--kind", "neuron", "--requirements", str(other), "--output",
                        str(tmp_path / "c"), "--wheel", wheel) == 1
    assert "nxd.txt:1: '-r requirements.txt' refers to a file" in capsys.readouterr().err
