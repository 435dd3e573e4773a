"""A model folder's tokenizer and chat template, rendered as transformers' `apply_chat_template`
renders them, without importing transformers (its import alone took 8-19 s on a loaded node; the
`tokenizers` library and jinja2 load in a fraction of a second).

`ModelFiles.load(folder)` reads `tokenizer.json` (the fast tokenizer; a folder without one is a
ValueError), the chat template(s) (`chat_template.jinja`, else `chat_template.json`, else
`tokenizer_config.json`'s `chat_template`, a text or a list of named ones; named extra ones from
`additional_chat_templates/*.jinja`), the special tokens (`bos_token`, `eos_token`, `unk_token`,
`sep_token`, `pad_token`, `cls_token`, `mask_token`: text or `{"content": ...}`, from
`tokenizer_config.json`, missing ones from `special_tokens_map.json`) and the end ids (the
`eos_token`'s, and `generation_config.json`'s `eos_token_id`). `template(tools)` picks the template
as transformers does (`tool_use` when there are tools and such a template, else `default`; `pick`
for a folder's templates alone, `read_templates(folder)`);
`compiled(text)` compiles one in transformers' sandbox: an immutable sandboxed environment with
`trim_blocks`, `lstrip_blocks`, loop controls and the `{% generation %}` tag, `tojson` without
HTML escaping, `raise_exception`, `strftime_now`, and `dict`/`namespace` that refuse
underscore names; `variables(text)` the names a template reads but never sets (what
`apply_chat_template(**kwargs)` could pass it). `aliased(chat)` fills `reasoning_content` (and `thinking`) from a message's
reasoning under any of its names, as transformers does before rendering.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
REASONING = ("reasoning_content", "thinking", "reasoning")  # the first is what templates read


@dataclass(frozen=True)
class ModelFiles:
    tokenizer: Tokenizer
    templates: dict[str, str]  # name: template; a single template is "default"
    special: dict[str, str]  # SPECIAL name: its text, for those the model has
    eos_ids: frozenset[int]

    @classmethod
    def load(cls, folder: Path) -> ModelFiles:
        try:
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise ValueError(f"cannot load the tokenizer in {folder}: {e}") from None
        config = _json(folder / "tokenizer_config.json")
        special = {**_tokens(_json(folder / "special_tokens_map.json")), **_tokens(config)}
        templates = _templates(folder, config)
        if not templates:
            raise ValueError(f"the tokenizer in {folder} has no chat template")
        eos = [tokenizer.token_to_id(special["eos_token"])] if "eos_token" in special else []
        value = _json(folder / "generation_config.json").get("eos_token_id")
        eos += value if isinstance(value, list) else [value]
        return cls(tokenizer, templates, special, frozenset(i for i in eos if isinstance(i, int)))

    def template(self, tools: list[dict] | None) -> str:
        return pick(self.templates, tools)


def pick(templates: dict[str, str], tools: list[dict] | None) -> str:
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise ValueError(f"the model has several chat templates and no default: {sorted(templates)}")


def read_templates(folder: Path) -> dict[str, str]:
    """A model folder's chat templates alone (no tokenizer), as `ModelFiles.load` finds them."""
    return _templates(folder, _json(folder / "tokenizer_config.json"))


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a JSON object")
    return value


def _tokens(config: dict) -> dict[str, str]:
    out = {}
    for name in SPECIAL:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def _templates(folder: Path, config: dict) -> dict[str, str]:
    if (folder / "chat_template.jinja").is_file():
        templates = {"default": (folder / "chat_template.jinja").read_text()}
    else:
        value = _json(folder / "chat_template.json").get("chat_template", config.get("chat_template"))
        if isinstance(value, list):
            templates = {t["name"]: t["template"] for t in value if isinstance(t, dict)}
        else:
            templates = {"default": value} if isinstance(value, str) and value else {}
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        templates.update({p.stem: p.read_text() for p in sorted(extra.glob("*.jinja"))})
    return templates


def aliased(chat: list[dict]) -> list[dict]:
    out = []
    for m in chat:
        reasoning = next((m[k] for k in REASONING if m.get(k) is not None), None)
        out.append(m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning})
    return out


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body (transformers tracks it for masks)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _check(name) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a chat template cannot store the attribute {name!r}")


class _Dict:
    def __call__(self, *args, **kwargs) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs) -> None:  # Namespace's own signature trick: `namespace(self=...)`
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value) -> None:
        _check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise, strftime_now=lambda f: datetime.now().strftime(f),
                       dict=_Dict(), namespace=_Namespace)
    return env


@functools.lru_cache(maxsize=16)
def compiled(template: str) -> jinja2.Template:
    return _environment().from_string(template)


@functools.lru_cache(maxsize=16)
def variables(template: str) -> frozenset[str]:
    """The names `template` reads without setting them (a template that does not parse reads none)."""
    env = _environment()
    try:
        return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))
    except jinja2.TemplateSyntaxError:
        return frozenset()
