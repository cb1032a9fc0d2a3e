"""`amago-train --help`: the config groups a user picks from (not the internal `schema/*` ones) and the composed
config, each option with the one-line explanation from its schema's docstring.

Hydra renders the help from `hydra.help.template` (conf/hydra/default.yaml), which calls the `${amago_help:}`
resolver registered here; the resolver sees the whole composed config, including Hydra's record of which
option each group chose (`hydra.runtime.choices`), so the help follows the command line
(`amago-train env=gym --help` explains the gym env's options).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from amago_app.config import schema

_SCHEMA_LINE = re.compile(r"^\s*-\s*/schema/(.+)/([^/@\s]+)@_here_\s*$", re.M)
COMMENT_COLUMN = 44


@lru_cache(maxsize=None)
def _docstrings_by_class() -> dict[str, dict[str, str]]:
    """{class name: {field: first paragraph of its docstring}} from the source of config/schema.py (dataclass field
    docstrings are not kept at run time)."""
    tree = ast.parse(inspect.getsource(schema))
    out: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs: dict[str, str] = {}
        for field, nxt in zip(node.body, node.body[1:]):
            if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                # the first paragraph (docstrings wrap their first sentence over lines), as one line
                docs[field.target.id] = " ".join(nxt.value.value.strip().split("\n\n")[0].split())
        out[node.name] = docs
    return out


def field_docs(cls: type) -> dict[str, str]:
    """One-line explanations of a schema's fields, inherited ones included."""
    by_class = _docstrings_by_class()
    docs: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        docs.update(by_class.get(base.__name__, {}))
    return docs


def option_schema(conf_dir: Path, group: str, option: str) -> type | None:
    """The schema an option's YAML file builds on (`- /schema/<group>/<name>@_here_` in its defaults)."""
    path = conf_dir / group / f"{option}.yaml"
    if not path.is_file():
        return None
    m = _SCHEMA_LINE.search(path.read_text())
    return schema.SCHEMAS.get(m.group(1), {}).get(m.group(2)) if m else None


def _groups(conf_dir: Path) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for f in sorted(conf_dir.glob("**/*.yaml")):
        group = f.parent.relative_to(conf_dir).as_posix()
        if group != "." and not group.startswith("hydra"):
            groups.setdefault(group, []).append(f.stem)
    return groups


def _value(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=str) if v else ("[]" if isinstance(v, list) else "{}")
    return str(v)


def render_help(root: DictConfig, conf_dir: Path) -> str:
    choices = {k: v for k, v in (OmegaConf.select(root, "hydra.runtime.choices") or {}).items()
               if not k.startswith(("hydra", "schema")) and v is not None}
    groups = _groups(conf_dir)
    lines = ["== Config groups ==  (choose one option per group: group=option; * = this command's choice)", ""]
    width = max(len(g) for g in groups) + 2
    for group, options in sorted(groups.items()):
        marked = " ".join(f"{o}*" if choices.get(group) == o else o for o in options)
        wrapped = textwrap.wrap(marked, 116 - width) or [""]
        lines.append(f"  {group:<{width}}{wrapped[0]}")
        lines += [f"  {'':<{width}}{w}" for w in wrapped[1:]]

    # which schema explains which config node
    docs_at: dict[str, dict[str, str]] = {"": field_docs(schema.Config)}
    for group, option in choices.items():
        cls = option_schema(conf_dir, group, str(option))
        if cls is not None:
            docs_at[group.replace("/", ".")] = field_docs(cls)

    lines += ["", "== Config ==  (override any key: key=value; add a key: +key=value; "
              "--cfg job prints it, --resolve resolves it)", ""]
    config = OmegaConf.to_container(root, resolve=False)
    config.pop("hydra", None)

    def walk(node: dict, path: str, indent: int) -> None:
        docs = docs_at.get(path, {})
        for key, value in node.items():
            sub = f"{path}.{key}" if path else str(key)
            pad = "  " * indent
            if isinstance(value, dict) and value:
                lines.append(f"{pad}{key}:" + (f"  # {docs[key]}" if key in docs else ""))
                walk(value, sub, indent + 1)
                continue
            text = f"{pad}{key}: {_value(value)}"
            doc = docs.get(str(key))
            if doc:
                text = f"{text:<{COMMENT_COLUMN}}  # {doc}" if len(text) < COMMENT_COLUMN + 30 else f"{text}  # {doc}"
            lines.append(text)

    walk(config, "", 1)
    # Hydra fills its template with string.Template: a literal `$` (interpolations such as ${env.horizon})
    # must be written `$$`
    return "\n".join(lines).replace("$", "$$")


def help_resolver(*, _root_: DictConfig) -> str:
    from amago_app.config import config_dir

    return render_help(_root_, Path(config_dir()))


def register_help_resolver() -> None:
    if not OmegaConf.has_resolver("amago_help"):
        OmegaConf.register_new_resolver("amago_help", help_resolver, use_cache=False)

