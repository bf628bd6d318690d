"""The run: plan in, one results line per item out, across several servers."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import List, Optional

from tqdm import tqdm

from . import flavours as fl
from .client import Pool, RequestFailed
from .plan import PlanItem, origin_mod, read_plan
from .prompt import PlacementError, PoolError, build, discover_pool, landing_error
from .results import AppendFile, done_ids

EXIT_OK, EXIT_ITEMS_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class Refused(RuntimeError):
    """The run cannot go on (a segment would not land, no log-probabilities, ...)."""


@dataclass
class Options:
    plan: str
    endpoints: List[str]
    model: str
    output: str
    errors: str
    flavour: str = "auto"
    judge: str = "greedy"
    logprobs: int = 5
    concurrency: int = 8
    timeout: float = 120.0
    retries: int = 4
    backoff: float = 0.5
    max_backoff: float = 30.0
    max_failures: int = 20
    words: Optional[List[str]] = None
    fsync: bool = True
    progress: bool = True


def log(msg: str) -> None:
    print(f"phasekv.run: {msg}", file=sys.stderr, flush=True)


def _props(body):
    if not isinstance(body, dict) or "default_generation_settings" not in body:
        raise fl.MalformedResponse("not llama-server's /props")
    return True


async def detect_flavour(pool: Pool, model: str, ep) -> fl.Flavour:
    """Asks the endpoint which API it speaks: llama-cpp-python answers /extras/tokenize,
    llama-server GET /props, vLLM and SGLang /tokenize."""
    probes = [fl.LlamaCppPythonFlavour(model), fl.LlamaServerFlavour(model),
              fl.OpenAIFlavour(model)]
    tried = []
    for f in probes:
        if isinstance(f, fl.LlamaServerFlavour):
            method, path, body, parse = "GET", "/props", None, _props
        else:
            method, (path, body), parse = "POST", f.tokenize("a"), f.parse_tokens
        try:
            await pool.call(method, path, body, parse, endpoint=ep,
                            what=f"detecting the flavour ({path})")
            return f
        except RequestFailed as e:
            if e.retryable:
                raise Refused(f"cannot reach --endpoint {ep.url}: {e}") from None
            tried.append(path)
    raise Refused(f"--endpoint {ep.url} answers none of {tried}: give --flavour "
                  "(openai for vLLM/SGLang, llama-server, llama-cpp-python)")


class Run:
    def __init__(self, opt: Options):
        self.opt = opt
        self.fatal: Optional[str] = None
        self.failed = 0
        self.written = 0
        self.interrupted = False

    async def tokenize(self, text: str, endpoint=None, prefer=None) -> List[int]:
        path, body = self.flavour.tokenize(text)
        ids, _, _ = await self.pool.call("POST", path, body, self.flavour.parse_tokens,
                                         endpoint=endpoint, what="tokenize", prefer=prefer)
        return ids

    async def prepare(self, todo: List[PlanItem]) -> None:
        opt = self.opt
        if opt.flavour == "auto":
            last = None
            for ep in list(self.pool.endpoints):
                try:
                    self.flavour = await detect_flavour(self.pool, opt.model, ep)
                    break
                except Refused as e:
                    last = e
            else:
                raise last
        else:
            self.flavour = fl.make(opt.flavour, opt.model)
        from .words import WORDS
        # Every server must share the tokenizer: the same ids for a text of all pool words.
        # An endpoint that cannot be reached now is left out of the run.
        reachable = []
        for ep in self.pool.endpoints:
            try:
                await self.tokenize("", endpoint=ep)
                reachable.append(ep)
            except RequestFailed as e:
                log(f"warning: leaving out --endpoint {ep.url}: {e}")
        if not reachable:
            raise Refused("no --endpoint can be reached")
        self.pool.endpoints = reachable
        first = reachable[0]
        self.words = await discover_pool(lambda t: self.tokenize(t, endpoint=first),
                                         opt.words or WORDS)
        log(f"flavour {self.flavour.name}; {len(self.words.keys) + len(self.words.values)} "
            f"one-token words ({self.words.rejected} candidates rejected); "
            f"{len(self.words.leading)} leading special token(s); "
            f"{len(reachable)} endpoint(s)")
        allw = self.words.keys + self.words.values
        text = self.words.text([w for w, _ in allw])
        want = self.words.leading + [i for _, i in allw]
        for ep in reachable:
            got = await self.tokenize(text, endpoint=ep)
            if got != want and ep is first:
                raise Refused(f"--endpoint {ep.url} does not tokenize a text of all "
                              f"{len(allw)} pool words into their ids; its tokenizer joins "
                              "words: give --words with other words")
            if got != want:
                raise Refused(f"--endpoint {ep.url} tokenizes the word pool differently from "
                              f"{first.url}: all endpoints must serve the same model")
        for it in todo:
            judge = it.judge or opt.judge
            if judge == "logprob" and it.record_length != 2:
                raise Refused(f"item {it.id}: --judge logprob needs one-token answers "
                              f"(record_length 2), the plan has {it.record_length}; use "
                              "--judge greedy")

    async def one(self, item: PlanItem) -> None:
        opt = self.opt
        judge = item.judge or opt.judge
        try:
            prompt = build(item, self.words)
        except PlacementError as e:
            raise Refused(str(e)) from None
        attempts = 0
        home = self.pool.pick()  # the item's endpoint while it answers
        try:
            server_ids = await self.tokenize(prompt.text, prefer=home)
            msg = landing_error(prompt, server_ids)
            if msg:
                raise Refused(msg)
            n_answer = len(prompt.answer_words) if judge == "greedy" else 1
            lp = opt.logprobs if judge == "logprob" else 0
            path, body = self.flavour.complete(prompt.ids, prompt.text, n_answer, lp)

            def parse(b):
                c = self.flavour.parse_completion(b)
                if judge == "logprob" and not c.top:
                    raise fl.MalformedResponse("no log-probabilities in the answer")
                return c

            comp, ep, attempts = await self.pool.call("POST", path, body, parse,
                                                      what=f"item {item.id}", prefer=home)
        except RequestFailed as e:
            self.failed += 1
            self.errors.append({"id": item.id, "position": item.target, "error": str(e),
                                "attempts": e.attempts, "time": round(time.time(), 3)})
            if self.failed >= opt.max_failures:
                raise Refused(f"{self.failed} items failed (--max-failures); last: {e}")
            return
        line = {"id": item.id, "position": item.target, "plan_residue": item.residue,
                "modulus": item.modulus, "correct": None, "judge": judge,
                "expected": prompt.answer_text, "output": comp.text}
        line["output_tokens"] = comp.n_tokens
        if judge == "greedy":
            # The text must match, from exactly the tokens asked for: a server may hide
            # tokens that decode to no text (a stray byte) and generate more.
            line["correct"] = comp.text == prompt.answer_text and \
                comp.n_tokens in (None, n_answer)
        else:
            piece = prompt.answer_text
            line["correct"] = comp.top[0][0] == piece
            line["top_token"] = comp.top[0][0]
            line["answer_logprob"] = dict(comp.top).get(piece)
        line["endpoint"] = ep.url
        line["attempts"] = attempts
        self.results.append(line)
        self.written += 1

    async def worker(self, queue: "asyncio.Queue[PlanItem]", bar) -> None:
        while self.fatal is None and not self.interrupted:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                await self.one(item)
            except Refused as e:
                self.fatal = str(e)
                return
            bar.update(1)
            if self.failed:
                bar.set_postfix(failed=self.failed, refresh=False)

    async def work(self, queue, bar) -> None:
        """Runs the workers; SIGINT or SIGTERM cancels them (an item is written whole or not
        at all: cancellation happens only while a request is awaited), a second one exits at
        once."""
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(self.worker(queue, bar))
                 for _ in range(max(1, self.opt.concurrency))]

        def on_signal():
            if self.interrupted:
                os._exit(EXIT_INTERRUPTED)
            self.interrupted = True
            for t in tasks:
                t.cancel()
        sigs = (signal.SIGINT, signal.SIGTERM)
        for sig in sigs:
            loop.add_signal_handler(sig, on_signal)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for sig in sigs:
                loop.remove_signal_handler(sig)
        for t in tasks:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()

    async def main(self) -> int:
        opt = self.opt
        plan = read_plan(opt.plan)
        by_id = {it.id: it for it in plan}
        self.results = AppendFile(opt.output, opt.fsync)
        self.errors = AppendFile(opt.errors, opt.fsync)
        try:
            if self.results.torn_bytes:
                log(f"dropped a torn last line ({self.results.torn_bytes} bytes) of "
                    f"{opt.output} left by a killed run")
            done = done_ids(self.results, by_id)
            todo = [it for it in plan if it.id not in done]
            log(f"{len(plan)} items in {opt.plan}; {len(done)} already in {opt.output}; "
                f"{len(todo)} to run on {len(opt.endpoints)} endpoint(s)")
            if todo:
                self.pool = Pool(opt.endpoints, opt.timeout, opt.retries, opt.backoff,
                                 opt.max_backoff, opt.concurrency)
                try:
                    await self.prepare(todo)
                    queue: asyncio.Queue = asyncio.Queue()
                    for it in todo:
                        queue.put_nowait(it)
                    with tqdm(total=len(plan), initial=len(done), unit="item",
                              desc="phasekv.run", disable=not opt.progress, file=sys.stderr,
                              dynamic_ncols=True) as bar:
                        await self.work(queue, bar)
                finally:
                    await self.pool.aclose()
        except (Refused, PoolError) as e:
            log(f"refused: {e}")
            return EXIT_REFUSED
        finally:
            self.results.close()
            self.errors.close()
        if self.interrupted:
            log(f"interrupted after {self.written} new results; every result written is whole: "
                "run the same command again to continue")
            return EXIT_INTERRUPTED
        if self.fatal:
            log(f"stopped: {self.fatal}")
            log(f"{self.written} results written; fix the cause and run the same command again "
                "to continue")
            return EXIT_REFUSED
        missing = len(plan) - len(done) - self.written
        first = plan[0]
        if missing:
            log(f"{missing} item(s) have no result ({self.failed} failed, see {opt.errors}); "
                "run the same command again to retry them")
            return EXIT_ITEMS_FAILED
        log(f"all {len(plan)} items have a result in {opt.output}; report with:\n"
            f"  phasekv-report --modulus {first.modulus} --origin {origin_mod(first)} "
            f"--input {opt.output}")
        return EXIT_OK
