"""The serving knobs as command-line options, derived from Topology's fields (tuner.topology.KNOBS).

As vLLM builds its CLI from its config dataclasses (vllm/engine/arg_utils.py EngineArgs.add_cli_args over
vllm/config/utils.py get_kwargs: a field's type, default and doc make its argument), each knob here is one typer
option named as vLLM names the flag, with the field's default and description. A command asks for them with
`@knob_options()` and receives their values as one `knobs` dict, ready for `Topology.parse(name, **knobs)`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import typer

from tuner.topology import KNOBS, Topology, knob_default, knob_help

PANEL = "vLLM engine knobs"
Command = TypeVar("Command", bound=Callable[..., None])


def option_names(name: str) -> tuple[str, ...]:
    """The knob's option strings: vLLM's flag (a switch also its --no- form), then topotune's older spellings."""
    knob = KNOBS[name]
    flag = knob.cli or knob.flag
    if Topology.model_fields[name].annotation is bool:
        return (f"{flag}/--no-{flag.removeprefix('--')}",)
    return (flag, *knob.aliases)


# The library's names for one instance's fields (a knob as its errors name it, `gpu-memory-utilization`; the GPU;
# the layout) as the flags of the commands that take them: the table their errors go through (`as_flags`).
KNOB_FLAGS: dict[str, str] = {name.replace("_", "-"): option_names(name)[0].split("/")[0] for name in KNOBS}
INSTANCE_FLAGS: dict[str, str] = {**KNOB_FLAGS, "hardware": "--hardware", "hardware_file": "--hardware-file",
                                  "topology": "--topology", "mtp": "--mtp", "calibration": "--calibration"}
# The same for the commands whose layout is a deployment (`--deployment 2x:TP8`): live-check, replay.
DEPLOYMENT_FLAGS: dict[str, str] = {**INSTANCE_FLAGS, "topology": "--deployment", "deployment": "--deployment"}


def knob_parameter(name: str) -> inspect.Parameter:
    """One knob as a typer option: the field's type (a choice of strings as str: Topology.create names the field
    and the choices when the value is not one), default and description."""
    annotation: Any = Topology.model_fields[name].annotation
    help_text = knob_help(name)
    choices = [a for a in get_args(annotation) if isinstance(a, str)] if get_origin(annotation) is Literal else []
    if choices:
        annotation = str
        help_text += " One of: " + ", ".join(choices) + "."
    option = typer.Option(*option_names(name), help=help_text, rich_help_panel=PANEL)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=knob_default(name),
                             annotation=Annotated[annotation, option])


def knob_options(*, exclude: Collection[str] = ()) -> Callable[[Command], Command]:
    """Give a command one option per serving knob (the layout's fields excepted: --topology names them, and those
    in `exclude`); the command's `knobs` parameter receives their values by field name."""
    names = [name for name, knob in KNOBS.items() if not knob.layout and name not in exclude]

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        kept = [p for p in signature.parameters.values() if p.name != "knobs"]
        parameters = [*kept, *(knob_parameter(name) for name in names)]

        @functools.wraps(command)
        def run(**kwargs: Any) -> None:
            knobs = {name: kwargs.pop(name) for name in names}
            command(knobs=knobs, **kwargs)

        run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        del run.__wrapped__  # typer reads the signature above, not the command's own
        return run  # type: ignore[return-value]

    return decorate
