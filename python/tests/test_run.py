"""phasekv.run against a loopback fake server: placement, judges, faults, resume."""

from __future__ import annotations

import json

import pytest

import _run_support as S  # noqa: E402  (sets the import path)

from phasekv.run.__main__ import main  # noqa: E402
from phasekv.run.plan import PlanError, read_plan  # noqa: E402
from phasekv.run.prompt import Pool, build, landing_error  # noqa: E402
from phasekv.run.results import AppendFile, ResultsError, done_ids  # noqa: E402

TARGETS = [20 + 3 * k for k in range(16)]  # residues mod 4 all covered, 4 each
QUERY, RL, M = 80, 3, 4


@pytest.fixture
def words(tmp_path):
    p = tmp_path / "words.txt"
    p.write_text(" ".join(S.FAKE_WORDS))
    return str(p)


@pytest.fixture
def server():
    s = S.FakeServer("openai")
    yield s
    s.close()


def args(tmp_path, words, endpoints, *extra):
    a = ["--plan", str(tmp_path / "plan.jsonl"), "--model", "fake", "--output",
         str(tmp_path / "res.jsonl"), "--words", words, "--no-progress", "--backoff", "0.01",
         "--max-backoff", "0.05", "--timeout", "5"]
    for e in endpoints:
        a += ["--endpoint", e]
    return a + list(extra)


def expected_correct(target):
    return target % 4 != 3  # the fake model's rule


def check_results(path, targets):
    lines = S.read_lines(path)
    ids = [x["id"] for x in lines]
    assert sorted(ids) == list(range(len(targets))), "every item exactly once"
    for x in lines:
        assert x["position"] == targets[x["id"]]
        assert x["correct"] is expected_correct(x["position"]), x
    return lines


def test_prompt_places_segments_at_plan_positions(tmp_path):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS, QUERY, RL, M)
    items = read_plan(str(tmp_path / "plan.jsonl"))
    keys = [(f"k{i}", 100 + i) for i in range(5)]
    vals = [(f"v{i}", 200 + i) for i in range(5)]
    pool = Pool(leading=[1], keys=keys, values=vals, space_first=False)
    key_ids = {i for _, i in keys}
    for it in items:
        p = build(it, pool)
        assert len(p.ids) == QUERY + 1 and p.ids[0] == 1
        tk = p.ids[it.target]
        assert p.ids[QUERY] == tk and p.ids.count(tk) == 2
        # records start with a key exactly at start + k * RL, values follow
        for s in it.segments:
            if s.kind in ("records", "target"):
                for r in range(s.records):
                    p0 = s.start + r * RL
                    assert p.ids[p0] in key_ids or p0 == 0
                    assert all(p.ids[q] not in key_ids for q in range(p0 + 1, p0 + RL))
            elif s.kind == "filler":
                assert all(p.ids[q] not in key_ids for q in range(max(s.start, 1),
                                                                   s.start + s.length))
        assert p.answer_words == p.words[it.target + 1:it.target + RL]
        assert p.text.split() == p.words[1:]
        assert landing_error(p, p.ids) is None
        moved = p.ids[:30] + [3] + p.ids[30:-1]
        msg = landing_error(p, moved)
        assert f"item {it.id}" in msg and "position 30" in msg


def test_plan_errors_name_the_item(tmp_path):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS[:2], QUERY, RL, M)
    lines = (tmp_path / "plan.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["segments"][1]["start"] += 1
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(PlanError, match=r"bad.jsonl:2 \(item 1\).*tile"):
        read_plan(str(tmp_path / "bad.jsonl"))
    bad = json.loads(lines[1])
    bad["record_length"] = 1
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(PlanError, match=r"item 1.*record_length\" = 1"):
        read_plan(str(tmp_path / "bad.jsonl"))
    (tmp_path / "dup.jsonl").write_text(lines[0] + "\n" + lines[0] + "\n")
    with pytest.raises(PlanError, match="item id 0 repeats line 1"):
        read_plan(str(tmp_path / "dup.jsonl"))


def test_results_file_cuts_a_torn_line_and_rejects_duplicates(tmp_path):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS[:3], QUERY, RL, M)
    plan = {it.id: it for it in read_plan(str(tmp_path / "plan.jsonl"))}
    path = tmp_path / "r.jsonl"
    whole = json.dumps({"id": 0, "position": TARGETS[0], "correct": True}) + "\n"
    path.write_text(whole + '{"id": 1, "posi')
    f = AppendFile(str(path))
    assert f.torn_bytes == len('{"id": 1, "posi')
    assert list(done_ids(f, plan)) == [0]
    f.append({"id": 1, "position": TARGETS[1], "correct": False})
    with pytest.raises(ResultsError, match="locked"):
        AppendFile(str(path))
    f.close()
    assert path.read_text() == whole + '{"id":1,"position":%d,"correct":false}\n' % TARGETS[1]
    path.write_text(whole + whole)
    with pytest.raises(ResultsError, match="item 0 repeats line 1"):
        done_ids(AppendFile(str(path)), plan)


