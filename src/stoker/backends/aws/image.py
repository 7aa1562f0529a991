"""`stoker image`: the container image a Batch step runs in, with stoker installed.

Three kinds, from the step's resources (or `--kind`):

    neuron  Trainium / Inferentia: the AWS Neuron PyTorch training DLC (torch-neuronx, the Neuron compiler and
            runtime, the EFA libraries), from the public ECR gallery or the DLC account's regional registry
    gpu     NVIDIA: a CUDA base, Python in a venv, PyPI's torch (its Linux x86_64 wheel is the CUDA build);
            `efa=True` adds the EFA installer's user-space libraries (libfabric, the aws-ofi-nccl plugin)
    cpu     python:3.11-slim and torch's CPU build

stoker goes in from a wheel of this checkout copied into the build context (or from PyPI with
`from_pypi=True`), extras `[train,data,aws]`, never replacing the base image's torch build. Its dependencies are
pinned (`pins.txt`, pip constraints) to the versions installed where the image is built, so an image is what was
tested here, not what PyPI serves that day. A training script's own `requirements.txt` (the NxD examples have
one) is installed after stoker, with only the base image's torch/Neuron builds held. The Dockerfile is rendered by
a pure function (golden tests compare it); the build context (Dockerfile, wheel, pins, requirements) is
deterministic and its tag is a hash of its content, so the same code and settings give the same tag. A push
returns the pushed digest (`REPOSITORY@sha256:...`): job definitions name that, never a tag that can move.
No CMD: Batch passes the node command. No secrets: the ECR password goes to `docker login --password-stdin`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker.backends.aws.image_deps import pins_text, read_requirements, resolved_pins, stoker_requires
from stoker.errors import BackendError, ConfigError

KINDS = ("cpu", "gpu", "neuron")
EXTRAS = "train,data,aws"
TORCH_VERSION = "2.13.0"
CPU_BASE = "python:3.11-slim"
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA_BASE = "nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04"
# PyTorch/XLA training is supported up to Neuron 2.29 (2.30 moved training to TorchNeuron): the newest DLC with it.
NEURON_DLC_REPO = "pytorch-training-neuronx"
NEURON_DLC_TAG = "2.9.0-neuronx-py312-sdk2.29.1-ubuntu24.04"
NEURON_PUBLIC_REGISTRY = "public.ecr.aws/neuron"
NEURON_DLC_ACCOUNT = "763104351884"  # AWS's Deep Learning Containers account (regional registries)
EFA_INSTALLER_VERSION = "1.41.0"
DEFAULT_USER = "stoker"
DEFAULT_PLATFORM = "linux/amd64"  # trn1/trn2, p4d/p5, g5 and c5 are all x86_64; a Mac would build arm64
ECR_HOST = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?$")
NO_REPOSITORY = ("--push needs a repository: run `stoker infra apply` (it creates one), or give --repository "
                 "ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME (or set STOKER_IMAGE_REPOSITORY)")
# pinned to the base image's versions while stoker installs (the Neuron compiler pins numpy, for one)
_KEEP = "torch|torch-neuronx|torch-xla|torchvision|neuronx-cc|libneuronxla|neuronx-distributed|numpy"
PINS = "pins.txt"  # stoker's dependencies as resolved where the image is built (pip constraints)
REQUIREMENTS = "requirements.txt"  # the training script's requirements, in the context under this name


def dlc_registry(region: str) -> str:
    return f"{NEURON_DLC_ACCOUNT}.dkr.ecr.{region}.amazonaws.com"


@dataclass(kw_only=True)
class ImageSpec:
    """What goes into an image. Every field is rendered into the Dockerfile, so it is part of the tag.

    base: a full FROM override; base_tag / base_region: the Neuron DLC's tag, and the region of the DLC
    account's registry to pull it from (None: the public ECR gallery, no login needed); torch_index: where
    torch comes from (gpu: PyPI by default; cpu: the CPU index); user: the user the image runs as ("root" to
    stay root; neuron images default to root, as the DLC and the Neuron tools expect); pins: stoker's
    dependencies are held to pins.txt of the context (`resolved_pins`); requirements: the context has the
    training script's requirements.txt, installed after stoker."""

    kind: str
    stoker_version: str = ""
    from_pypi: bool = False
    efa: bool = False
    base: str | None = None
    base_tag: str = NEURON_DLC_TAG
    base_region: str | None = None
    torch_version: str = TORCH_VERSION
    torch_index: str | None = None
    efa_version: str = EFA_INSTALLER_VERSION
    user: str | None = None
    extras: str = EXTRAS
    pins: bool = True
    requirements: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"image kind {self.kind!r}: use one of {', '.join(KINDS)} (--kind)")
        if not self.stoker_version:
            from stoker import __version__

            self.stoker_version = __version__
        if not re.fullmatch(r"[0-9A-Za-z.+!-]+", self.stoker_version):
            raise ConfigError(f"stoker version {self.stoker_version!r} is not a version number")
        for name in ("base", "base_tag", "base_region", "torch_version", "torch_index", "efa_version"):
            v = getattr(self, name)
            if v is not None and (not v or any(c.isspace() or c in "\"'`$\\;&|" for c in v)):
                raise ConfigError(f"image setting {name}={v!r}: must be non-empty, without spaces or quotes")
        if self.base_region is not None and not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", self.base_region):
            raise ConfigError(f"--base-region {self.base_region!r}: use an AWS region name, e.g. us-east-1")
        if self.user is None:
            self.user = "root" if self.kind == "neuron" else DEFAULT_USER
        if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", self.user):
            raise ConfigError(f"--user {self.user!r}: use a Linux user name like 'stoker' (or 'root')")

    @property
    def base_image(self) -> str:
        if self.base:
            return self.base
        if self.kind == "neuron":
            registry = dlc_registry(self.base_region) if self.base_region else NEURON_PUBLIC_REGISTRY
            return f"{registry}/{NEURON_DLC_REPO}:{self.base_tag}"
        return CUDA_BASE if self.kind == "gpu" else CPU_BASE

    @property
    def wheel_name(self) -> str:
        return f"stoker-{self.stoker_version}-py3-none-any.whl"

    @property
    def login_registries(self) -> list[str]:
        """Private registries the base image is pulled from (docker must be logged in to them to build)."""
        host = self.base_image.split("/", 1)[0]
        return [host] if ECR_HOST.match(host) else []


