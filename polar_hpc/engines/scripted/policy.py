"""The scripted engine's deterministic policy: regex rules -> reply text, and fake logprobs.

A rules file is a YAML list of `{when: REGEX, reply: TEMPLATE}`, each rule optionally with
`pause_after: TEXT` and `pause_ms: N` (both or neither). `Policy.reply(prompt_text)` searches each
`when` (re.DOTALL) in the decoded prompt (special tokens included); the first match wins and
`match.expand(reply)` is the reply's text (`\\g<name>` inserts a group; backslashes are escapes,
as in `re.sub`). No match: the empty reply. A `Reply` also says where decoding pauses: after the
token that completes the first `pause_after` in the text (`pause_at`: that end's offset), for
`pause_s` seconds. A malformed file raises ConfigError naming the file, the rule index and the
field. `logprobs` is a pure function of (prompt ids, position, token), each value in
[-5, -0.01].
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import yaml

from polar_hpc.config import ConfigError

DEFAULT_RULES = Path(__file__).parent / "assets" / "rules.yaml"
_GROUP_REF = re.compile(r"\\g<([^>]*)>|\\(\d+)")


@dataclass(frozen=True)
class Rule:
    when: re.Pattern[str]
    reply: str
    pause_after: str | None = None
    pause_ms: int = 0


@dataclass(frozen=True)
class Reply:
    text: str
    pause_at: int | None = None  # pause once this much of the text has been decoded
    pause_s: float = 0.0


class Policy:
    """First-match-wins rules over the prompt text."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules

    @classmethod
    def load(cls, path: Path | None = None) -> Policy:
        """Read and validate a rules file (None: the built-in calculator rules)."""
        path = Path(path) if path is not None else DEFAULT_RULES
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ConfigError(f"{path}: cannot read rules file: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML: {e}") from None
        if not isinstance(data, list) or not data:
            raise ConfigError(f"{path}: expected a non-empty YAML list of {{when, reply}} rules")
        return cls([_rule(path, i, item) for i, item in enumerate(data)])

    def reply(self, prompt_text: str) -> Reply:
        for rule in self.rules:
            match = rule.when.search(prompt_text)
            if match:
                text = match.expand(rule.reply)
                if not rule.pause_after or (at := text.find(rule.pause_after)) < 0:
                    return Reply(text)
                return Reply(text, at + len(rule.pause_after), rule.pause_ms / 1000)
        return Reply("")


def _rule(path: Path, index: int, item: object) -> Rule:
    where = f"{path}: rule {index}"
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected a mapping with 'when' and 'reply'")
    unknown = sorted(set(item) - {"when", "reply", "pause_after", "pause_ms"})
    if unknown:
        raise ConfigError(
            f"{where}: unknown field {unknown[0]!r} (fields: when, reply, pause_after, pause_ms)"
        )
    if ("pause_after" in item) != ("pause_ms" in item):
        raise ConfigError(f"{where}: fields 'pause_after' and 'pause_ms' go together")
    if "pause_after" in item and not (isinstance(item["pause_after"], str) and item["pause_after"]):
        raise ConfigError(f"{where}: field 'pause_after' must be a non-empty string")
    pause_ms = item.get("pause_ms", 0)
    if type(pause_ms) is not int or pause_ms < 0:
        raise ConfigError(f"{where}: field 'pause_ms' must be an integer >= 0")
    for field in ("when", "reply"):
        if not isinstance(item.get(field), str):
            raise ConfigError(f"{where}: field {field!r} must be a string")
    try:
        when = re.compile(item["when"], re.DOTALL)
    except re.error as e:
        raise ConfigError(f"{where}: field 'when': invalid regex: {e}") from None
    for ref in _GROUP_REF.finditer(item["reply"]):
        name, number = ref.groups()
        known = int(number) <= when.groups if number else (
            name in when.groupindex or (name.isdigit() and int(name) <= when.groups)
        )
        if not known:
            raise ConfigError(f"{where}: field 'reply': {ref.group(0)} names no group of 'when'")
    return Rule(when, item["reply"], item.get("pause_after"), pause_ms)


def _float32(x: float) -> float:
    """Round to the nearest float32, as a GPU engine's logprobs are."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def logprobs(prompt_ids: list[int], output_ids: list[int]) -> list[float]:
    """Deterministic pseudo logprobs of output_ids sampled after prompt_ids."""
    key = hashlib.blake2b(repr(prompt_ids).encode(), digest_size=16).digest()
    values = []
    for position, token in enumerate(output_ids):
        digest = hashlib.blake2b(f"{position}:{token}".encode(), key=key, digest_size=8).digest()
        unit = int.from_bytes(digest, "big") / 2**64
        values.append(_float32(-0.01 - 4.99 * unit))
    return values
