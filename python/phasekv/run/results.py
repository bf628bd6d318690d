"""Append-only JSON-lines files that survive kills.

Every line is written whole by one ``os.write`` of the complete line and its newline on a file
opened with O_APPEND, then flushed to disk (fsync). A kill can therefore leave at most one torn
last line (no newline); opening the file again cuts that tail off before anything is appended,
so no torn line ever sits between whole ones. An exclusive lock (flock) keeps a second runner
off the same file.
"""

from __future__ import annotations

import fcntl
import json
import os
from typing import Dict, List, Tuple


class ResultsError(RuntimeError):
    """A results file that cannot be used: unreadable, locked, or not ours."""


class AppendFile:
    def __init__(self, path: str, fsync: bool = True):
        self.path = path
        self.fsync = fsync
        self.torn_bytes = 0
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as e:
            raise ResultsError(f"cannot open '{path}': {e.strerror}") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise ResultsError(f"'{path}' is locked by another running phasekv.run; "
                               "two runs must not write the same results") from None
        self.lines = self._read_and_repair()

    def _read_and_repair(self) -> List[Tuple[int, dict]]:
        """Whole lines as (line number, object); cuts a torn last line off the file."""
        with open(self.path, "rb") as f:
            data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            self.torn_bytes = len(data) - end
            os.ftruncate(self.fd, end)
            os.fsync(self.fd)
            data = data[:end]
        out = []
        for n, raw in enumerate(data.split(b"\n")[:-1] if data else [], 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                raise ResultsError(f"{self.path}:{n}: not a JSON line (this file was not "
                                   "written by phasekv.run, or was edited)") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("id"), int):
                raise ResultsError(f"{self.path}:{n}: a line without an integer \"id\"")
            out.append((n, obj))
        return out

    def append(self, obj: dict) -> None:
        data = (json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        if self.fsync:
            os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


def done_ids(results: AppendFile, plan_by_id: Dict[int, object]) -> Dict[int, dict]:
    """The items a results file already holds, checked against the plan: each id once, each
    in the plan with the plan's position."""
    done: Dict[int, dict] = {}
    where: Dict[int, int] = {}
    for n, obj in results.lines:
        i = obj["id"]
        if i in done:
            raise ResultsError(f"{results.path}:{n}: item {i} repeats line {where[i]}")
        item = plan_by_id.get(i)
        if item is None:
            raise ResultsError(f"{results.path}:{n}: item {i} is not in the plan (results of "
                               "another plan?)")
        if obj.get("position") != item.target or not isinstance(obj.get("correct"), bool):
            raise ResultsError(f"{results.path}:{n}: item {i} has position "
                               f"{obj.get('position')!r}, the plan says {item.target} (results "
                               "of another plan?)")
        done[i] = obj
        where[i] = n
    return done
