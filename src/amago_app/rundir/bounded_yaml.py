"""The YAML files of a run (config.yaml, overrides_history.yaml, .hydra/*.yaml), read safely and within bounds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from amago_app.rundir.errors import RunDirError


#: a run's YAML files are a few KB; these bounds keep a crafted file (an alias bomb, a huge file) from hanging
#: or exhausting a command that reads it
YAML_MAX_BYTES = 8 * 2**20
YAML_MAX_NODES = 200_000


def _yaml_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: yaml.Node, limit: int) -> None:
    """Refuse a document whose aliases expand it beyond `limit` nodes, or that contains itself. Aliases make the
    node graph a DAG: sizes are summed once per distinct node, so the check is as cheap as the file is small."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the current path of the depth-first walk
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in _yaml_children(node))
            if sizes[key] > limit:
                raise ValueError(f"its aliases expand it beyond {limit:,} entries")
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise ValueError("an alias refers to a node that contains it (a recursive document)")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _yaml_children(node) if id(c) not in sizes)


def _bounded_loader():
    from omegaconf._utils import get_yaml_loader  # OmegaConf's safe loader (its float syntax, duplicate keys)

    class BoundedLoader(get_yaml_loader()):
        def construct_document(self, node):
            _check_expansion(node, YAML_MAX_NODES)
            return super().construct_document(node)

    return BoundedLoader


def read_yaml(path: str | os.PathLike) -> Any:
    """The plain data of a YAML file of a run directory, read safely and within bounds (no code runs, an alias
    bomb or a huge file is refused); any problem raises RunDirError naming the file."""
    path = Path(path)
    size = path.stat().st_size
    if size > YAML_MAX_BYTES:
        raise RunDirError(f"{path} is {size:,} bytes, more than a run's YAML file can be ({YAML_MAX_BYTES:,}); "
                          "refusing to read it")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise RunDirError(f"{path} is not a text file (it is not UTF-8): restore it or start a new run") from None
    loader = _bounded_loader()(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise RunDirError(f"{path} is not valid YAML: {e.problem or e.context}{where}") from None
    except (yaml.YAMLError, ValueError) as e:
        raise RunDirError(f"{path} is refused: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except RecursionError:
        raise RunDirError(f"{path} is refused: it is nested too deeply") from None
    finally:
        loader.dispose()