def _efa_block(spec: ImageSpec) -> list[str]:
    v = spec.efa_version
    return [
        "# EFA user space (libfabric, rdma-core, the aws-ofi-nccl plugin) from the EFA installer; the kernel driver",
        "# is the host's. --skip-kmod/--skip-limit-conf/--no-verify: a container cannot load modules, set",
        "# ulimits (the job definition does) or see the devices at build time.",
        "RUN apt-get update && apt-get install -y --no-install-recommends curl ca-certificates \\",
        f" && curl -fsSL https://efa-installer.amazonaws.com/aws-efa-installer-{v}.tar.gz | tar -xz -C /tmp \\",
        " && cd /tmp/aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify \\",
        " && cd / && rm -rf /tmp/aws-efa-installer /var/lib/apt/lists/*",
        "ENV PATH=/opt/amazon/efa/bin:$PATH \\",
        "    LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}",
    ]


def render_dockerfile(spec: ImageSpec) -> str:
    """The Dockerfile of `spec` (pure: the same spec gives the same text)."""
    pip = "python -m pip install --no-cache-dir"
    out = [
        f"# stoker image, kind {spec.kind}: rendered by `stoker image`, do not edit (re-render instead).",
        "# No CMD: AWS Batch passes the node command. No secrets: nothing here is one.",
        f"FROM {spec.base_image}",
        "",
        "ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1",
    ]
    if spec.kind == "neuron":
        out += ["# The DLC has torch-neuronx, the Neuron compiler, runtime and tools, and the EFA libraries.",
                'RUN command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python']
    elif spec.kind == "gpu":
        out += ["ENV DEBIAN_FRONTEND=noninteractive VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH",
                "RUN apt-get update && apt-get install -y --no-install-recommends"
                " python3 python3-venv ca-certificates \\",
                " && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv"]
    if spec.efa and spec.kind != "neuron":
        out += [""] + _efa_block(spec)
    if spec.kind == "gpu":
        index = f" --index-url {spec.torch_index}" if spec.torch_index else ""
        out += ["", "# torch's CUDA build"
                + ("" if index else " (PyPI's Linux x86_64 wheel, CUDA libraries as pip packages)"),
                f"RUN {pip}{index} torch=={spec.torch_version}"]
    elif spec.kind == "cpu":
        out += ["", f"RUN {pip} --index-url {spec.torch_index or CPU_TORCH_INDEX} torch=={spec.torch_version}"]
    target = f"stoker[{spec.extras}]=={spec.stoker_version}" if spec.from_pypi else \
        f"/tmp/stoker/{spec.wheel_name}[{spec.extras}]"
    out += ["", "# stoker; the base image's torch (and Neuron) builds stay: pip may add packages, not replace those"]
    if spec.pins:
        out += [f"# stoker's dependencies: the versions {PINS} lists (resolved where the image was built)"]
    if spec.requirements:
        out += ["# then the training script's requirements.txt: its pins win over stoker's, not over the base's"]
    copy = ([] if spec.from_pypi else [spec.wheel_name]) + ([PINS] if spec.pins else []) \
        + ([REQUIREMENTS] if spec.requirements else [])
    if copy:
        out += [f"COPY {' '.join(copy)} /tmp/stoker/"]
    pins = f" --constraint /tmp/stoker/{PINS}" if spec.pins else ""
    out += [f"RUN mkdir -p /tmp/stoker && python -m pip freeze | grep -iE '^({_KEEP})==' > /tmp/stoker/keep.txt; \\",
            f"    {pip} --constraint /tmp/stoker/keep.txt{pins} \"{target}\" \\"]
    if spec.requirements:
        out += [f" && {pip} --constraint /tmp/stoker/keep.txt --requirement /tmp/stoker/{REQUIREMENTS} \\"]
    out += [" && rm -rf /tmp/stoker \\",
            " && python -c \"import stoker, torch; print('stoker', stoker.__version__, 'torch', torch.__version__)\""]
    if spec.user == "root":
        out += ["", "WORKDIR /workspace"]
    else:
        out += ["", f"RUN useradd --create-home --uid 10001 --shell /bin/bash {spec.user} \\",
                f" && mkdir -p /workspace && chown {spec.user}:{spec.user} /workspace",
                f"USER {spec.user}", "WORKDIR /workspace"]
    return "\n".join(out) + "\n"


