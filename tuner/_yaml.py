"""YAML a user hands topotune (search spaces, workload files), refused before anything walks it when aliases or
merge keys would blow it up (a few hundred bytes can expand to 10**9 nodes) or it nests absurdly deep.

The composed graph shares one node per anchor, so it is small; what explodes is every walk of it (a line index,
the constructor, validation). Counting the expanded size with a memo per node is linear in the text.
"""

from __future__ import annotations

from typing import Any

import yaml

from tuner.errors import ConfigError

MAX_YAML_NODES = 20_000  # after alias expansion: the billion-laughs document expands to ~10**9
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 32


def bounded_compose(text: str, source: str, *, what: str = "the space",
                    example: str = "search_spaces/gb300-nvl72-8k1k.yaml") -> yaml.Node | None:
    """yaml.compose of `text`, or a ConfigError on `source` when aliases (merge keys included) or nesting exceed
    the bounds. `what` names the document in messages, `example` a well-formed one."""
    aliases = depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):  # events: no recursion, so no deep-nesting trap
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(f"{what} nests deeper than {MAX_YAML_DEPTH} levels", field=source,
                                  fix=f"{what} is a flat mapping: see {example}")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    if aliases > MAX_YAML_ALIASES:
        raise ConfigError(f"{what} uses {aliases} YAML aliases; at most {MAX_YAML_ALIASES}", field=source,
                          fix="write the values out instead of repeating anchors")
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is None:
        return None
    sizes: dict[int, int] = {}
    limit = ConfigError(f"{what} expands to more than {MAX_YAML_NODES:,} YAML nodes or nests deeper than "
                        f"{MAX_YAML_DEPTH} levels (aliases repeating aliases?)", field=source,
                        fix="write the values out instead of nesting anchors")

    def expanded(n: yaml.Node, depth: int, path: frozenset[int]) -> int:
        if depth > MAX_YAML_DEPTH or id(n) in path:  # too deep, or an alias to an ancestor (infinite)
            raise limit
        if id(n) in sizes:
            return sizes[id(n)]
        inner = path | {id(n)}
        if isinstance(n, yaml.MappingNode):
            total = 1 + sum(expanded(k, depth + 1, inner) + expanded(v, depth + 1, inner) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total = 1 + sum(expanded(v, depth + 1, inner) for v in n.value)
        else:
            total = 1
        if total > MAX_YAML_NODES:
            raise limit
        sizes[id(n)] = total
        return total

    expanded(node, 0, frozenset())
    return node


def bounded_load(text: str, source: str, *, what: str = "the space",
                 example: str = "search_spaces/gb300-nvl72-8k1k.yaml") -> tuple[yaml.Node | None, Any]:
    """(the composed node, yaml.safe_load's data) after bounded_compose: the node for readers that name lines;
    a syntax error is a ConfigError naming the line."""
    try:
        node = bounded_compose(text, source, what=what, example=example)
        return node, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise ConfigError(f"not valid YAML ({getattr(exc, 'problem', None) or exc})", field=where,
                          fix="fix the YAML syntax at that line") from None


def safe_load_bounded(text: str, source: str, *, what: str, example: str) -> Any:
    """yaml.safe_load after bounded_compose; a syntax error is a ConfigError naming the line."""
    return bounded_load(text, source, what=what, example=example)[1]
