"""Reading and checking the JSON-lines plan written by ``phasekv-plan``.

Each plan line holds an item: ``id``, ``residue``, ``modulus``, ``target`` (first position of
the target record), ``query_position``, ``record_length``, ``padding``, ``seed`` and
``segments`` (``kind`` in filler/records/target/query, ``start``, ``length``, and for records
and target ``first_record`` and ``records``). An optional ``judge`` ("greedy" or "logprob")
overrides the runner's ``--judge`` for that item.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import List, Optional

KINDS = ("filler", "records", "target", "query")
JUDGES = ("greedy", "logprob")


class PlanError(ValueError):
    """A plan line that the runner cannot use; the message names the line and the item."""


@dataclass(frozen=True)
class Segment:
    kind: str
    start: int
    length: int
    first_record: int = -1
    records: int = 0


@dataclass(frozen=True)
class PlanItem:
    id: int
    residue: int
    modulus: int
    target: int
    query_position: int
    record_length: int
    seed: int
    segments: List[Segment] = field(default_factory=list)
    judge: Optional[str] = None
    line: int = 0  # 1-based line number in the plan file

    def segment_at(self, position: int) -> Segment:
        for s in self.segments:
            if s.start <= position < s.start + s.length:
                return s
        raise IndexError(position)


def _int(obj: dict, key: str, where: str, minimum: int = 0) -> int:
    if key not in obj:
        raise PlanError(f"{where}: missing \"{key}\"")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise PlanError(f"{where}: \"{key}\" must be an integer, got {json.dumps(v)}")
    if v < minimum:
        raise PlanError(f"{where}: \"{key}\" = {v} must be >= {minimum}")
    return v


def parse_item(text: str, line: int, source: str = "plan") -> PlanItem:
    """Parses and checks one plan line; raises PlanError naming the line (and the item)."""
    where = f"{source}:{line}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise PlanError(f"{where}: expected a JSON object")
    item_id = _int(obj, "id", where)
    where = f"{where} (item {item_id})"
    modulus = _int(obj, "modulus", where, 1)
    residue = _int(obj, "residue", where)
    if residue >= modulus:
        raise PlanError(f"{where}: \"residue\" = {residue} is outside [0, modulus = {modulus})")
    target = _int(obj, "target", where)
    query = _int(obj, "query_position", where, 1)
    rl = _int(obj, "record_length", where, 1)
    if rl < 2:
        raise PlanError(
            f"{where}: \"record_length\" = {rl}: the runner needs records of at least 2 tokens "
            "(a key, then the value the model must recall); make the plan with "
            "phasekv-plan --record-length 2 or more")
    seed = _int(obj, "seed", where)
    judge = obj.get("judge")
    if judge is not None and judge not in JUDGES:
        raise PlanError(f"{where}: \"judge\" = {json.dumps(judge)} must be one of {list(JUDGES)}")
    raw = obj.get("segments")
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"{where}: \"segments\" must be a non-empty array")
    segs = []
    pos = 0
    for k, s in enumerate(raw):
        sw = f"{where}: segment {k}"
        if not isinstance(s, dict):
            raise PlanError(f"{sw} must be an object")
        kind = s.get("kind")
        if kind not in KINDS:
            raise PlanError(f"{sw}: \"kind\" = {json.dumps(kind)} must be one of {list(KINDS)}")
        start = _int(s, "start", sw)
        length = _int(s, "length", sw, 1)
        if start != pos:
            raise PlanError(f"{sw} ({kind}) starts at {start}, but the segments before it end "
                            f"at {pos}: segments must tile [0, query_position]")
        first, recs = -1, 0
        if kind in ("records", "target"):
            first = _int(s, "first_record", sw)
            recs = _int(s, "records", sw, 1)
            if length != recs * rl:
                raise PlanError(f"{sw} ({kind}): length {length} != records {recs} x "
                                f"record_length {rl}")
        if kind == "target":
            if recs != 1 or start != target:
                raise PlanError(f"{sw}: the target segment must hold 1 record starting at "
                                f"\"target\" = {target}, got {recs} record(s) at {start}")
        segs.append(Segment(kind, start, length, first, recs))
        pos = start + length
    if [s.kind for s in segs].count("target") != 1:
        raise PlanError(f"{where}: needs exactly one target segment")
    last = segs[-1]
    if last.kind != "query" or last.length != 1 or last.start != query:
        raise PlanError(f"{where}: the last segment must be the 1-token query at "
                        f"\"query_position\" = {query}")
    return PlanItem(item_id, residue, modulus, target, query, rl, seed, segs, judge, line)


def read_plan(path: str) -> List[PlanItem]:
    """Reads a whole plan; raises PlanError on the first bad line, on a repeated id, on mixed
    moduli, or on residues that disagree with one common origin."""
    items: List[PlanItem] = []
    seen = {}
    try:
        with open(path, "r", encoding="utf-8") as f:
            for n, text in enumerate(f, 1):
                if not text.strip():
                    continue
                it = parse_item(text, n, path)
                if it.id in seen:
                    raise PlanError(f"{path}:{n}: item id {it.id} repeats line {seen[it.id]}")
                seen[it.id] = n
                if items:
                    first = items[0]
                    if it.modulus != first.modulus:
                        raise PlanError(f"{path}:{n} (item {it.id}): modulus {it.modulus} differs "
                                        f"from {first.modulus} on line {first.line}")
                    if (it.target - it.residue) % it.modulus != origin_mod(first):
                        raise PlanError(
                            f"{path}:{n} (item {it.id}): residue {it.residue} of target "
                            f"{it.target} disagrees with line {first.line}'s origin mod "
                            f"{it.modulus} = {origin_mod(first)}")
                items.append(it)
    except OSError as e:
        raise PlanError(f"cannot read --plan '{path}': {e.strerror}") from None
    if not items:
        raise PlanError(f"--plan '{path}' holds no items")
    return items


def origin_mod(item: PlanItem) -> int:
    """The plan's origin modulo its modulus: residue = (target - origin) mod M."""
    return (item.target - item.residue) % item.modulus
