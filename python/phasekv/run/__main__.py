"""python -m phasekv.run: run a phasekv-plan against OpenAI-compatible servers."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from .client import RequestFailed
from .plan import PlanError
from .results import ResultsError
from .runner import EXIT_INTERRUPTED, EXIT_REFUSED, EXIT_USAGE, Options, Run, log


def _positive(kind, minimum):
    def conv(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a {kind.__name__}") from None
        if not v >= minimum:
            raise argparse.ArgumentTypeError(f"{v} must be >= {minimum}")
        return v
    return conv


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m phasekv.run",
        description="Runs every item of a phasekv-plan on a served model and appends one "
                    "result line per item, readable by phasekv-report. Stop it at any time; "
                    "the same command continues where it stopped.")
    p.add_argument("--plan", "-p", required=True, help="plan JSONL written by phasekv-plan")
    p.add_argument("--endpoint", "-e", action="append", required=True, dest="endpoints",
                   help="server base URL, e.g. http://127.0.0.1:8000 (repeat for more servers)")
    p.add_argument("--model", required=True,
                   help="model name as the server knows it (vLLM/SGLang check it)")
    p.add_argument("--output", "-o", required=True,
                   help="results JSONL (appended to; existing results are kept and skipped)")
    p.add_argument("--errors", help="per-item error JSONL (default: OUTPUT.errors.jsonl)")
    p.add_argument("--flavour", default="auto",
                   choices=["auto", "openai", "vllm", "sglang", "llama-server", "llama.cpp",
                            "llama-cpp-python"],
                   help="server API (default: detected from the first endpoint)")
    p.add_argument("--judge", default="greedy", choices=["greedy", "logprob"],
                   help="greedy: the greedy continuation must equal the target's values; "
                        "logprob: the value must be the most likely next token (one-token "
                        "answers); a plan line's \"judge\" overrides this")
    p.add_argument("--logprobs", type=_positive(int, 1), default=5,
                   help="candidates asked for with --judge logprob (default 5)")
    p.add_argument("--concurrency", "-c", type=_positive(int, 1), default=8,
                   help="requests in flight across all endpoints (default 8)")
    p.add_argument("--timeout", type=_positive(float, 0.001), default=120.0,
                   help="seconds per request (default 120)")
    p.add_argument("--retries", type=_positive(int, 0), default=4,
                   help="retries of a failed request, with exponential backoff (default 4)")
    p.add_argument("--backoff", type=_positive(float, 0.0), default=0.5,
                   help="first backoff in seconds, doubled per retry (default 0.5)")
    p.add_argument("--max-backoff", type=_positive(float, 0.0), default=30.0,
                   help="longest backoff in seconds (default 30)")
    p.add_argument("--max-failures", type=_positive(int, 1), default=20,
                   help="stop after this many items failed for good (default 20)")
    p.add_argument("--words", help="file of candidate words (whitespace separated) for keys, "
                                   "values and fillers (default: a built-in list)")
    p.add_argument("--no-fsync", action="store_true",
                   help="do not fsync each result line (faster; a power loss may lose lines)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    words = None
    if args.words:
        try:
            with open(args.words, encoding="utf-8") as f:
                words = f.read().split()
        except OSError as e:
            log(f"cannot read --words '{args.words}': {e.strerror}")
            return EXIT_USAGE
        if not words:
            log(f"--words '{args.words}' holds no words")
            return EXIT_USAGE
    for u in args.endpoints:
        if not (u.startswith("http://") or u.startswith("https://")):
            log(f"--endpoint '{u}' must start with http:// or https://")
            return EXIT_USAGE
    opt = Options(plan=args.plan, endpoints=args.endpoints, model=args.model,
                  output=args.output, errors=args.errors or args.output + ".errors.jsonl",
                  flavour=args.flavour, judge=args.judge, logprobs=args.logprobs,
                  concurrency=args.concurrency, timeout=args.timeout, retries=args.retries,
                  backoff=args.backoff, max_backoff=args.max_backoff,
                  max_failures=args.max_failures, words=words, fsync=not args.no_fsync,
                  progress=not args.no_progress)

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    try:
        return asyncio.run(Run(opt).main())
    except KeyboardInterrupt:
        log("interrupted; every result written so far is whole: run the same command again "
            "to continue")
        return EXIT_INTERRUPTED
    except (PlanError, ResultsError) as e:
        log(str(e))
        return EXIT_USAGE
    except RequestFailed as e:
        log(f"cannot prepare the run: {e}")
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
