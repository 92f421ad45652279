"""The CLI imports only the module of the command it runs; the command map stays in step with the app."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import typer

import tuner.cli
from tuner.cli import COMMAND_MODULES, main


def test_every_command_is_in_the_map_and_registered_by_its_module() -> None:
    group = typer.main.get_command(tuner.cli.app)  # every command and plug-in
    own = {name: cmd.callback.__module__ for name, cmd in group.commands.items()  # type: ignore[attr-defined]
           if cmd.callback is not None and cmd.callback.__module__.startswith("tuner.cli.")}
    assert set(own) == set(COMMAND_MODULES)
    assert all(module == f"tuner.cli.{COMMAND_MODULES[name]}" for name, module in own.items())


def test_no_command_module_imports_another() -> None:
    """Parts two commands share live in the CLI's shared modules (_app, _traffic, _knobs, ...), never in one
    command's module: importing it would register its commands too. Lazy imports inside a function count."""
    package = Path(tuner.cli.__file__).parent
    commands = {f"tuner.cli.{module}" for module in COMMAND_MODULES.values()}
    crossing = []
    for module in sorted(commands):
        tree = ast.parse((package / f"{module.rsplit('.', 1)[1]}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        crossing += [f"{module} imports {name}" for name in sorted(imported & (commands - {module}))]
    assert crossing == []


def test_frontier_loads_neither_the_study_nor_the_trial_backend() -> None:
    """`topotune frontier` imports its own module only (not tune/doctor/workload, the vLLM trial backend or the
    space)."""
    code = ("import sys, contextlib, io\nfrom tuner.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    main(['frontier', '--help'])\n"
            "print(sorted(m for m in ('tuner.cli._tune', 'tuner.cli._doctor', 'tuner.cli._workload', 'tuner.study', "
            "'tuner.space', 'tuner.backends.vllm._backend', 'tuner.settings') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_help_lists_every_command(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMAND_MODULES)


def test_the_console_script_collects_rarely_only_for_short_commands() -> None:
    """run() freezes the imports out of the collector's passes; only a compute-only command raises the threshold
    (a long `tune` or the service keep the default)."""
    code = ("import gc, sys, contextlib, io\nfrom tuner.cli import main\ndefault = gc.get_threshold()[0]\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    main([sys.argv[1], '--help'], process=True)\n"
            "print(gc.get_threshold()[0] > default, gc.get_freeze_count() > 0)")
    seen = {command: subprocess.run([sys.executable, "-c", code, command], check=True, capture_output=True,
                                    text=True).stdout.split() for command in ("frontier", "tune")}
    assert seen == {"frontier": ["True", "True"], "tune": ["False", "True"]}
