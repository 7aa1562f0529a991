"""`stoker image render | build`: the container image of a flow's Batch steps (see backends/aws/image.py).

    stoker image render flow.py [--step train]          # print the Dockerfile (--output DIR: the whole context)
    stoker image build flow.py --push                    # docker build + push to `stoker infra`'s ECR repository
    stoker image build --kind neuron --dry-run           # print the docker commands instead of running them

A `requirements.txt` next to the flow file (or `--requirements FILE`) is installed in the image after stoker: the
NxD examples' scripts need theirs. A push records the pushed digest as `stoker infra`'s image, so job
definitions name `REPOSITORY@sha256:...`, never a tag that a later push moves.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError


class _Found(Exception):
    def __init__(self, cls: type) -> None:
        self.cls = cls


def load_flow_class(path: str) -> type:
    """The FlowSpec class of a flow file, loaded as `python flow.py` loads it (run as __main__, its folder first
    on sys.path), except that the `MyFlow()` call hands the class back instead of starting the flow's CLI."""
    from stoker.flow import spec as flow_spec
    from stoker.flow.user_decorators import flow_class_of

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"flow file {path}: no such file (give the file you run with `python FILE run`)")
    try:  # a file that is not Python at all (a binary, a config) is named, not a compiler's traceback
        compile(file.read_bytes(), str(file), "exec", dont_inherit=True)
    except (SyntaxError, ValueError, UnicodeDecodeError) as e:
        what = f"{e.msg} (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else str(getattr(e, "msg", e))
        raise ConfigError(f"flow file {path} is not a Python source file that compiles: {what}; give the flow's .py "
                          f"file (the one you run with `python FILE run`)") from None
    argv, sys_path = sys.argv, list(sys.path)

    def capture(cls: type) -> Any:
        raise _Found(cls)

    sys.argv = [str(file)]
    sys.path.insert(0, str(file.resolve().parent))
    try:
        with flow_spec.flow_entry(capture):
            namespace = runpy.run_path(str(file), run_name="__main__")
    except _Found as found:
        return found.cls
    except SystemExit as e:
        raise ConfigError(f"flow file {path} exited while being loaded (exit code {e.code})") from None
    finally:
        sys.argv = argv
        sys.path[:] = sys_path
    found = (flow_class_of(v) for v in namespace.values())  # a bare `@MyFlowMutator` left its object in place
    classes = list(dict.fromkeys(v for v in found if v is not None and issubclass(v, flow_spec.FlowSpec)
                                 and v is not flow_spec.FlowSpec and v.__module__ == "__main__"))
    if len(classes) != 1:
        raise ConfigError(f"flow file {path} defines {len(classes)} FlowSpec classes and never calls one: end it "
                          f"with `if __name__ == '__main__': MyFlow()`")
    return classes[0]


def _requirements(args: argparse.Namespace) -> Path | None:
    """--requirements FILE, else requirements.txt next to the flow file (unless --no-requirements)."""
    if args.no_requirements:
        return None
    if args.requirements:
        return Path(args.requirements)
    found = Path(args.flow).resolve().parent / "requirements.txt" if args.flow else None
    if found is not None and found.is_file():
        print(f"installing {found} in the image (--no-requirements leaves it out)", file=sys.stderr)
        return found
    return None


def _spec(args: argparse.Namespace) -> Any:
    from stoker.backends.aws.image import ImageSpec, flow_kind

    kind, efa, why = args.kind, bool(args.efa), ""
    if args.flow:
        flow_cls = load_flow_class(args.flow)
        found, found_efa, steps = flow_kind(flow_cls, args.step)
        kind = kind or found
        efa = efa or found_efa
        why = f"{flow_cls.__name__}: " + ", ".join(f"{s} ({k})" for s, k in steps.items())
    elif args.step:
        raise ConfigError("--step needs the flow file: stoker image render FLOW_FILE --step STEP")
    if not kind:
        raise ConfigError("which image? give the flow file (stoker image render flow.py) or --kind cpu|gpu|neuron")
    if args.no_efa:
        efa = False
    args.requirements_file = _requirements(args)
    spec = ImageSpec(kind=kind, efa=efa, from_pypi=args.from_pypi, base=args.base, base_tag=args.base_tag,
                     base_region=args.base_region, torch_version=args.torch_version, torch_index=args.torch_index,
                     user=args.user, pins=not args.no_pins, requirements=args.requirements_file is not None)
    return spec, why


def _unpinned_note(ctx: Any) -> None:
    if ctx.unpinned:
        print(f"not pinned (not installed here, pip picks them in the image): {', '.join(ctx.unpinned)}",
              file=sys.stderr)


def cmd_render(args: argparse.Namespace) -> int:
    from stoker.backends.aws.image import prepare_context, render_dockerfile

    spec, why = _spec(args)
    if args.output is None:
        sys.stdout.write(render_dockerfile(spec))
        return 0
    ctx = prepare_context(spec, Path(args.output), wheel=Path(args.wheel) if args.wheel else None,
                          requirements=args.requirements_file)
    _unpinned_note(ctx)
    print(f"build context {ctx.path} (kind {spec.kind}{', ' + why if why else ''}): "
          f"{', '.join(['Dockerfile', *ctx.files])}; tag {ctx.tag}")
    return 0


def _default_repository() -> str | None:
    """The ECR repository `stoker infra apply` created, if it did (and the infra module is there)."""
    try:
        from stoker.backends.aws.infra.state import load_outputs
    except ImportError:
        return None
    outputs = load_outputs() or {}
    return outputs.get("ecr_repository_uri") or None


