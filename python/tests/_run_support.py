"""Helpers of the phasekv.run tests: import path, small plans, a loopback fake server."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(PYTHON_DIR)

# Use the installed phasekv when there is one; else the source tree (phasekv.run is pure Python).
if importlib.util.find_spec("phasekv") is None:
    sys.path.insert(0, PYTHON_DIR)
    _EXTRA_PATH = PYTHON_DIR
else:
    _EXTRA_PATH = None


def subprocess_env() -> dict:
    env = dict(os.environ)
    if _EXTRA_PATH:
        env["PYTHONPATH"] = _EXTRA_PATH + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        env.pop(k, None)
    return env


def layout(target, query, rl, padding="prefix"):
    """Segments as phasekv-plan writes them (phasekv::eval::layout_prompt)."""
    pad, before = target % rl, target // rl
    total = (query - pad) // rl
    segs, pos = [], 0

    def push(kind, length, first=-1, recs=0):
        nonlocal pos
        if length <= 0:
            return
        s = {"kind": kind, "start": pos, "length": length}
        if recs > 0:
            s["first_record"], s["records"] = first, recs
        segs.append(s)
        pos += length
    if padding == "prefix":
        push("filler", pad)
    push("records", before * rl, 0, before)
    if padding != "prefix":
        push("filler", pad)
    push("target", rl, before, 1)
    push("records", (total - before - 1) * rl, before + 1, total - before - 1)
    push("filler", query - pos)
    push("query", 1)
    return segs


def write_plan(path, targets, query, rl, modulus, origin=0, padding="prefix", seed=7,
               judge=None):
    """A plan with the given targets (ids in order); residue = (target - origin) mod modulus."""
    with open(path, "w") as f:
        for i, t in enumerate(targets):
            line = {"id": i, "residue": (t - origin) % modulus, "modulus": modulus, "target": t,
                    "query_position": query, "record_length": rl, "padding": padding,
                    "seed": seed * 1000003 + i, "segments": layout(t, query, rl, padding)}
            if judge:
                line["judge"] = judge
            f.write(json.dumps(line) + "\n")


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


# --- a fake server -------------------------------------------------------------------------
# A word-level tokenizer (each whitespace-separated word is one token; BOS = 1 first) and a
# "model" that answers the induction task right exactly when the key's first occurrence sits
# at a position p with p % 4 != 3, and wrong otherwise: the runner's "correct" must follow
# this rule item by item, faults or not.

FAKE_WORDS = [f"w{i}" for i in range(40)]


class FakeState:
    def __init__(self, flavour="openai"):
        self.flavour = flavour
        self.vocab = {w: i + 10 for i, w in enumerate(FAKE_WORDS)}
        self.inv = {i: w for w, i in self.vocab.items()}
        self.requests = 0
        self.completions = 0
        self.fault_every = 0  # every k-th request fails (k > 0)
        self.faults = ["500", "garbage", "truncated", "no-choices"]
        self.faults_sent = 0
        self.shift_at = None  # tokenizer puts an extra token at this position in long texts
        self.logprobs = True
        self.fail_paths = set()  # paths that always answer 500
        self.delay = 0.0  # seconds before each completion answer
        # The target at this position gets its right text after one more, textless token.
        self.hidden_byte_at = None
        self.lock = threading.Lock()

    def tokenize(self, text):
        ids = [1] + [self.vocab.get(w, 2) for w in text.split()]
        if self.shift_at is not None and len(ids) > self.shift_at + 1:
            ids.insert(self.shift_at, 3)
        return ids

    def answer(self, ids, n):
        key = ids[-1]
        first = ids.index(key)
        vals = ids[first + 1:first + 1 + n]
        if first % 4 == 3:
            vals = [self.vocab["w0"] if v != self.vocab["w0"] else self.vocab["w1"]
                    for v in vals]
        return vals


def make_handler(state: FakeState):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a):
            pass

        def _send(self, code, payload: bytes):
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self):
            if self.path == "/props" and state.flavour == "llama-server":
                return self._send(200, b'{"default_generation_settings": {}}')
            self._send(404, b'{"error": "not found"}')

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.requests += 1
                fault = (state.fault_every and state.requests % state.fault_every == 0)
                kind = state.faults[state.faults_sent % len(state.faults)] if fault else None
                if fault:
                    state.faults_sent += 1
            if kind == "500" or self.path in state.fail_paths:
                return self._send(500, b'{"error": "boom"}')
            if kind == "garbage":
                return self._send(200, b"<html>not json")
            if kind == "truncated":
                return self._send(200, b'{"choices": [{"text": "')
            tok_path = "/tokenize"
            if self.path == tok_path:
                text = body.get("prompt") if state.flavour == "openai" else body.get("content")
                if text is None:
                    return self._send(400, b'{"error": "bad tokenize body"}')
                if kind == "no-choices":
                    return self._send(200, b'{"count": 3}')
                return self._send(200, json.dumps({"tokens": state.tokenize(text)}).encode())
            if state.flavour == "openai" and self.path == "/v1/completions":
                if state.delay:
                    import time
                    time.sleep(state.delay)
                ids, n = body["prompt"], body["max_tokens"]
                if kind == "no-choices":
                    return self._send(200, b'{"choices": []}')
                with state.lock:
                    state.completions += 1
                vals = state.answer(ids, n)
                choice = {"text": "".join(" " + state.inv[v] for v in vals)}
                extra_token = state.hidden_byte_at is not None and ids.index(ids[-1]) == \
                    state.hidden_byte_at
                if body.get("logprobs") and state.logprobs:
                    best = " " + state.inv[vals[0]]
                    choice["logprobs"] = {"top_logprobs": [{best: -0.1, " w39": -3.0}]}
                usage = {"completion_tokens": n + (1 if extra_token else 0)}
                return self._send(200, json.dumps({"choices": [choice],
                                                   "usage": usage}).encode())
            if state.flavour == "llama-server" and self.path == "/completion":
                ids, n = body["prompt"], body["n_predict"]
                if kind == "no-choices":
                    return self._send(200, b'{"stop": true}')
                with state.lock:
                    state.completions += 1
                vals = state.answer(ids, n)
                out = {"content": "".join(" " + state.inv[v] for v in vals)}
                if body.get("n_probs"):
                    out["completion_probabilities"] = [{"id": vals[0], "token": " " + state.inv[vals[0]],
                        "logprob": -0.2, "top_logprobs": [
                            {"id": 49, "token": " w39", "logprob": -2.5},
                            {"id": vals[0], "token": " " + state.inv[vals[0]], "logprob": -0.2}]}]
                return self._send(200, json.dumps(out).encode())
            self._send(404, b'{"error": "not found"}')
    return H


class FakeServer:
    def __init__(self, flavour="openai"):
        self.state = FakeState(flavour)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(self.state))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