# -- the kind a flow needs ---------------------------------------------------------------------------------------

def step_kind(func: Any) -> tuple[str, bool]:
    """(kind, efa) of one step, from @batch and @resources (the larger of the two, as the backend does)."""
    from stoker.backends.aws.decorator import node_resources
    from stoker.backends.aws.instances import instance_type
    from stoker.features.hooks import resources_request
    from stoker.flow.decorators import get_decorator

    b = get_decorator(func, "batch")  # this backend's own decorator (backends/aws/decorator.py)
    opts = dict(b.attributes) if b else {}
    res = node_resources(opts, resources_request(func))
    t = instance_type(opts["instance_type"]) if opts.get("instance_type") else None
    if res["trainium"] or res["inferentia"] or (t is not None and t.neuron_devices):
        return "neuron", res["efa"] > 0
    if res["gpu"] or (t is not None and t.gpus):
        return "gpu", res["efa"] > 0
    return "cpu", res["efa"] > 0


def flow_kind(flow_cls: type, step: str | None = None) -> tuple[str, bool, dict[str, str]]:
    """(kind, efa, {step: kind}) of the image a flow needs: its @batch steps (every step when none has @batch,
    as with `run --with batch`), or only `step`. A flow whose steps need Neuron and CUDA needs two images."""
    steps = {a: getattr(flow_cls, a) for a in dir(flow_cls) if getattr(getattr(flow_cls, a, None), "is_step", False)}
    if step is not None:
        if step not in steps:
            raise ConfigError(f"--step {step}: the flow {flow_cls.__name__} has no such step; its steps: "
                              f"{', '.join(sorted(steps))}")
        steps = {step: steps[step]}
    else:
        from stoker.flow.decorators import get_decorator

        batch_steps = {n: f for n, f in steps.items() if get_decorator(f, "batch")}
        steps = batch_steps or steps
    kinds = {n: step_kind(f) for n, f in sorted(steps.items())}
    wanted = {k for k, _ in kinds.values()}
    if {"neuron", "gpu"} <= wanted:
        by = ", ".join(f"{n} ({k})" for n, (k, _) in kinds.items() if k != "cpu")
        raise ConfigError(f"the steps {by} need different images: build one per step with --step STEP and give "
                          f"each its image with @batch(image=...)")
    kind = "neuron" if "neuron" in wanted else "gpu" if "gpu" in wanted else "cpu"
    return kind, any(e for _, e in kinds.values()), {n: k for n, (k, _) in kinds.items()}


