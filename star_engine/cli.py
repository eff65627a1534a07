"""The ``star-engine`` command."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .errors import UserError


def _parser(commands: dict | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="star-engine", description="Run STaR (Self-Taught Reasoner) experiments.")
    sub = p.add_subparsers(dest="command", required=True)

    def experiment_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("file", type=Path, help="experiment TOML file")
        sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key, e.g. --set generation.batch_size=16 (repeatable)")
        sp.add_argument("--limit", type=int, default=None, metavar="N", help="use N examples per split (smoke runs)")

    run = sub.add_parser("run", help="run (or resume) an experiment")
    experiment_args(run)
    run.add_argument("--quiet", action="store_true", help="no console log (events still go to the run directory)")
    val = sub.add_parser("validate", help="check an experiment file, its plugins and its data; write nothing")
    experiment_args(val)
    pl = sub.add_parser("plugins", help="list plugins and their components")
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.add_argument("--requirements", action="store_true", help="print name==version lines")
    rep = sub.add_parser("report", help="write report.png and report.md for a run directory")
    rep.add_argument("run_dir", type=Path)
    rep.add_argument("--compare", type=Path, default=None, help="a second run directory to overlay")
    for name, command in (commands or {}).items():  # subcommands contributed by plugins
        command.add_arguments(sub.add_parser(name, help=command.help))
    return p


def _load(args: argparse.Namespace, load_data: bool = True):
    from .config import load_experiment
    from .experiment import build
    from .registry import Registry

    if args.limit is not None and args.limit < 1:
        raise UserError("--limit: must be >= 1")
    cfg = load_experiment(args.file, args.overrides, args.limit)
    try:
        return build(cfg, Registry(), load_data=load_data)
    except UserError as e:
        # Key-path errors get the experiment file in front; data errors already name their file.
        if re.match(r"^[^\s:]+:\d+", str(e)):
            raise
        raise type(e)(f"{args.file}: {e}") from None


def cmd_run(args: argparse.Namespace) -> int:
    from . import ui
    from .runner import run

    ui.configure_logging(None, quiet=args.quiet)
    exp = _load(args)
    run(exp, args.file)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    exp = _load(args)
    sizes = ", ".join(f"{k}={len(v)}" for k, v in exp.splits.items())
    print(f"{args.file}: OK (task {exp.cfg['task']['dataset']}: {sizes}; backend {exp.cfg['model']['backend']}; "
          f"run directory {exp.run_dir})")
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from .registry import Registry

    reg = Registry()
    if args.requirements:
        print("\n".join(reg.requirements()))
        return 0
    info = reg.describe()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="star-engine plugins")
    for col in ("plugin", "distribution", "version", "components", "status"):
        table.add_column(col)
    for p in info:
        comps = "\n".join(f"{k}: {', '.join(v)}" for k, v in sorted(p["components"].items()))
        comps = comps or "hooks: " + ", ".join(p["hooks"])  # observer-only plugins
        table.add_row(p["name"], p["distribution"], p["version"], comps, p["error"] or "ok")
    Console().print(table)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report

    for d in filter(None, (args.run_dir, args.compare)):
        if not d.is_dir():
            raise UserError(f"{d}: no such run directory")
    path = write_report(args.run_dir, args.compare)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


BUILTIN = {"run": cmd_run, "validate": cmd_validate, "plugins": cmd_plugins, "report": cmd_report}


def _plugin_commands() -> dict:
    """Subcommands from ``register_commands``; a broken one is left out (``plugins`` shows why)."""
    from .registry import Registry

    reg = Registry()
    out = {}
    for name, comp in sorted(reg.components["command"].items()):
        if name in BUILTIN or comp.plugin.error or (("command", name) in reg.conflicts):
            continue
        try:
            out[name] = comp.factory()
        except Exception:  # noqa: BLE001 -- a plugin's bug must not break the core commands
            continue
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = _plugin_commands() if argv and argv[0] not in BUILTIN else {}
    args = _parser(commands).parse_args(argv)
    try:
        if args.command in commands:
            return int(commands[args.command].run(args))
        return BUILTIN[args.command](args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
