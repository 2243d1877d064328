"""Command-line flags that describe a planning request (cluster, model, profile, options), shared by
``dhp plan`` and ``dhp plan-epoch``. Flags that set a field of a document come from that field's one
definition (its ``flag``, help, range, default and choices): the planner options
(:data:`optimizer.problem.options.OPTION_SPECS`) and the cluster shorthand
(:data:`optimizer.problem.definitions.CLUSTER`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from optimizer.errors import ProblemError
from optimizer.problem.definitions import CLUSTER
from optimizer.problem.fields import FieldSpec
from optimizer.problem.options import OPTION_SPECS

SHORTHAND = tuple(spec for spec in CLUSTER.fields if spec.flag is not None)
"""The cluster fields the shorthand flags set: ``--nodes`` (a count), ``--gpus-per-node`` and ``--gpu``."""


def add_request_flags(
    p: argparse.ArgumentParser, options_help: str = "options file (the 'options' document of a request)"
) -> None:
    cl = p.add_mutually_exclusive_group()
    cl.add_argument("--cluster", help="cluster file (see examples/cluster.json)")
    cl.add_argument("--cluster-preset", help="a preset cluster name (dhp presets)")
    nodes, *rest = SHORTHAND
    assert nodes.flag is not None and nodes.range is not None
    cl.add_argument(
        nodes.flag,
        dest=nodes.name,
        type=int,
        help=f"shorthand: K nodes ({nodes.range.span}) of --gpus-per-node GPUs of type --gpu",
    )
    for spec in rest:
        assert spec.flag is not None
        span = f"{spec.range.span}; " if spec.range is not None else ""
        p.add_argument(
            spec.flag,
            dest=spec.name,
            type=int if spec.kind == "int" else str,
            default=spec.default,
            help=f"{spec.help} ({span}default {spec.default})",
        )
    md = p.add_mutually_exclusive_group()
    md.add_argument("--model", help="model file (see examples/model.json)")
    md.add_argument("--model-preset", help="a preset model name (dhp presets)")
    pf = p.add_mutually_exclusive_group()
    pf.add_argument(
        "--profile", help="measured cost profile (see examples/profile.json); replaces the analytical cost model"
    )
    pf.add_argument("--profile-preset", help="a profile of the zoo by name (dhp presets), e.g. flexsp-gpt7b")
    p.add_argument("--options", help=options_help)
    for spec in OPTION_SPECS:  # the planner options that have a flag
        if spec.flag is None:
            continue
        if spec.kind == "bool":
            p.add_argument(spec.flag, dest=spec.name, action="store_const", const=True, help=spec.description)
        else:
            p.add_argument(
                spec.flag, dest=spec.name, type=_flag_type(spec), choices=spec.choices, help=spec.description
            )


def _flag_type(spec: FieldSpec) -> Callable[[str], Any]:
    """What a flag's text is read as: the option's kind, or for a number that may also be a word (``--budget-ms
    auto``), that word or a number."""
    kind: Callable[[str], Any] = {"int": int, "number": float}.get(spec.kind, str)
    words = spec.either.choices if spec.either is not None and spec.either.kind == "str" else None
    if not words:
        return kind

    def number_or_word(text: str) -> Any:
        if text in words:
            return text
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is neither a number nor {' nor '.join(repr(w) for w in words)}"
            ) from None

    return number_or_word


def request_parts(args: argparse.Namespace, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``cluster``/``cluster_preset``, ``model``/``model_preset``, ``profile`` and ``options`` members the flags
    give; ``options`` (from a document the flags override) is used when no options file is given."""
    from optimizer.problem.documents import read_json_file

    doc: dict[str, Any] = {}
    if args.cluster:
        doc["cluster"] = read_json_file(args.cluster, "--cluster")
    elif args.nodes is not None:
        doc["cluster"] = {spec.name: getattr(args, spec.name) for spec in SHORTHAND}
    elif args.cluster_preset:
        doc["cluster_preset"] = args.cluster_preset
    if args.model:
        doc["model"] = read_json_file(args.model, "--model")
    elif args.model_preset:
        doc["model_preset"] = args.model_preset
    if args.profile:
        learned = args.profile.startswith("learned:")  # the engine says where such a profile is read
        doc["profile"] = args.profile if learned else read_json_file(args.profile, "--profile")
    elif args.profile_preset:
        from optimizer.costs.zoo import load_profile

        doc["profile"] = load_profile(args.profile_preset, "--profile-preset")
    merged: dict[str, Any] = dict(options or {})
    if args.options:
        given = read_json_file(args.options, "--options")
        if not isinstance(given, dict):
            raise ProblemError(
                f"must be a JSON object of options, got {type(given).__name__}",
                field="--options",
                hint='e.g. {"time_budget_ms": 200, "backend": "heuristic"}.',
            )
        merged = dict(given)
    for spec in OPTION_SPECS:
        value = getattr(args, spec.name, None)
        if value is not None:
            merged[spec.name] = value
    if merged:
        doc["options"] = merged
    return doc
