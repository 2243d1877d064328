"""Command-line flags that describe a planning request (cluster, model, profile, options), shared by
``dhp plan`` and ``dhp plan-epoch``. The option flags come from the options' one definition
(:data:`optimizer.problem.options.OPTION_SPECS`)."""

from __future__ import annotations

import argparse
from typing import Any

from optimizer.errors import ProblemError
from optimizer.problem.options import OPTION_SPECS


def add_request_flags(
    p: argparse.ArgumentParser, options_help: str = "options file (the 'options' document of a request)"
) -> None:
    cl = p.add_mutually_exclusive_group()
    cl.add_argument("--cluster", help="cluster file (see examples/cluster.json)")
    cl.add_argument("--cluster-preset", help="a preset cluster name (dhp presets)")
    cl.add_argument("--nodes", type=int, help="shorthand: K nodes (with --gpus-per-node)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node for --nodes (default 8)")
    p.add_argument("--gpu", default="H100-SXM", help="GPU type for --nodes (default H100-SXM)")
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
            p.add_argument(spec.flag, dest=spec.name, action="store_const", const=True, help=spec.help)
        else:
            kind = {"int": int, "number": float}.get(spec.kind, str)
            p.add_argument(spec.flag, dest=spec.name, type=kind, choices=spec.choices, help=spec.help)


def request_parts(args: argparse.Namespace, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``cluster``/``cluster_preset``, ``model``/``model_preset``, ``profile`` and ``options`` members the flags
    give; ``options`` (from a document the flags override) is used when no options file is given."""
    from optimizer.problem.documents import read_json_file

    doc: dict[str, Any] = {}
    if args.cluster:
        doc["cluster"] = read_json_file(args.cluster, "--cluster")
    elif args.nodes is not None:
        doc["cluster"] = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "gpu": args.gpu}
    elif args.cluster_preset:
        doc["cluster_preset"] = args.cluster_preset
    if args.model:
        doc["model"] = read_json_file(args.model, "--model")
    elif args.model_preset:
        doc["model_preset"] = args.model_preset
    if args.profile:
        doc["profile"] = read_json_file(args.profile, "--profile")
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
