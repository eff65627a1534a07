"""The ``star-engine`` command. Failures end in ``star_engine.boundary``: bad input is one
line and exit code 2, anything else a bug with its traceback (exit code 1).

Each command imports what it uses inside its function (the only function-level imports of the
core, besides matplotlib's in ``report``): ``star-engine --help`` and a light command load
neither pyarrow, structlog nor the plugins they do not need."""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn
from pathlib import Path

from .errors import PluginError, UserError


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's rule for bad input: one line on stderr, exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see {self.prog} --help)".replace("\n", " "), file=sys.stderr)
        sys.exit(2)


def _parser(commands: dict | None = None) -> argparse.ArgumentParser:
    from .version import __version__

    p = _Parser(prog="star-engine", description="Run STaR (Self-Taught Reasoner) experiments.")
    p.add_argument("--version", action="version", version=f"star-engine {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def experiment_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("file", type=Path, help="experiment TOML file")
        sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key, e.g. --set generation.batch_size=16 (repeatable)")
        sp.add_argument("--limit", type=int, default=None, metavar="N", help="use N examples per split (smoke runs)")
        sp.add_argument("--smoke", action="store_true",
                        help="a quick run of every stage: the backend's default (tiny) model, a few questions, one "
                             "iteration, a few steps, gold completions if nothing is kept; in OUTPUT_DIR_smoke")
        sp.add_argument("--seeds", default=None, metavar="LIST",
                        help="one run per seed (experiment.seed), e.g. --seeds 0,1,2, each in OUTPUT_DIR_seedN, one "
                             "after the other (with a [sweep] table: for each of its runs; docs/many-runs.md)")

    run = sub.add_parser("run", help="run (or resume) an experiment")
    experiment_args(run)
    run.add_argument("--quiet", action="store_true", help="no console log (events still go to the run directory)")
    val = sub.add_parser("validate", help="make every check a run makes before it starts; write nothing")
    experiment_args(val)
    pl = sub.add_parser("plugins", help="list plugins and their components")
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    pl.add_argument("--requirements", action="store_true", help="print name==version lines")
    rep = sub.add_parser("report", help="write report.png and report.md for a run directory")
    rep.add_argument("run_dir", type=Path, help="a run directory (an experiment's output_dir, e.g. runs/addition)")
    rep.add_argument("--compare", type=Path, default=None,
                     help="a second run directory to overlay, written to RUN_DIR/report_vs_OTHER.md and .png (the "
                          "run's own report stays); deprecated: use star-engine compare")
    rep.add_argument("--label", dest="labels", action="append", default=[], metavar="NAME",
                     help="name RUN_DIR NAME in the report (given twice: the --compare run the second; default: "
                          "the experiment's name, or with --compare each run's directory)")
    cmp = sub.add_parser("compare", help="compare runs (those differing only by seed grouped: mean ± sd) in "
                                         "DIR/compare.md and DIR/compare.png")
    cmp.add_argument("runs", nargs="+", metavar="RUN_DIR",
                     help="run directories, or globs the command expands (quoted: 'runs/addition_seed*')")
    cmp.add_argument("--out", type=Path, required=True, metavar="DIR",
                     help="the folder for compare.md and compare.png, outside every run directory "
                          "(e.g. comparisons/addition)")
    exp = sub.add_parser("export", help="write a run's rationales in a training format (--pairs, --sft)")
    exp.add_argument("run_dir", type=Path, help="a run directory (an experiment's output_dir, e.g. runs/addition)")
    exp.add_argument("--pairs", action="store_true",
                     help="(question, correct rationale, wrong rationale) triples as JSON Lines (docs/ledger.md)")
    exp.add_argument("--sft", action="store_true",
                     help="the kept rationales as JSON Lines for TRL's SFTTrainer (docs/ledger.md)")
    exp.add_argument("--out", type=Path, default=None,
                     help="output file (default RUN_DIR/pairs.jsonl, RUN_DIR/sft.jsonl or RUN_DIR/sft_messages.jsonl)")
    exp.add_argument("--max-pairs-per-question", type=int, default=0, metavar="N", help="--pairs: 0 = all")
    exp.add_argument("--iteration", type=int, default=None, metavar="N",
                     help="--sft: iteration N's fine-tuning set only (default: every iteration's, each text once)")
    exp.add_argument("--format", dest="sft_format", default="prompt-completion",
                     choices=("prompt-completion", "messages"),
                     help="--sft: {prompt, completion} or {messages: [user, assistant]} (default prompt-completion)")
    exp.add_argument("--few-shot", action="store_true",
                     help="--sft: put the task's few-shot prompt before each stored prompt (default: the prompt "
                          "the run fine-tuned on)")
    data = sub.add_parser("data", help="check the data files an experiment (or every installed task) expects")
    data_sub = data.add_subparsers(dest="data_command", required=True, metavar="check")
    chk = data_sub.add_parser("check", help="which expected files are present, missing or different (sha256); "
                                            "writes nothing")
    chk.add_argument("file", type=Path, nargs="?", default=None,
                     help="experiment TOML file (default: every file the installed tasks know, under --root)")
    chk.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a key of the experiment, e.g. --set task.data_root='\"/data\"'")
    chk.add_argument("--root", type=Path, default=None, metavar="DIR",
                     help="without an experiment: the data root (default: $STAR_ENGINE_DATA)")
    show = sub.add_parser("show", help="print what the model wrote: a run's rationales and evaluation answers, "
                                       "with their verdicts and what was kept")
    show.add_argument("run_dir", type=Path, help="a run directory (an experiment's output_dir, e.g. runs/addition)")
    show.add_argument("--iteration", type=int, default=None, metavar="N", help="iteration N only")
    show.add_argument("--split", default=None, metavar="S",
                      help="the train split (the rationales) or an evaluation split (its greedy and sampled answers)")
    show.add_argument("--wrong", action="store_true", help="only what the checker judged wrong")
    show.add_argument("--rationalized", action="store_true", help="only rationales generated with the hint")
    show.add_argument("--class", dest="cls", default=None, metavar="C", help="only questions of class C")
    show.add_argument("--question", default=None, metavar="ID",
                      help="only question ID, and (as a table) its history across iterations (questions.parquet)")
    show.add_argument("--grep", default=None, metavar="REGEX",
                      help="only rows whose question, text or predicted answer matches REGEX (Python re)")
    show.add_argument("--limit", type=int, default=None, metavar="N", help="at most N rows")
    show.add_argument("--format", dest="fmt", default="table", choices=("table", "jsonl", "csv"),
                      help="table (default), or every column as JSON Lines or CSV on stdout")
    stat = sub.add_parser("status", help="whether a run is finished, running or stopped (at which stage), its time "
                                         "spent and left")
    stat.add_argument("run_dir", type=Path, help="a run directory (an experiment's output_dir, e.g. runs/addition)")
    for name, command in (commands or {}).items():  # subcommands contributed by plugins
        command.add_arguments(sub.add_parser(name, help=command.help))
    return p


def _load(args: argparse.Namespace, load_data: bool = True):
    """The experiment of ``args.file`` built, and everything ``run`` checks before it writes
    (``runner.preflight``); an error names the file, or the ``--set`` that gave the value."""
    from .config.load import Origins, load_experiment
    from .run.experiment import build
    from .config.registry import Registry
    from .run.runner import preflight

    if args.limit is not None and args.limit < 1:
        raise UserError("--limit: must be >= 1")
    registry = Registry()
    cfg = load_experiment(args.file, args.overrides, args.limit, registry, smoke=args.smoke)
    try:
        exp = build(cfg, registry, load_data=load_data)
        return exp, preflight(exp)
    except UserError as e:
        raise Origins(args.file, args.overrides).place(e) from None


def cmd_run(args: argparse.Namespace) -> int:
    from . import ui
    from .run.runner import run

    ui.configure_logging(None, quiet=args.quiet)
    if args.seeds is not None or _sweeps(args):
        return cmd_run_many(args)
    exp, _ = _load(args)
    run(exp, args.file)
    return 0


def _sweeps(args: argparse.Namespace) -> bool:
    """The file has a ``[sweep]`` table (``star_engine.run.sweep``)."""
    from .run.sweep import plan

    return plan(args.file, args.overrides, None) is not None


def cmd_run_many(args: argparse.Namespace) -> int:
    from .run.sweep import compare_command, plan, run_all

    members = plan(args.file, args.overrides, args.seeds) or []
    done = run_all(args.file, args.overrides, args.limit, args.smoke, members, args.quiet)
    if not args.quiet:
        print(f"{len(done)} runs of {args.file}:")
        print("\n".join(f"  {root}: {what}" for root, what in done))
        print(f"see them together: {compare_command([d for d, _ in done], args.file.stem)}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from .ui import progress_interval
    progress_interval()  # the environment variables run reads (STAR_ENGINE_PROGRESS_INTERVAL), checked here too
    if args.seeds is not None or _sweeps(args):
        from .run.sweep import check_all, plan

        members = plan(args.file, args.overrides, args.seeds) or []
        for m, root, what in check_all(args.file, args.overrides, args.limit, args.smoke, members):
            print(f"{args.file} [{m.label}]: OK (run directory {root}: {what})")
        print(f"{args.file}: {len(members)} runs, all OK")
        return 0
    exp, state = _load(args)
    sizes = ", ".join(f"{k}={len(v)}" for k, v in exp.splits.items())
    what = "new"
    if state.resume:
        from .report.status import rerun_note

        what = rerun_note(exp.run_dir, exp.config.experiment.iterations)
    print(f"{args.file}: OK (task {exp.config.task.dataset}: {sizes}; backend {exp.config.model['backend']}; "
          f"run directory {exp.run_dir}: {what})")
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from . import ui
    from .config.registry import Registry

    reg = Registry()
    if args.requirements:
        print("\n".join(reg.requirements()))
    elif args.json:
        print(json.dumps(reg.describe(), indent=2))
    else:
        ui.plugin_listing(reg.describe())
    sys.stdout.flush()  # a closed pipe fails here, inside the boundary
    broken = [p for p in reg.plugins.values() if p.error]
    if broken:  # listed above; the exit code says so too
        raise PluginError(f"{len(broken)} installed plugin(s) failed to load: "
                          + "; ".join(f"{p.label}: {p.error}" for p in broken))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from .report.datacheck import command

    return command(args.file, args.overrides, args.root)


def cmd_report(args: argparse.Namespace) -> int:
    from .report.report import write_report

    for d in filter(None, (args.run_dir, args.compare)):
        if not d.is_dir():
            raise UserError(f"{d}: no such run directory")
    from . import ui

    written = write_report(args.run_dir, args.compare, args.labels)
    if args.compare is not None:  # (after it is written: an error stays one line)
        print("note: report --compare is deprecated; it writes report_vs_*.md beside the run's own report.md, "
              "which it no longer replaces; for any number of runs use star-engine compare RUN... --out DIR",
              file=sys.stderr)
    ui.print_summary(written.rows)
    ui.print_text(written.reading)
    print(f"wrote {written.path} and {written.path.with_suffix('.png')}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .report.compare import write

    done = write(args.runs, args.out)
    print("\n".join(done.lines))
    print(f"wrote {done.path} and {done.path.with_suffix('.png')}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .report.export import export_pairs, export_sft

    if not (args.pairs or args.sft):
        raise UserError("export: say what to export: --pairs or --sft")
    if args.pairs and args.sft:
        raise UserError("export: --pairs and --sft exclude each other (one file each)")
    if not args.sft:
        for flag, given in (("--iteration", args.iteration is not None), ("--few-shot", args.few_shot),
                            ("--format", args.sft_format != "prompt-completion")):
            if given:
                raise UserError(f"{flag}: only with --sft")
    elif args.max_pairs_per_question:
        raise UserError("--max-pairs-per-question: only with --pairs")
    if not args.run_dir.is_dir():
        raise UserError(f"{args.run_dir}: no such run directory")
    if args.pairs:
        out = args.out or args.run_dir / "pairs.jsonl"
        n, why = export_pairs(args.run_dir, out, args.max_pairs_per_question)
        what = "pairs"
    else:
        name = "sft.jsonl" if args.sft_format == "prompt-completion" else "sft_messages.jsonl"
        out = args.out or args.run_dir / name
        n, why = export_sft(args.run_dir, out, args.sft_format, args.iteration, args.few_shot)
        what = f"{args.sft_format} examples"
    print(f"wrote {n} {what} to {out}" + (f" ({why})" if why else ""))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from .report.show import Filters, command

    return command(args.run_dir, Filters(args.iteration, args.split, args.wrong, args.rationalized, args.cls,
                                         args.question, args.grep, args.limit), args.fmt)


def cmd_status(args: argparse.Namespace) -> int:
    from .report.status import command

    return command(args.run_dir)


BUILTIN = {"run": cmd_run, "validate": cmd_validate, "plugins": cmd_plugins, "report": cmd_report,
           "export": cmd_export, "data": cmd_data, "show": cmd_show, "status": cmd_status,
           "compare": cmd_compare}


def _plugin_commands() -> dict:
    """Subcommands from ``register_commands``; a broken one is left out (``plugins`` shows why)."""
    from .config.registry import Registry

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
    from .boundary import run_command

    argv = sys.argv[1:] if argv is None else argv
    commands = _plugin_commands() if not argv or argv[0] not in BUILTIN else {}
    parser = _parser(commands)
    if not argv:  # no command: the usage, and every command with what it does (a usage error)
        parser.print_help(sys.stderr)
        return 2
    from .config.datafiles import not_utf8

    for arg in argv:  # bytes that are not UTF-8 (surrogate escapes): no file, log or plot can hold them
        shown = not_utf8(arg)
        if shown is not None:
            print(f"error: argument {shown}: not valid UTF-8", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    from . import ui

    ui.rerun_started()
    if args.command in commands:
        return run_command(lambda: commands[args.command].run(args))
    return run_command(lambda: BUILTIN[args.command](args))


if __name__ == "__main__":
    sys.exit(main())
