"""Reading the files users give (task files, topology.yaml) with bounds, before anything is validated.

A file larger than its bound, bytes that are not UTF-8, YAML nested deeper than `MAX_DEPTH` levels,
or YAML whose aliases (`*name`) would expand it past `ALIAS_GROWTH` times what is written (a
"billion laughs" file; an alias to a node that holds it) raise `ConfigError` as
`FILE:LINE: what is wrong`, in time and memory proportional to the file. Nothing is expanded,
recursed into or allocated beyond these bounds.

- `read_text(path, max_bytes)`: the file's text.
- `read_yaml(path)` -> (data, line_of): `line_of(loc)` is the 1-based line of the deepest node on the
  key path `loc` (a tuple of keys and list indices), found when asked (errors only).
- `read_json_line(text)`: one JSONL record, or ValueError saying what is wrong with it.
- `nesting(value)`: the nesting depth of plain data (dicts and lists), for data read by other means.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import msgspec
import yaml

from polar_hpc.errors import ConfigError

MAX_DEPTH = 32  # nesting levels of a document (YAML, or a JSONL record's metadata)
MAX_YAML_BYTES = 16 << 20  # YAML is parsed in Python (~1 MB/s): bigger suites belong in JSONL
MAX_JSONL_BYTES = 1 << 30
ALIAS_GROWTH = 10  # aliases may expand a YAML document to this many times its written nodes...
ALIAS_SLACK = 100_000  # ...plus this many

_JSON = msgspec.json.Decoder()


def read_text(path: Path, max_bytes: int) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if len(raw) > max_bytes:
        raise ConfigError(f"{path}: larger than {max_bytes} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - raw.rfind(b"\n", 0, e.start)
        raise ConfigError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {column})") from None


def read_yaml(path: Path) -> tuple[Any, Callable[[tuple], int]]:
    loader = _BoundedLoader(read_text(path, MAX_YAML_BYTES))
    try:
        node = loader.get_single_node()
        if node is not None and loader.expanded[id(node)] > ALIAS_GROWTH * loader.written + ALIAS_SLACK:
            raise yaml.composer.ComposerError(
                None, None, f"aliases expand this document to {loader.expanded[id(node)]} nodes, from "
                f"{loader.written} written (at most {ALIAS_GROWTH}x + {ALIAS_SLACK})", node.start_mark)
        data = None if node is None else loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    finally:
        loader.dispose()
    return data, lambda loc: _line_of(node, loc)


def read_json_line(text: str) -> Any:
    """One JSON value (msgspec: strict JSON, no NaN / Infinity, numbers in range); ValueError naming the problem."""
    try:
        return _JSON.decode(text)
    except RecursionError:
        raise ValueError(f"nested too deeply to read (a task nests at most {MAX_DEPTH} levels)") from None
    except msgspec.DecodeError as e:
        raise ValueError(str(e)) from None


def nesting(value: Any) -> int:
    """Depth of nested dicts / lists (a scalar is 0), level by level without recursion; stops past MAX_DEPTH."""
    depth, level = 0, [value]
    while depth <= MAX_DEPTH:
        level = [x for x in level if isinstance(x, (dict, list))]
        if not level:
            break
        depth += 1
        level = [v for x in level for v in (x.values() if isinstance(x, dict) else x)]
    return depth


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting before recursing into it, and counts for every node the
    nodes it stands for once aliases are expanded (`expanded`) and how deep that goes."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.written = 0  # nodes written in the file
        self.expanded: dict[int, int] = {}  # id(node) -> nodes in it, aliases expanded
        self.depth: dict[int, int] = {}  # id(node) -> its nesting depth, aliases expanded
        self._open = 0  # collections being composed around the current node

    def compose_node(self, parent: Any, index: Any) -> yaml.Node:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            node = cast(yaml.Node, super().compose_node(parent, index))
            if id(node) not in self.expanded:
                raise yaml.composer.ComposerError(None, None, "an alias to a node that contains it", mark)
            return node
        self._open += 1
        try:
            if self._open > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            node = cast(yaml.Node, super().compose_node(parent, index))
        finally:
            self._open -= 1
        children = _children(node)
        self.written += 1
        self.expanded[id(node)] = 1 + sum(self.expanded[id(c)] for c in children)
        self.depth[id(node)] = 1 + max((self.depth[id(c)] for c in children), default=0)
        if self.depth[id(node)] > MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels once its aliases are expanded", mark)
        return node


# YAML 1.2's exponent floats (`1e9`, no dot), which PyYAML's YAML 1.1 rules read as text: number fields are strict
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"), list("-+0123456789."))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _line_of(node: yaml.Node | None, loc: tuple) -> int:
    """Line of the deepest node on the key path `loc`; a mapping entry's line is its key's."""
    if node is None:
        return 1
    line = node.start_mark.line + 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == part), None)
            if pair is None:
                break
            line, node = pair[0].start_mark.line + 1, pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