# -- the build context -------------------------------------------------------------------------------------------

def source_root() -> Path | None:
    """The checkout stoker runs from (an editable install), or None for an installed wheel."""
    root = Path(__file__).resolve().parents[4]
    return root if (root / "pyproject.toml").is_file() and (root / "src" / "stoker").is_dir() else None


def build_wheel(root: Path, out_dir: Path) -> Path:
    """A wheel of the checkout at `root`, built from a clean copy (no stale build/ folder, no caches), with
    fixed timestamps (SOURCE_DATE_EPOCH) so the same source gives the same bytes."""
    with tempfile.TemporaryDirectory(prefix="stoker-wheel-") as tmp:
        src = Path(tmp) / "src-copy"
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist", ".*")
        src.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE", "setup.cfg", "MANIFEST.in"):
            if (root / name).is_file():
                shutil.copy2(root / name, src / name)
        shutil.copytree(root / "src", src / "src", ignore=ignore)
        wheels = Path(tmp) / "wheels"
        env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}  # 1980-01-01, the earliest a zip can hold
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                               "--quiet", "--wheel-dir", str(wheels), str(src)], capture_output=True, text=True,
                              env=env)
        built = sorted(wheels.glob("stoker-*.whl")) if wheels.is_dir() else []
        if proc.returncode != 0 or not built:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise ConfigError(f"could not build a wheel of {root}: {' | '.join(tail)}. Fix: check that "
                              f"`pip wheel --no-build-isolation {root}` works (setuptools installed), or use "
                              f"--from-pypi / --wheel PATH")
        out_dir.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(built[0], out_dir / built[0].name))


def wheel_digest(path: Path) -> str:
    """A hash of a wheel's members (names and bytes), not of the zip: zip timestamps do not change it."""
    h = hashlib.sha256()
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):
            h.update(name.encode() + b"\0" + hashlib.sha256(z.read(name)).digest())
    return h.hexdigest()


def content_tag(kind: str, dockerfile: str, files: dict[str, str]) -> str:
    """`KIND-<16 hex>`: a hash of the Dockerfile and of each file of the context (`files`: name -> digest)."""
    h = hashlib.sha256(b"Dockerfile\0" + dockerfile.encode())
    for name in sorted(files):
        h.update(f"\0{name}\0{files[name]}".encode())
    return f"{kind}-{h.hexdigest()[:16]}"


@dataclass
class BuildContext:
    path: Path
    spec: ImageSpec
    dockerfile: str
    tag: str
    files: list[str] = field(default_factory=list)  # besides the Dockerfile
    unpinned: list[str] = field(default_factory=list)  # stoker dependencies not installed here: left to pip


def default_context_root() -> Path:
    from stoker.store.paths import home_dir

    return home_dir() / "images"


def prepare_context(spec: ImageSpec, dest: Path | None = None, wheel: Path | None = None,
                    requirements: Path | None = None,
                    pins: tuple[dict[str, str], list[str]] | None = None) -> BuildContext:
    """Write the build context: the Dockerfile, (unless from PyPI) the stoker wheel, pins.txt and the training
    script's requirements.txt, into `dest` (default `$STOKER_HOME/images/<tag>/`, replaced if there). `wheel`: a
    prebuilt one, else this checkout is built; `pins`: (pins, unpinned), else `resolved_pins` of this Python."""
    if spec.requirements != (requirements is not None):
        raise ConfigError("ImageSpec(requirements=...) and the requirements file go together: give both or neither")
    dockerfile = render_dockerfile(spec)
    texts: dict[str, str] = {REQUIREMENTS: read_requirements(requirements)} if requirements is not None else {}
    with tempfile.TemporaryDirectory(prefix="stoker-image-") as tmp:
        files: dict[str, str] = {}
        if not spec.from_pypi:
            if wheel is None:
                root = source_root()
                if root is None:
                    raise ConfigError("stoker is installed from a wheel, not a checkout: give --wheel PATH (a "
                                      "stoker wheel) or --from-pypi to install stoker from PyPI in the image")
                wheel = build_wheel(root, Path(tmp))
            wheel = Path(wheel)
            if not wheel.is_file():
                raise ConfigError(f"--wheel {wheel}: no such file")
            files[spec.wheel_name] = wheel_digest(wheel)
        unpinned: list[str] = []
        if spec.pins:
            found, unpinned = pins if pins is not None else resolved_pins(stoker_requires(wheel), spec.extras,
                                                                           keep=_KEEP)
            texts[PINS] = pins_text(found, unpinned, spec.extras)
        files.update({name: hashlib.sha256(t.encode()).hexdigest() for name, t in texts.items()})
        tag = content_tag(spec.kind, dockerfile, files)
        path = Path(dest) if dest is not None else default_context_root() / tag
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        (path / "Dockerfile").write_text(dockerfile)
        if wheel is not None:
            shutil.copyfile(wheel, path / spec.wheel_name)
        for name, t in texts.items():
            (path / name).write_text(t, encoding="utf-8")
    return BuildContext(path=path, spec=spec, dockerfile=dockerfile, tag=tag, files=sorted(files),
                        unpinned=unpinned)