def test_full_run_with_faults_never_gives_a_wrong_correct(tmp_path, words, server):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS, QUERY, RL, M)
    server.state.fault_every = 3  # 500, non-JSON, truncated JSON, missing fields in turn
    rc = main(args(tmp_path, words, [server.url], "--concurrency", "4", "--retries", "8"))
    assert rc == 0
    assert server.state.faults_sent >= 8
    lines = check_results(tmp_path / "res.jsonl", TARGETS)
    assert sum(x["correct"] for x in lines) == 12  # 4 of the 16 targets are 3 mod 4
    assert max(x["attempts"] for x in lines) >= 2
    assert S.read_lines(str(tmp_path / "res.jsonl") + ".errors.jsonl") == []


def test_resume_skips_done_items_and_cuts_a_torn_line(tmp_path, words, server):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS, QUERY, RL, M)
    assert main(args(tmp_path, words, [server.url])) == 0
    res = tmp_path / "res.jsonl"
    lines = res.read_text().splitlines(keepends=True)
    kept = lines[:5]
    res.write_text("".join(kept) + lines[5][: len(lines[5]) // 2])
    before = server.state.completions
    assert main(args(tmp_path, words, [server.url])) == 0
    assert server.state.completions - before == len(TARGETS) - 5
    assert res.read_text().splitlines(keepends=True)[:5] == kept
    check_results(res, TARGETS)
    before = server.state.completions
    assert main(args(tmp_path, words, [server.url])) == 0  # nothing left to do
    assert server.state.completions == before


def test_landing_check_refuses_naming_the_item(tmp_path, words, server, capsys):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS[:4], QUERY, RL, M)
    server.state.shift_at = 50  # the server's tokenizer inserts a token in long texts
    rc = main(args(tmp_path, words, [server.url], "--concurrency", "1"))
    assert rc == 3
    err = capsys.readouterr().err
    assert "item 0" in err and "position 50" in err and "would not land" in err, err
    assert S.read_lines(tmp_path / "res.jsonl") == []
    assert server.state.completions == 0


def test_failing_server_gives_error_lines_then_a_rerun_completes(tmp_path, words, server):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS[:6], QUERY, RL, M)
    server.state.fail_paths = {"/v1/completions"}  # tokenizes, but every completion is a 500
    rc = main(args(tmp_path, words, [server.url], "--retries", "1", "--concurrency", "2"))
    assert rc == 1
    assert S.read_lines(tmp_path / "res.jsonl") == []
    errs = S.read_lines(str(tmp_path / "res.jsonl") + ".errors.jsonl")
    assert sorted(e["id"] for e in errs) == list(range(6))
    assert all("HTTP 500" in e["error"] and e["attempts"] == 2 for e in errs)
    server.state.fail_paths = set()
    assert main(args(tmp_path, words, [server.url])) == 0
    check_results(tmp_path / "res.jsonl", TARGETS[:6])
    # --max-failures stops a run whose servers keep failing
    server.state.fail_paths = {"/v1/completions"}
    rc = main(args(tmp_path, words, [server.url], "--retries", "0", "--concurrency", "1",
                   "--max-failures", "2", "-o", str(tmp_path / "r2.jsonl")))
    assert rc == 3
    assert len(S.read_lines(str(tmp_path / "r2.jsonl") + ".errors.jsonl")) == 2


def test_unreachable_server_is_refused_before_any_item(tmp_path, words, server):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS[:2], QUERY, RL, M)
    server.state.fail_paths = {"/tokenize"}
    assert main(args(tmp_path, words, [server.url], "--retries", "1",
                     "--flavour", "vllm")) == 3
    assert S.read_lines(tmp_path / "res.jsonl") == []


def test_one_endpoint_down_the_others_carry_the_run(tmp_path, words, server):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS, QUERY, RL, M)
    down = S.FakeServer("openai")
    url = down.url
    down.close()  # connection refused from now on
    rc = main(args(tmp_path, words, [server.url, url], "--retries", "6"))
    assert rc == 0
    lines = check_results(tmp_path / "res.jsonl", TARGETS)
    assert {x["endpoint"] for x in lines} == {server.url}