def cmd_build(args: argparse.Namespace) -> int:
    from stoker.backends.aws.image import NO_REPOSITORY, check_docker, plan_build, prepare_context, run_plan

    spec, why = _spec(args)
    repository = args.repository or os.environ.get("STOKER_IMAGE_REPOSITORY") or None
    if repository is None and (args.push or not args.dry_run):
        repository = _default_repository()
    if args.push and not repository:
        raise ConfigError(NO_REPOSITORY)
    if not args.dry_run:
        check_docker()  # before building a wheel that could not be used
    ctx = prepare_context(spec, Path(args.context) if args.context else None,
                          wheel=Path(args.wheel) if args.wheel else None, requirements=args.requirements_file)
    _unpinned_note(ctx)
    plan = plan_build(ctx, repository, push=args.push, platform=args.platform, latest=not args.no_latest)
    print(f"image kind {spec.kind}{' (' + why + ')' if why else ''}, context {ctx.path}", file=sys.stderr)
    if args.dry_run:
        sys.stdout.write(plan.script())
        return 0
    image = run_plan(plan)  # after a push: REPOSITORY@sha256:..., what job definitions must name
    verb = "pushed" if args.push else "built"
    print(f"{verb} {plan.image}" + (f" (and {', '.join(plan.also)})" if plan.also else ""))
    if args.push:
        infra = _record_image(image, repository)
        if infra:
            print(f"recorded {image} as the image of `stoker infra {infra}`: @batch steps without image= run it")
        else:
            print(f"use it with @batch(image=\"{image}\") or export STOKER_BATCH_IMAGE={image}")
    return 0


def _record_image(image: str, repository: str) -> str | None:
    """Record a pushed digest in `stoker infra`'s state when it went to that infra's repository."""
    try:
        from stoker.backends.aws.infra.state import record_image
    except ImportError:
        return None
    return record_image(image, repository)


def _common(p: argparse.ArgumentParser) -> None:
    from stoker.backends.aws.image import KINDS, NEURON_DLC_TAG, TORCH_VERSION

    p.add_argument("flow", nargs="?", help="the flow file: the kind follows its @batch steps' resources")
    p.add_argument("--step", help="only this step's needs (one image per step when steps differ)")
    p.add_argument("--kind", choices=KINDS, help="the image kind, instead of (or over) the flow's")
    p.add_argument("--efa", action="store_true", default=None, help="install EFA libraries (gpu/cpu; the Neuron "
                   "DLC has them); default: when a step asks for efa")
    p.add_argument("--no-efa", action="store_true", help="no EFA libraries even when a step asks for efa")
    p.add_argument("--from-pypi", action="store_true", help="install stoker==VERSION from PyPI, not a wheel of "
                   "this checkout")
    p.add_argument("--wheel", help="a stoker wheel to install (default: built from this checkout)")
    p.add_argument("--base", help="the FROM image, overriding the kind's default")
    p.add_argument("--base-tag", default=NEURON_DLC_TAG, help=f"the Neuron DLC's tag (default {NEURON_DLC_TAG})")
    p.add_argument("--base-region", help="pull the Neuron DLC from AWS's registry in this region (logged in "
                   "with your credentials) instead of the public ECR gallery")
    p.add_argument("--torch-version", default=TORCH_VERSION, help=f"torch for cpu/gpu images ({TORCH_VERSION})")
    p.add_argument("--torch-index", help="pip index of torch (gpu default: PyPI, the CUDA build; cpu default: "
                   "the CPU index), e.g. https://download.pytorch.org/whl/cu128")
    p.add_argument("--user", help="the user the image runs as (default: stoker; root for neuron)")
    p.add_argument("--requirements", metavar="FILE", help="the training script's pip requirements, installed "
                   "after stoker (default: requirements.txt next to the flow file, if there)")
    p.add_argument("--no-requirements", action="store_true", help="do not install requirements.txt of the flow")
    p.add_argument("--no-pins", action="store_true", help="leave stoker's dependencies to pip instead of pinning "
                   "them to the versions installed here")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `stoker image` (render, build) to the `stoker` command's subparsers."""
    from stoker.backends.aws.image import DEFAULT_PLATFORM

    image = subparsers.add_parser("image", help="render, build and push the container image of Batch steps",
                                  description="The container image a flow's @batch steps run in, with stoker "
                                              "installed: the Neuron DLC, CUDA or slim Python.")
    sub = image.add_subparsers(dest="image_command", metavar="{render,build}")
    sub.required = True
    p = sub.add_parser("render", help="print the Dockerfile (with --output DIR: write the build context)")
    _common(p)
    p.add_argument("--output", "-o", help="write the build context (Dockerfile + stoker wheel) to this folder")
    p.set_defaults(fn=cmd_render)
    b = sub.add_parser("build", help="docker build (and --push to ECR); --dry-run prints the commands")
    _common(b)
    b.add_argument("--push", action="store_true", help="log in to ECR and push (default repository: `stoker "
                   "infra`'s)")
    b.add_argument("--repository", help="REGISTRY/NAME to tag and push to (default: $STOKER_IMAGE_REPOSITORY, "
                   "else the ECR repository of `stoker infra apply`)")
    b.add_argument("--dry-run", action="store_true", help="write the context and print the docker commands")
    b.add_argument("--context", help="the build context folder (default $STOKER_HOME/images/TAG)")
    b.add_argument("--platform", default=DEFAULT_PLATFORM, help=f"docker --platform ({DEFAULT_PLATFORM})")
    b.add_argument("--no-latest", action="store_true", help="do not also tag (and push) REPOSITORY:latest")
    b.set_defaults(fn=cmd_build)
    return image
