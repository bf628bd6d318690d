"""Per-server adapters: how to ask one kind of server to tokenize and to complete.

Each flavour turns a request into (path, JSON body) and reads the answer, raising
MalformedResponse when a field it needs is missing or has the wrong type (the client then
retries: a malformed answer never becomes a result).

- ``openai``: vLLM and SGLang. ``POST /tokenize`` {model, prompt, add_special_tokens} ->
  {tokens}; ``POST /v1/completions`` with the prompt as token ids.
- ``llama-server``: llama.cpp's server. ``POST /tokenize`` {content, add_special} -> {tokens};
  ``POST /completion`` with the prompt as token ids, ``n_probs`` for log-probabilities.
- ``llama-cpp-python``: ``python -m llama_cpp.server``. ``POST /extras/tokenize`` {input} ->
  {tokens} (adds the model's BOS as its completions do); ``POST /v1/completions`` takes text
  only, so the runner sends the text whose tokenization it has checked against the plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple


class MalformedResponse(ValueError):
    """The server answered 2xx with a body the flavour cannot read."""


@dataclass
class Completion:
    text: str
    # Candidates for the first generated token: (token text, logprob), best first; None when
    # the server gave no log-probabilities.
    top: Optional[List[Tuple[str, float]]] = None
    # Tokens generated, as the server reports them (None when it does not).
    n_tokens: Optional[int] = None


def _count(v: Any, what: str) -> Optional[int]:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise MalformedResponse(f"{what}: token count {v!r} is not a count")
    return v


def _obj(body: Any, what: str) -> dict:
    if not isinstance(body, dict):
        raise MalformedResponse(f"{what}: expected a JSON object, got {type(body).__name__}")
    return body


def _token_list(body: Any, what: str) -> List[int]:
    toks = _obj(body, what).get("tokens")
    if not isinstance(toks, list):
        raise MalformedResponse(f"{what}: no \"tokens\" array")
    out = []
    for t in toks:
        if isinstance(t, dict):  # llama-server with_pieces
            t = t.get("id")
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise MalformedResponse(f"{what}: token {t!r} is not a token id")
        out.append(t)
    return out


def _float(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise MalformedResponse(f"{what}: {v!r} is not a number")
    return float(v)


def _openai_completion(body: Any) -> Completion:
    what = "completion"
    choices = _obj(body, what).get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponse(f"{what}: no \"choices\"")
    c = choices[0]
    text = c.get("text")
    if not isinstance(text, str):
        raise MalformedResponse(f"{what}: choices[0].text is not a string")
    top = None
    lp = c.get("logprobs")
    if lp is not None:
        tl = _obj(lp, what).get("top_logprobs")
        if not isinstance(tl, list) or not tl or not isinstance(tl[0], dict):
            raise MalformedResponse(f"{what}: logprobs without top_logprobs[0]")
        top = sorted(((str(k), _float(v, what)) for k, v in tl[0].items()),
                     key=lambda kv: -kv[1])
    usage = body.get("usage")
    n = _count(usage.get("completion_tokens"), what) if isinstance(usage, dict) else None
    return Completion(text, top, n)


class Flavour:
    name = ""
    sends_token_ids = True

    def __init__(self, model: str):
        self.model = model

    def tokenize(self, text: str) -> Tuple[str, dict]:
        raise NotImplementedError

    def parse_tokens(self, body: Any) -> List[int]:
        return _token_list(body, "tokenize")

    def complete(self, ids: List[int], text: str, max_tokens: int,
                 logprobs: int) -> Tuple[str, dict]:
        raise NotImplementedError

    def parse_completion(self, body: Any) -> Completion:
        return _openai_completion(body)


class OpenAIFlavour(Flavour):
    """vLLM, SGLang: OpenAI completions with token-id prompts, /tokenize."""
    name = "openai"

    def tokenize(self, text):
        return "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": True}

    def complete(self, ids, text, max_tokens, logprobs):
        body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens,
                "temperature": 0.0, "n": 1, "stream": False}
        if logprobs:
            body["logprobs"] = logprobs
        return "/v1/completions", body


class LlamaCppPythonFlavour(Flavour):
    """llama-cpp-python's server: text prompts only, /extras/tokenize."""
    name = "llama-cpp-python"
    sends_token_ids = False

    def tokenize(self, text):
        return "/extras/tokenize", {"model": self.model, "input": text}

    def complete(self, ids, text, max_tokens, logprobs):
        body = {"model": self.model, "prompt": text, "max_tokens": max_tokens,
                "temperature": 0.0, "top_k": 1, "stream": False}
        if logprobs:
            body["logprobs"] = logprobs
        return "/v1/completions", body


class LlamaServerFlavour(Flavour):
    """llama.cpp's llama-server: /completion with token ids, /tokenize."""
    name = "llama-server"

    def tokenize(self, text):
        return "/tokenize", {"content": text, "add_special": True}

    def complete(self, ids, text, max_tokens, logprobs):
        body = {"prompt": ids, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1,
                "cache_prompt": True, "stream": False}
        if logprobs:
            body["n_probs"] = logprobs
            body["top_k"] = max(logprobs, 1)  # n_probs reads the sampler's candidates
        return "/completion", body

    def parse_completion(self, body):
        what = "completion"
        b = _obj(body, what)
        text = b.get("content")
        if not isinstance(text, str):
            raise MalformedResponse(f"{what}: \"content\" is not a string")
        top = None
        probs = b.get("completion_probabilities")
        if probs is not None:
            if not isinstance(probs, list) or not probs or not isinstance(probs[0], dict):
                raise MalformedResponse(f"{what}: empty completion_probabilities")
            p0 = probs[0]
            if "top_logprobs" in p0:  # current format
                cands = [( _obj(c, what).get("token"), _float(c.get("logprob"), what))
                         for c in p0["top_logprobs"]]
            elif "probs" in p0:  # older format: probabilities
                cands = []
                for c in p0["probs"]:
                    pr = _float(_obj(c, what).get("prob"), what)
                    cands.append((c.get("tok_str"), math.log(pr) if pr > 0 else -math.inf))
            else:
                raise MalformedResponse(f"{what}: completion_probabilities[0] has no candidates")
            if any(not isinstance(t, str) for t, _ in cands):
                raise MalformedResponse(f"{what}: a candidate token is not a string")
            top = sorted(cands, key=lambda kv: -kv[1])
        return Completion(text, top, _count(b.get("tokens_predicted"), what))


FLAVOURS: Dict[str, type] = {
    f.name: f for f in (OpenAIFlavour, LlamaServerFlavour, LlamaCppPythonFlavour)
}
ALIASES = {"vllm": "openai", "sglang": "openai", "llama.cpp": "llama-server"}


def make(name: str, model: str) -> Flavour:
    key = ALIASES.get(name, name)
    if key not in FLAVOURS:
        raise ValueError(f"--flavour '{name}' is not one of "
                         f"{sorted(list(FLAVOURS) + list(ALIASES) + ['auto'])}")
    return FLAVOURS[key](model)