# -- docker and ECR ----------------------------------------------------------------------------------------------

# runner(argv, input=None, capture=False) -> CompletedProcess; capture=False lets docker print its progress
Runner = Callable[..., subprocess.CompletedProcess]


def subprocess_runner(argv: Sequence[str], input: bytes | None = None, capture: bool = False
                      ) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), input=input, capture_output=capture, check=False)


def check_docker(runner: Runner = subprocess_runner) -> None:
    """Fail with the fix when the docker CLI or its daemon is missing."""
    try:
        proc = runner(["docker", "info", "--format", "{{.ServerVersion}}"], capture=True)
    except FileNotFoundError:
        raise ConfigError("docker is not installed: install Docker Engine (https://docs.docker.com/engine/install/)"
                          ", or use --dry-run to print the docker commands and run them where Docker is") from None
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace") if isinstance(proc.stderr, bytes) else str(proc.stderr or "")
        why = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), f"exit code {proc.returncode}")
        raise ConfigError(f"the Docker daemon is not reachable ({why}). Fix: start it (e.g. `sudo systemctl start "
                          f"docker`), check DOCKER_HOST and your access to /var/run/docker.sock, or use --dry-run "
                          f"to print the docker commands and run them where a daemon is")


def parse_repository(uri: str) -> tuple[str, str | None]:
    """(registry host, region) of an image repository URI; region None when it is not an ECR registry."""
    if not uri or any(c.isspace() for c in uri) or ":" in uri.split("/")[-1] or "/" not in uri:
        raise ConfigError(f"--repository {uri!r}: give a repository without a tag, e.g. "
                          f"123456789012.dkr.ecr.us-east-1.amazonaws.com/stoker")
    host = uri.split("/", 1)[0]
    m = ECR_HOST.match(host)
    return host, (m.group("region") if m else None)


def ecr_password(registry: str, region: str, client: Any = None) -> tuple[str, str]:
    """(user, password) for `docker login` to an ECR registry: ecr:GetAuthorizationToken, as
    `aws ecr get-login-password` does."""
    from stoker.backends.aws.session import aws_client, aws_error

    m = ECR_HOST.match(registry)
    if not m:
        raise ConfigError(f"{registry} is not an ECR registry (ACCOUNT.dkr.ecr.REGION.amazonaws.com)")
    ecr = client or aws_client("ecr", region)
    try:
        data = ecr.get_authorization_token(registryIds=[m.group("account")])["authorizationData"][0]
    except Exception as e:  # noqa: BLE001 - botocore's errors, turned into one message with the fix
        if isinstance(e, ConfigError):
            raise
        raise aws_error(e, "ecr:GetAuthorizationToken", registry) from None
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    return user, password


def docker_login(registry: str, region: str, runner: Runner = subprocess_runner, client: Any = None) -> None:
    """Log docker in to an ECR registry; the password goes through stdin only."""
    user, password = ecr_password(registry, region, client)
    proc = runner(["docker", "login", "--username", user, "--password-stdin", registry], input=password.encode(),
                  capture=True)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace") if isinstance(proc.stderr, bytes) else str(proc.stderr or "")
        raise BackendError(f"docker login {registry} failed: {err.strip() or proc.returncode}. Fix: check that "
                           f"your AWS identity may call ecr:GetAuthorizationToken and pull/push in {registry}")


