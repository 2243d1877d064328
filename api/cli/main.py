"""The ``dhp`` command line.

Exit codes: 0 success; 1 a plan failed validation (``dhp validate``); 2 bad input (the message
names the field and says how to fix it); 3 the input is valid but no plan can satisfy it; 4 an I/O
failure (the output could not be written: a missing folder, a full disk, standard output closed).
Every failure is one line on standard error, never a traceback.
The subcommands of the other parts (``serve``, ``bench``, ``profile``, ``plan-epoch``) import what
they need only when they run, so ``dhp plan`` works with the engine alone.
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import errno
import gc
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from api.cli import STARTED, bench_commands, jobs_commands, serve, trainer_commands
from api.cli.request_flags import add_request_flags, request_parts
from optimizer.errors import InfeasibleError, PlannerError
from planning.allocator import retain_freed_memory


def _problem_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batch", required=True, help='batch file: {"samples": [{"id", "text_tokens", "images": [{"tokens"}]}]}'
    )
    add_request_flags(p)


def build_request(args: argparse.Namespace) -> dict[str, Any]:
    """The request document the flags describe (the same shape as a POST /v1/plans body)."""
    from optimizer.problem.documents import read_json_file

    return {"batch": read_json_file(args.batch, "--batch"), **request_parts(args)}


DEFAULT_MODEL_NOTE = "default; pass --model-preset or --model"
"""What ``dhp plan`` and ``dhp validate`` say of the model when none was given (the request's default preset)."""


def default_model_note(request: dict[str, Any], say: bool = True) -> str | None:
    """``DEFAULT_MODEL_NOTE`` when ``request`` names no model, after writing it to standard error with the
    default's name when ``say`` (the plan on standard output stays as it is); None when it names one."""
    from optimizer.problem.definitions import REQUEST

    if request.get("model") is not None or request.get("model_preset") is not None:
        return None
    if say and sys.stderr is not None:
        print(f"model: {REQUEST['model_preset'].default} ({DEFAULT_MODEL_NOTE})", file=sys.stderr)
    return DEFAULT_MODEL_NOTE


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan the request. Run as the process's command (``args.whole_process``, see :func:`main`), it plans
    once: the budget covers the whole answer, counted from the process's start (start-up, imports and
    loading the compiled kernels included), so no warm-up runs first. Called within a longer-lived
    process, the budget counts from the call and the kernels are loaded first, as for any plan."""
    from optimizer.problem.documents import problem_from_json
    from planning.budget_policy import resolve_budget
    from planning.deadline import Deadline, process_start
    from planning.planner import plan

    request = build_request(args)
    problem = problem_from_json(request)
    if args.show_profile:
        emit(json.dumps(problem.cost_profile.to_json(), indent=2))
        return 0
    problem = resolve_budget(problem)  # "auto": the default budget, or a share of options.previous_step_s
    deadline = None  # counted from the call, once the kernels are loaded (planning.planner.plan)
    whole_process = getattr(args, "whole_process", False)
    if whole_process:
        started = process_start()
        deadline = Deadline.after_ms(problem.options.budget_ms, start=STARTED if started is None else started)
    result = plan(problem, deadline=deadline, warm=not whole_process)
    # Once planned, so that a failure stays one line on standard error; a summary on the terminal says it itself.
    note = default_model_note(request, say=not (args.summary and args.out is None))
    if args.summary:
        from optimizer.plan.summary import summary_text

        text = summary_text(result, problem, model_note=note)
    else:
        text = json.dumps(result.to_json(shards=not args.no_shards), indent=None if args.compact else 2)
    emit(text, args.out)
    return 0


def emit(text: str, out: str | None = None) -> None:
    """Write ``text`` to the file ``out`` or to standard output, so that any failure to write surfaces here
    (as OSError, exit 4) rather than being lost: a closed standard output, a full disk, a missing folder."""
    if out:
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
            fh.flush()
            if os.path.isfile(out):  # a full disk may only say so when the data reaches it
                os.fsync(fh.fileno())
        return
    if sys.stdout is None:
        raise OSError(errno.EBADF, "standard output is closed")
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def cmd_validate(args: argparse.Namespace) -> int:
    from optimizer.problem.documents import problem_from_json, read_json_file
    from optimizer.verify.plan_document import check_plan_document

    request = build_request(args)
    problem = problem_from_json(request)
    doc = read_json_file(args.plan, "--plan")
    report = check_plan_document(problem, doc)
    default_model_note(request)  # once checked: bad input stays one line on standard error
    if report.ok:
        emit(f"valid: {len(doc['micro_batches'])} micro-batches, step time {report.step_time_s:.6g} s")
        return 0
    shown = report.violations[:SHOWN_VIOLATIONS]
    lines = [f"invalid: {v}" for v in shown]
    if len(report.violations) > len(shown):
        lines.append(f"invalid: ... {len(report.violations) - len(shown)} more")
    emit("\n".join(lines))
    return 1


SHOWN_VIOLATIONS = 10
"""``dhp validate`` prints this many violations, the leading line first (a plan for other inputs has one line
saying so: :mod:`optimizer.verify.plan_document`), then how many more there are."""


def cmd_presets(args: argparse.Namespace) -> int:
    from optimizer.costs.zoo import describe_presets

    presets = describe_presets()
    if args.json:
        emit(json.dumps(presets, indent=2))
        return 0
    emit(
        "\n".join(f"{kind}: {', '.join(sorted(presets[kind]))}" for kind in ("clusters", "models", "gpus", "profiles"))
    )
    return 0


def cmd_example(args: argparse.Namespace) -> int:
    from optimizer.problem.workloads import WORKLOADS

    emit(json.dumps(WORKLOADS[args.workload](args.samples, seed=args.seed)))
    return 0


_KINDS = {int: "a whole number", float: "a number"}
_TYPE_ERROR = re.compile(r"invalid \S+ value: (.*)$")
_CHOICE_ERROR = re.compile(r"invalid choice: (.*?) \(choose from")


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose every error is one line on standard error, exit code 2: the command, the
    flag and what is wrong with it, and how to fix it (``dhp plan: --budget-ms: 'abc' is not a number;
    give the planning budget in milliseconds, e.g. 200.``), never argparse's usage text. Every subcommand's
    parser is one too, those that other parts add included (argparse builds subparsers of their parent's
    class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exit_on_error", False)  # argparse's errors reach parse_known_args with their flag
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        try:
            return super().parse_known_args(args, namespace)
        except argparse.ArgumentError as err:
            self.fail(self._explain(err.argument_name, err.message))

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self._chosen(parsed)._unknown(extra)
        return parsed

    def error(self, message: str) -> NoReturn:
        self.fail(self._general(message))

    def fail(self, text: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {text}\n")

    def _general(self, message: str) -> str:
        """A refusal that names no single flag: missing required flags, a missing command."""
        required = message.partition("the following arguments are required: ")[2]
        if required:
            names = required.split(", ")
            if any(isinstance(self._action(n), argparse._SubParsersAction) for n in names):
                return (
                    f"a command is required; use one of {', '.join(self._commands())} ({self.prog} --help says what "
                    "each does)"
                )
            return (
                f"{' and '.join(names)} {'is' if len(names) == 1 else 'are'} required; "
                f"add {self._usage(names)} (see {self.prog} --help)"
            )
        group = re.fullmatch(r"one of the arguments (.*) is required", message)
        if group:
            return f"one of {', '.join(group.group(1).split())} is required; add one of them (see {self.prog} --help)"
        return f"{message}; see {self.prog} --help"

    def _explain(self, name: str | None, message: str) -> str:
        action = self._action(name)
        if action is None:
            return self._general(message)
        flag = action.option_strings[-1] if action.option_strings else str(name)
        choice = _CHOICE_ERROR.match(message)
        if isinstance(action, argparse._SubParsersAction):
            value = choice.group(1) if choice else repr(message)
            close = difflib.get_close_matches(value.strip("'"), self._commands(), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            return f"{value} is not a command; {hint}use one of {', '.join(self._commands())}"
        typed = _TYPE_ERROR.match(message)
        if typed:
            return f"{flag}: {typed.group(1)} is not {_KINDS.get(action.type, 'a valid value')}; {self._hint(action)}"  # type: ignore[call-overload]
        if choice:
            choices = [str(c) for c in action.choices or ()]
            return (
                f"{flag}: {choice.group(1)} is not one of {', '.join(choices)}; "
                f"{self._hint(action, choices[0] if choices else None)}"
            )
        if message.startswith("expected"):
            return f"{flag} needs a value; {self._hint(action)}"
        if message.startswith("not allowed with"):
            return f"{flag} is {message}; give only one of them"
        # an ArgumentTypeError: a flag's own message, saying what is wrong (and usually how to fix it)
        return f"{flag}: {message}" if "e.g." in message else f"{flag}: {message}; {self._hint(action)}"

    def _hint(self, action: argparse.Action, example: str | None = None) -> str:
        """How to give the flag: the planner option's own hint, else an example value (its default,
        or one its help names)."""
        from optimizer.problem.options import OPTION_SPECS

        spec = next((o for o in OPTION_SPECS if o.flag in action.option_strings and o.name == action.dest), None)
        if spec is not None:
            return spec.hint
        flag = action.option_strings[-1] if action.option_strings else action.dest
        given = None
        if action.default not in (None, False, True, argparse.SUPPRESS) and not isinstance(
            action.default, (list, tuple)
        ):
            given = str(action.default)
        convert = action.type if action.type in (int, float) else str  # a flag's own type may do more than convert
        for word in (
            []
            if given is not None
            else re.findall(r"(?:default|e\.g\.)[:\s]+(?:\S+ or )?([\w.,+-]+)", action.help or "")
        ):
            try:
                convert(word)  # type: ignore[operator]
            except ValueError:
                continue
            given = word
            break
        example = given or example
        if example is not None:
            return f"e.g. {flag} {example}"
        kind = _KINDS.get(action.type)  # type: ignore[call-overload]
        return f"give {kind} after {flag} (see {self.prog} --help)" if kind else f"see {self.prog} --help"

    def _unknown(self, extra: list[str]) -> NoReturn:
        first = extra[0]
        if not first.startswith("-"):
            self.fail(f"unexpected argument {first!r}; flags take the form --name VALUE (see {self.prog} --help)")
        flags = [o for a in self._actions for o in a.option_strings]
        close = difflib.get_close_matches(first.split("=", 1)[0], flags, n=1)
        hint = f"did you mean {close[0]}?" if close else f"see {self.prog} --help for its flags"
        self.fail(f"{first} is not a flag of {self.prog}; {hint}")

    def _action(self, name: str | None) -> argparse.Action | None:
        """The action argparse names ``name`` in its messages (its flags joined by '/', or its dest)."""
        return next(
            (
                a
                for a in self._actions
                if name is not None
                and (
                    name == "/".join(a.option_strings)
                    or name in a.option_strings
                    or (not a.option_strings and name in (a.dest, a.metavar))
                )
            ),
            None,
        )

    def _usage(self, names: list[str]) -> str:
        parts = []
        for name in names:
            action = self._action(name)
            parts.append(
                f"{name} {action.metavar or action.dest.upper()}"
                if action is not None and action.option_strings and action.nargs != 0
                else name
            )
        return ", ".join(parts)

    def _command_action(self) -> Any:
        return next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)

    def _commands(self) -> list[str]:
        sub = self._command_action()
        return list(sub.choices) if sub is not None else []

    def _chosen(self, parsed: argparse.Namespace) -> CommandParser:
        """The parser of the subcommand ``parsed`` ran (this one when it has none)."""
        sub = self._command_action()
        chosen = sub.choices.get(getattr(parsed, sub.dest, None) or "") if sub is not None else None
        return chosen if isinstance(chosen, CommandParser) else self


def parser() -> argparse.ArgumentParser:
    ap = CommandParser(
        prog="dhp",
        description="Plan dynamic hybrid (data x context) parallelism for a training batch.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="plan a batch and print the plan as JSON (or a summary)")
    _problem_args(p)
    p.add_argument("--summary", action="store_true", help="print a readable summary instead of JSON")
    p.add_argument("--no-shards", action="store_true", help="leave out each sample's token ranges per rank")
    p.add_argument("--compact", action="store_true", help="JSON on one line")
    p.add_argument("--show-profile", action="store_true", help="print the cost profile in force and exit")
    p.add_argument("--out", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_plan)

    v = sub.add_parser("validate", help="verify a plan file against its batch and cluster")
    v.add_argument("--plan", required=True, help="a plan printed by 'dhp plan'")
    _problem_args(v)
    v.set_defaults(func=cmd_validate)

    pr = sub.add_parser("presets", help="list the preset clusters, models and GPU types")
    pr.add_argument("--json", action="store_true", help="print every preset document")
    pr.set_defaults(func=cmd_presets)

    from optimizer.problem.workloads import WORKLOADS

    ex = sub.add_parser("example", help="print a generated batch file")
    ex.add_argument("--workload", choices=sorted(WORKLOADS), default="video")
    ex.add_argument("--samples", type=int, default=512)
    ex.add_argument("--seed", type=int, default=0)
    ex.set_defaults(func=cmd_example)

    for commands in (serve, bench_commands, trainer_commands, jobs_commands):
        commands.register(sub)
    return ap


EXIT_CODES = """exit codes:
  0  success
  1  the plan failed validation (dhp validate)
  2  bad input: one line on stderr naming the field and how to fix it
  3  valid input that no plan can satisfy
  4  I/O failure: the output could not be written (missing folder, full disk, closed stdout)"""


def _fail(message: str, code: int) -> int:
    if sys.stderr is not None:
        try:
            print(f"error: {message}", file=sys.stderr)
        except OSError:
            pass
    return code


EXTRA_OF = {
    "numpy": "engine",
    "numba": "engine",
    "ortools": "solver",
    "pulp": "solver",
    "highspy": "solver",
    "fastapi": "service",
    "uvicorn": "service",
    "sqlalchemy": "service",
    "alembic": "service",
    "pydantic": "service",
    "pydantic_settings": "service",
    "torch": "trainer",
    "transformers": "trainer",
    "pyarrow": "jobs",
    "ray": "ray",
    "matplotlib": "bench",
}
"""The extra that installs each library a command may need (the ``[client]`` extra alone has none of them)."""


def _missing(exc: ModuleNotFoundError) -> int:
    """One line naming the extra to install, for a library the command needs and this install lacks."""
    top = (exc.name or "").split(".")[0]
    if top not in EXTRA_OF:
        raise exc
    extra = EXTRA_OF[top]
    return _fail(f"this command needs {top}, which is not installed. To fix: pip install 'dhp-planner[{extra}]'.", 2)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (default: the process's own arguments) and return its exit code.

    Run as the process's command (``argv`` None: the ``dhp`` entry point, ``python -m api.cli.main``), the
    objects it made are frozen out of the cyclic collector when the process exits: the interpreter's last
    collections would otherwise walk every one of them, numba's compiler among them (150 to 250 ms after a
    plan, measured on the 2-core development machine), for memory the process is giving back anyway; and
    ``dhp plan`` counts its budget from the process's start (:func:`cmd_plan`). Such a process also keeps
    the memory it frees for reuse (:func:`planning.allocator.retain_freed_memory`)."""
    if argv is None:
        atexit.register(gc.freeze)
        retain_freed_memory()  # this process is the planner's own (planning.allocator)
    try:
        args = parser().parse_args(argv)
    except ModuleNotFoundError as exc:
        return _missing(exc)
    args.whole_process = argv is None
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        return _missing(exc)
    except InfeasibleError as exc:
        return _fail(str(exc), 3)
    except PlannerError as exc:
        return _fail(str(exc), 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader (e.g. `head`) went away; nothing is lost
        if sys.stderr is not None:
            sys.stderr.close()
        return 0
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        return _fail(f"cannot write{where}: {exc.strerror or exc}", 4)


if __name__ == "__main__":
    sys.exit(main())
