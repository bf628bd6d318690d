"""Prompts as token ids of the server's own tokenizer, placed at the plan's positions.

The content is an induction task: a record is a key token followed by ``record_length - 1``
value tokens; the query (the last token) repeats the target record's key, and the model must
continue with the target's values. Keys, values and fillers are words that the server's
tokenizer holds as one token each (``discover_pool``); the target key appears nowhere else
in the prompt. Position 0 (and on, when the tokenizer adds more than one) holds the special
tokens the tokenizer puts before any text (BOS), in place of the plan's first tokens.

Every prompt is written as text too, and ``landing_error`` checks, through the server's
``/tokenize``, that this text gives exactly the planned ids: every segment then lands at the
plan's position whether the server is sent ids or text.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import List, Optional, Sequence

from .plan import PlanItem

MIN_WORDS = 8
ANCHOR = "a"


class PoolError(RuntimeError):
    """The server's tokenizer offers too few one-token words, or does not join them."""


@dataclass
class Pool:
    """Words that are one token each, and how the tokenizer writes a prompt of them."""
    leading: List[int]  # special ids the tokenizer puts before any text (BOS)
    keys: List[tuple]  # (word, id)
    values: List[tuple]
    space_first: bool  # the first word of a text needs its leading space too
    rejected: int = 0  # candidate words that were not one token

    def text(self, words: Sequence[str]) -> str:
        t = " ".join(words)
        return (" " + t) if self.space_first else t


async def discover_pool(tokenize, candidates: Sequence[str]) -> Pool:
    """Keeps the candidates that the tokenizer maps to one token after another word.

    `tokenize(text)` is an async call returning the server's ids for `text` (special tokens
    included). Checks that a text of pool words joins into exactly their ids."""
    leading = await tokenize("")
    base = await tokenize(ANCHOR)
    if base[:len(leading)] != leading:
        raise PoolError(f"the tokenizer's ids for '' ({leading}) do not start its ids for "
                        f"'{ANCHOR}' ({base})")
    seen = {}
    words = [w for w in dict.fromkeys(candidates) if w and not any(c.isspace() for c in w)]
    results = await asyncio.gather(*(tokenize(f"{ANCHOR} {w}") for w in words))
    rejected = 0
    for w, ids in zip(words, results):
        if len(ids) == len(base) + 1 and ids[:len(base)] == base and ids[-1] not in leading \
                and ids[-1] not in seen.values() and ids[-1] not in base:
            seen[w] = ids[-1]
        else:
            rejected += 1
    pairs = sorted(seen.items(), key=lambda kv: kv[1])
    if len(pairs) < MIN_WORDS:
        raise PoolError(f"only {len(pairs)} of {len(words)} candidate words are one token for "
                        f"this tokenizer (need {MIN_WORDS}); give --words FILE with words it "
                        "holds whole")
    keys, values = pairs[0::2], pairs[1::2]
    probe = [w for w, _ in pairs[:4]]
    want = leading + [i for _, i in pairs[:4]]
    for space_first in (False, True):
        p = Pool(leading, keys, values, space_first, rejected)
        if await tokenize(p.text(probe)) == want:
            return p
    raise PoolError(f"the tokenizer does not join one-token words into their ids: "
                    f"'{' '.join(probe)}' -> {await tokenize(' '.join(probe))}, expected {want}")


@dataclass
class Prompt:
    item: PlanItem
    ids: List[int]
    words: List[Optional[str]]  # word at each position (None for the leading specials)
    text: str  # what the server tokenizes into `ids`
    answer_words: List[str]

    @property
    def answer_text(self) -> str:
        return "".join(" " + w for w in self.answer_words)


class PlacementError(RuntimeError):
    """A segment would not land where the plan says; the message names the item."""


def build(item: PlanItem, pool: Pool) -> Prompt:
    """The token ids of one item, from its seed; positions are the plan's by construction."""
    rng = random.Random(item.seed)
    n = item.query_position + 1
    lead = len(pool.leading)
    if lead > item.target:
        raise PlacementError(
            f"item {item.id}: the tokenizer's {lead} leading special token(s) would cover the "
            f"target record at {item.target}")
    target_key = rng.choice(pool.keys)
    other_keys = [k for k in pool.keys if k != target_key]
    ids: List[int] = [0] * n
    words: List[Optional[str]] = [None] * n
    answer: List[str] = []

    def put(pos, wid):
        words[pos], ids[pos] = wid

    for s in item.segments:
        if s.kind == "filler":
            for p in range(s.start, s.start + s.length):
                put(p, rng.choice(pool.values))
        elif s.kind in ("records", "target"):
            for r in range(s.records):
                p0 = s.start + r * item.record_length
                key = target_key if s.kind == "target" else rng.choice(other_keys)
                put(p0, key)
                for p in range(p0 + 1, p0 + item.record_length):
                    v = rng.choice(pool.values)
                    put(p, v)
                    if s.kind == "target":
                        answer.append(v[0])
        else:  # query
            put(s.start, target_key)
    for p in range(lead):
        ids[p], words[p] = pool.leading[p], None
    # Placement checks, independent of the construction above.
    if ids[item.target] != target_key[1] or ids[item.query_position] != target_key[1]:
        raise PlacementError(f"item {item.id}: the target key is not at positions "
                             f"{item.target} and {item.query_position}")
    if ids.count(target_key[1]) != 2:
        raise PlacementError(f"item {item.id}: the target key appears "
                             f"{ids.count(target_key[1])} times, expected 2")
    text = pool.text([w for w in words[lead:]])
    return Prompt(item, ids, words, text, answer)


def landing_error(prompt: Prompt, server_ids: List[int]) -> Optional[str]:
    """None when the server's ids for the prompt's text are the planned ids, else a message
    naming the item, the first position that differs and its segment."""
    ids = prompt.ids
    if server_ids == ids:
        return None
    k = next((i for i, (a, b) in enumerate(zip(ids, server_ids)) if a != b),
             min(len(ids), len(server_ids)))
    item = prompt.item
    seg = item.segment_at(min(k, item.query_position))
    return (f"item {item.id}: the server tokenizes the prompt into {len(server_ids)} tokens, "
            f"the plan needs {len(ids)}; position {k} (in the {seg.kind} segment "
            f"[{seg.start}, {seg.start + seg.length})) would hold id "
            f"{server_ids[k] if k < len(server_ids) else 'none'} instead of "
            f"{ids[k] if k < len(ids) else 'none'}: the segments from there on would not land "
            "where the plan says")