@dataclass
class BuildPlan:
    """The docker commands of one build (what --dry-run prints)."""

    context: BuildContext
    image: str  # REPOSITORY:TAG built
    also: list[str]  # more tags of the same image (REPOSITORY:latest)
    push: bool
    platform: str
    logins: list[tuple[str, str]]  # (registry, region) to log in to first

    def commands(self) -> list[list[str]]:
        cmds = [["docker", "build", "--platform", self.platform, "--tag", self.image]
                + [a for t in self.also for a in ("--tag", t)] + [str(self.context.path)]]
        if self.push:
            cmds += [["docker", "push", t] for t in [self.image, *self.also]]
        return cmds

    def script(self) -> str:
        """The plan as shell commands (ECR logins as `aws ecr get-login-password | docker login`)."""
        import shlex

        lines = [f"aws ecr get-login-password --region {region} | docker login --username AWS --password-stdin "
                 f"{registry}" for registry, region in self.logins]
        lines += [shlex.join(c) for c in self.commands()]
        if self.push:
            lines.append(f"# the image to run: REPOSITORY@sha256:..., from {shlex.join(inspect_argv(self.image))}")
        return "\n".join(lines) + "\n"


def inspect_argv(image: str) -> list[str]:
    return ["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", image]


def pushed_digest(image: str, runner: Runner = subprocess_runner) -> str:
    """`REPOSITORY@sha256:...` of a pushed `REPOSITORY:TAG`: the registry's digest, which docker records on push.
    Job definitions name it, so every node of a gang (and every retry) runs the same bytes."""
    repository = image.rsplit(":", 1)[0]
    proc = runner(inspect_argv(image), capture=True)
    out = proc.stdout.decode(errors="replace") if isinstance(proc.stdout, bytes) else str(proc.stdout or "")
    try:
        digests = json.loads(out) if proc.returncode == 0 else []
    except ValueError:
        digests = []
    for ref in digests if isinstance(digests, list) else []:
        if isinstance(ref, str) and ref.startswith(f"{repository}@sha256:"):
            return ref
    raise BackendError(f"pushed {image}, but docker reports no digest of it in {repository} "
                       f"(`{' '.join(inspect_argv(image))}`). Fix: look the digest up (`aws ecr describe-images "
                       f"--repository-name NAME --image-ids imageTag=TAG`) and give @batch(image=\"{repository}@"
                       f"sha256:...\") or STOKER_BATCH_IMAGE")


def plan_build(ctx: BuildContext, repository: str | None, push: bool, platform: str = DEFAULT_PLATFORM,
               latest: bool = True) -> BuildPlan:
    """Tags: REPOSITORY:<content tag> (and REPOSITORY:latest), or stoker:<content tag> without a repository."""
    if push and not repository:
        raise ConfigError(NO_REPOSITORY)
    logins: list[tuple[str, str]] = []
    for registry in ctx.spec.login_registries:
        logins.append((registry, ECR_HOST.match(registry).group("region")))  # type: ignore[union-attr]
    name = repository or "stoker"
    if repository:
        registry, region = parse_repository(repository)
        if push and region and (registry, region) not in logins:
            logins.append((registry, region))
    also = [f"{name}:latest"] if latest else []
    return BuildPlan(context=ctx, image=f"{name}:{ctx.tag}", also=also, push=push, platform=platform, logins=logins)


def run_plan(plan: BuildPlan, runner: Runner = subprocess_runner, client_for: Callable[[str], Any] | None = None,
             ) -> str:
    """Check docker, log in where needed, build (and push). Returns the image built: `REPOSITORY:TAG`, or after
    a push its digest `REPOSITORY@sha256:...`. `client_for(region)` gives the ECR client (default: stoker's
    boto3 client for that region)."""
    check_docker(runner)
    for registry, region in plan.logins:
        docker_login(registry, region, runner, client_for(region) if client_for else None)
    for argv in plan.commands():
        proc = runner(argv)
        if proc.returncode != 0:
            what = "push" if argv[1] == "push" else "build"
            fix = ("check that the repository exists (`stoker infra status`) and that your AWS identity may push "
                   "to it") if what == "push" else f"see docker's output above; the context is {plan.context.path}"
            raise BackendError(f"docker {what} failed (exit code {proc.returncode}): {fix}")
    return pushed_digest(plan.image, runner) if plan.push else plan.image
