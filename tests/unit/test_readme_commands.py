"""The commands the READMEs show parse, their configs resolve, and the run directories they read are
ones a README command writes.

A README is a manual: a command in it that no longer parses (a renamed flag, a config key moved to
another section) or that reads a run no command of the manual wrote (``runs/tiny`` after the default
run was renamed) fails its reader on the first try. Nothing here trains; the end-to-end commands run in
tests/integration (the bring-your-own-data commands verbatim).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from d3ray.cli import parse_args
from d3ray.config import RunConfig
from d3ray.config_loading import load_config
from d3ray.errors import UserError
from d3ray.run.defaults import FINETUNE_DEFAULTS

REPO = Path(__file__).resolve().parents[2]
READMES = [REPO / "README.md", *sorted((REPO / "d3ray").glob("**/README.md"))]
FENCE = re.compile(r"^```(?:bash|sh|console)?\s*$\n(.*?)^```", re.MULTILINE | re.DOTALL)
RUN_DIR = re.compile(r"^runs/([\w.-]+)$")


def commands(readme: Path) -> list[list[str]]:
    """The ``d3ray`` commands of a README's shell blocks, each as argv (after ``d3ray``): comments cut,
    ``a && b`` split; a line listing alternatives (``bench solver | influence``) keeps its first."""
    found = []
    for block in FENCE.findall(readme.read_text()):
        for line in block.splitlines():
            for command in line.split(" && "):
                if command.strip().startswith("d3ray "):
                    argv = shlex.split(command, comments=True)[1:]
                    found.append(argv[:argv.index("|")] if "|" in argv else argv)
    return found


def resolved_config(args) -> RunConfig:
    """The RunConfig ``d3ray pretrain`` or ``finetune`` would run with (before ``--from``)."""
    defaults = FINETUNE_DEFAULTS if args.command == "finetune" and not args.config else []
    config = args.config and str(REPO / args.config)
    return load_config(RunConfig, config, [*defaults, *args.overrides])


def test_the_readmes_show_commands_of_every_kind() -> None:
    """The walk finds the manual's commands (a parser that found none would pass the tests below)."""
    kinds = {argv[0] for readme in READMES for argv in commands(readme) if argv}
    assert {"pretrain", "finetune", "census", "export", "eval", "bench", "data"} <= kinds


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(REPO)))
def test_readme_commands_parse_and_their_training_configs_resolve(readme: Path) -> None:
    problems = []
    for argv in commands(readme):
        try:
            args = parse_args(argv)
            if args.command in ("pretrain", "finetune"):
                resolved_config(args)
        except SystemExit:  # argparse's error, printed above
            problems.append(f"`d3ray {shlex.join(argv)}` does not parse")
        except UserError as err:  # an unknown key or a wrong value, named
            problems.append(f"`d3ray {shlex.join(argv)}`: {err}")
    assert not problems, f"{readme.relative_to(REPO)}: " + "; ".join(problems)


def test_the_main_readme_reads_only_runs_its_own_commands_write() -> None:
    """``d3ray census runs/X``, ``export runs/X``, ``finetune --from runs/X``: X is the name of a run a
    pretrain or finetune command of the same README writes."""
    argvs = commands(REPO / "README.md")
    written = {resolved_config(args).name for args in map(parse_args, argvs)
               if args.command in ("pretrain", "finetune")}
    read = {match.group(1) for argv in argvs for word in argv if (match := RUN_DIR.match(word))}
    assert read, "the README shows no command reading a run directory"
    assert read <= written, f"the README reads runs no command of it writes: {sorted(read - written)}"


def test_the_main_readmes_training_commands_with_different_configs_write_different_runs() -> None:
    """A run directory holds one config (d3ray/run/rerun.py refuses another): two training commands of the
    README that a reader may run one after the other differ in their run names, or train the same run."""
    from d3ray.config_loading import to_dict
    from d3ray.run.rerun import RESUMABLE_KEYS, stored_config_changes

    runs: dict[tuple[str, str], tuple[list[str], dict]] = {}
    for argv in commands(REPO / "README.md"):
        args = parse_args(argv)
        if args.command not in ("pretrain", "finetune"):
            continue
        cfg = resolved_config(args)
        first = runs.setdefault((cfg.output_dir, cfg.name), (argv, to_dict(cfg)))
        changes, _ = stored_config_changes(first[1], cfg, RESUMABLE_KEYS)
        assert not changes, (f"`d3ray {shlex.join(first[0])}` and `d3ray {shlex.join(argv)}` both write "
                             f"{cfg.output_dir}/{cfg.name} with other configs ({changes[:2]}): give one a --name")