def test_llama_server_flavour_and_logprob_judge(tmp_path, words):
    s = S.FakeServer("llama-server")
    try:
        S.write_plan(tmp_path / "plan.jsonl", TARGETS, QUERY, 2, M)
        assert main(args(tmp_path, words, [s.url], "--judge", "logprob")) == 0
        lines = check_results(tmp_path / "res.jsonl", TARGETS)
        for x in lines:
            assert x["judge"] == "logprob"
            assert x["answer_logprob"] == (-0.2 if x["correct"] else None)
        # the plan's "judge" field wins over the flag
        S.write_plan(tmp_path / "plan.jsonl", TARGETS, QUERY, 2, M, judge="logprob")
        rc = main(args(tmp_path, words, [s.url], "--judge", "greedy", "-o",
                       str(tmp_path / "r3.jsonl")))
        assert rc == 0
        assert {x["judge"] for x in S.read_lines(tmp_path / "r3.jsonl")} == {"logprob"}
    finally:
        s.close()
    S.write_plan(tmp_path / "plan.jsonl", TARGETS[:1], QUERY, 3, M)
    s = S.FakeServer("openai")
    try:
        rc = main(args(tmp_path, words, [s.url], "--judge", "logprob", "-o",
                       str(tmp_path / "r4.jsonl")))
        assert rc == 3  # three-token records: logprob needs one-token answers
    finally:
        s.close()


def test_bad_arguments_are_named(tmp_path, words, capsys):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS[:1], QUERY, RL, M)
    assert main(args(tmp_path, words, ["127.0.0.1:1"])) == 2
    assert "--endpoint '127.0.0.1:1'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(args(tmp_path, words, ["http://127.0.0.1:1"], "--concurrency", "0"))
    assert "--concurrency" in capsys.readouterr().err
    missing = str(tmp_path / "nope.jsonl")
    assert main(["--plan", missing] + args(tmp_path, words, ["http://127.0.0.1:1"])[2:]) == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_items_spread_over_endpoints(tmp_path, words, server):
    S.write_plan(tmp_path / "plan.jsonl", TARGETS, QUERY, RL, M)
    other = S.FakeServer("openai")
    try:
        assert main(args(tmp_path, words, [server.url, other.url], "--concurrency", "2")) == 0
    finally:
        other.close()
    lines = check_results(tmp_path / "res.jsonl", TARGETS)
    per = {u: sum(x["endpoint"] == u for x in lines) for u in (server.url, other.url)}
    assert min(per.values()) >= 4, per
    assert other.state.completions == per[other.url]  # each item's answer from its endpoint


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signal_stops_cleanly_and_the_rerun_completes(tmp_path, words, server, sig):
    import signal
    import subprocess
    import sys
    import time
    S.write_plan(tmp_path / "plan.jsonl", TARGETS, QUERY, RL, M)
    server.state.delay = 0.05
    cmd = [sys.executable, "-m", "phasekv.run"] + args(tmp_path, words, [server.url],
                                                       "--concurrency", "2")
    proc = subprocess.Popen(cmd, env=S.subprocess_env(), stderr=subprocess.PIPE, text=True)
    res = tmp_path / "res.jsonl"
    deadline = time.monotonic() + 60
    while not (res.exists() and res.read_text().count("\n") >= 3):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    n = res.read_text().count("\n")
    assert 3 <= n < len(TARGETS)
    server.state.delay = 0.0
    assert main(args(tmp_path, words, [server.url])) == 0
    check_results(res, TARGETS)


def test_greedy_needs_exactly_the_tokens_asked_for(tmp_path, words, server):
    # A server that spends one more token (a stray byte that decodes to no text) before the
    # right text: not correct.
    S.write_plan(tmp_path / "plan.jsonl", TARGETS, QUERY, RL, M)
    server.state.hidden_byte_at = TARGETS[0]  # 20: the fake answers it right
    assert expected_correct(TARGETS[0])
    assert main(args(tmp_path, words, [server.url])) == 0
    lines = {x["id"]: x for x in S.read_lines(tmp_path / "res.jsonl")}
    assert lines[0]["output"] == lines[0]["expected"] and lines[0]["output_tokens"] == RL
    assert lines[0]["correct"] is False
    for i in range(1, len(TARGETS)):
        assert lines[i]["correct"] is expected_correct(TARGETS[i])
        assert lines[i]["output_tokens"] == RL - 1
