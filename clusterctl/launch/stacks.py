"""Every rank's Python stacks, from every host: for a stall, and for `clusterctl stacks RUN` (docs/run.md#stacks).

    taken = collect(connector, run_id)               # ask each rank (hosts/scripts/stacks.py), read the dumps
    folder = taken.save(run_dir)                     # runs/<id>/stacks/<time>/rank-N.txt
    taken.screen()                                   # ranks grouped by where their main thread is in the program
    taken.odd_one_out()                              # the rank alone where the others are not, if any
    Stacks.newest(run_dir)                           # the last ones saved there (a stall's), read back

Each rank's bootstrap dumps its threads with faulthandler when signalled (hosts/scripts/stackdump.py); the
dump is parsed here (parse_dump, pure) and each rank summed up by the innermost frame of its main thread
that is the program's own (not the standard library's, not a site-packages library's, not the bootstrap's):
"time.sleep(3600) at stall.py:12 in main". Nothing is stopped or changed: a rank goes on as before.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import time
from dataclasses import dataclass, field
from functools import cached_property

from ..atomic import write_text
from ..hosts import hostscript
from ..hosts.connector import Connector
from ..hosts.fanout import run_all

STACKS_DIR = "stacks"
SAVED = "stacks.json"   # beside the rank files: everything the screen is made of, for reading them back
ANSWER_S = 5.0          # how long a rank has to write its dump
_HEADER = re.compile(r"^# clusterctl rank (\S+) pid (\d+) main thread (0x[0-9a-f]+)$")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str


@dataclass
class ThreadStack:
    ident: str
    frames: list[Frame] = field(default_factory=list)     # most recent call first, as faulthandler writes them


def parse_dump(text: str) -> tuple[str | None, list[ThreadStack]]:
    """(the main thread's id from the bootstrap's header, every thread of the last dump) (pure)."""
    main, threads = None, []
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            main = header.group(3)
            continue
        thread = _THREAD.match(line)
        if thread:
            threads.append(ThreadStack(thread.group(2)))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1].frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    # a file holds every dump since the rank started: keep the last one (a thread appears once per dump)
    last: list[ThreadStack] = []
    for t in reversed(threads):
        if any(seen.ident == t.ident for seen in last):
            break
        last.insert(0, t)
    return main, last


@dataclass
class RankStacks:
    rank: int
    host: str
    pid: int | None
    text: str
    source: dict[str, str] = field(default_factory=dict)      # "file:line" -> that line of code
    kinds: dict[str, str] = field(default_factory=dict)       # file -> program, library, python, bootstrap
    native: str | None = None
    error: str | None = None
    native_error: str | None = None                           # why --native gave nothing (no py-spy there)

    @cached_property
    def parsed(self) -> tuple[str | None, list[ThreadStack]]:
        """(the main thread's id, every thread), parsed once (where(), groups() and the file all read it)."""
        return parse_dump(self.text)

    def main_thread(self) -> ThreadStack | None:
        main, threads = self.parsed
        return next((t for t in threads if t.ident == main), threads[0] if threads else None)

    def where(self) -> str:
        """The main thread's innermost frame in the program (else in a library, else any), with its code."""
        thread = self.main_thread()
        if thread is None or not thread.frames:
            return self.error or "no Python stack"
        frames = thread.frames
        for wanted in ("program", "library"):
            found = next((f for f in frames if self.kinds.get(f.file, "program") == wanted), None)
            if found is not None:
                break
        else:
            found = frames[0]
        code = self.source.get(f"{found.file}:{found.line}", "")
        code = code if len(code) <= 60 else code[:59] + "…"
        place = f"{os.path.basename(found.file)}:{found.line}" + ("" if found.function == "<module>" else
                                                                   f" in {found.function}")
        return f"{code} at {place}" if code else place

    def file_text(self) -> str:
        """The dump with each frame's line of code under it, then the native frames when asked for."""
        lines = [f"rank {self.rank} on {self.host}, pid {self.pid}" + (f": {self.error}" if self.error else "")]
        main, threads = self.parsed
        for t in sorted(threads, key=lambda t: t.ident != main):       # the main thread first
            lines += ["", f"Thread {t.ident}" + (" (main thread)" if t.ident == main else "") + ", most recent call first:"]
            for f in t.frames:
                lines.append(f'  File "{f.file}", line {f.line} in {f.function}')
                code = self.source.get(f"{f.file}:{f.line}")
                if code:
                    lines.append(f"    {code}")
        if not threads:
            lines += ["", self.text.rstrip()]
        if self.native or self.native_error:
            lines += ["", "native (py-spy dump --native):", (self.native or self.native_error).rstrip()]
        return "\n".join(lines) + "\n"


@dataclass
class Stacks:
    run_id: str
    taken: float                                              # epoch seconds
    ranks: list[RankStacks]
    errors: dict[str, str] = field(default_factory=dict)      # host -> why it could not be asked
    folder: str | None = None                                 # where save() put them

    def groups(self) -> list[tuple[str, list[int]]]:
        """(where, ranks) for each place a main thread is, the most common first (pure)."""
        places: dict[str, list[int]] = {}
        for r in sorted(self.ranks, key=lambda r: r.rank):
            places.setdefault(r.where(), []).append(r.rank)
        return sorted(places.items(), key=lambda item: (-len(item[1]), item[1]))

    def odd_one_out(self) -> tuple[int, str] | None:
        """(rank, where) of the one rank whose place no other rank shares, when all the others share one; or of
        the one rank outside any collective, when the others (two or more) each wait in one, at several places (a
        rank frozen partway through a ring collective lets some ranks finish it and wait in the next)."""
        groups = self.groups()
        if len(groups) == 2 and len(groups[1][1]) == 1 and len(groups[0][1]) > 1:
            return groups[1][1][0], groups[1][0]
        outside = [(where, ranks) for where, ranks in groups if not _collective(where)]
        if len(groups) > 2 and len(outside) == 1 and len(outside[0][1]) == 1:
            return outside[0][1][0], outside[0][0]
        return None

    def together(self) -> str | None:
        """Where every rank is, when there are several on more than one host and all are at the same place (pure):
        a collective that waits on every rank at once."""
        groups = self.groups()
        hosts = {r.host for r in self.ranks}
        if len(groups) == 1 and len(groups[0][1]) > 1 and len(hosts) > 1 and not self.errors:
            return groups[0][0]
        return None

    def in_collectives(self) -> str | None:
        """Where the ranks are, when they are on more than one host at several places, each a collective (an
        `mx.distributed.` call, or `mx.eval` of what one feeds): ranks that wait for each other in collectives they
        reached apart (a link that dropped mid-collective lets some ranks finish it and wait in the next one)."""
        groups = self.groups()
        hosts = {r.host for r in self.ranks}
        if len(groups) > 1 and len(hosts) > 1 and not self.errors and all(_collective(where) for where, _ in groups):
            return "; ".join(f"{_ranks(ranks)}: {where}" for where, ranks in groups)
        return None

    def save(self, run_dir: str) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.taken))
        folder = os.path.join(run_dir, STACKS_DIR, stamp)
        n = 1
        while os.path.exists(folder):
            n += 1
            folder = os.path.join(run_dir, STACKS_DIR, f"{stamp}-{n}")
        os.makedirs(folder)
        for r in self.ranks:
            write_text(os.path.join(folder, f"rank-{r.rank}.txt"), r.file_text())
        write_text(os.path.join(folder, SAVED), json.dumps({
            "run_id": self.run_id, "taken": self.taken, "errors": self.errors,
            "ranks": [dataclasses.asdict(r) for r in self.ranks]}))
        self.folder = folder
        return folder

    @classmethod
    def newest(cls, run_dir: str) -> Stacks | None:
        """The stacks taken last of those saved in run_dir (a stall's, or `clusterctl stacks`'s): in its stacks/, and
        in each attempt's (runs/<id>/attempt-K/stacks/, a restartable run's), or None."""
        found = []
        for top in [os.path.join(run_dir, STACKS_DIR)] + sorted(glob.glob(os.path.join(run_dir, "attempt-*", STACKS_DIR))):
            try:
                names = os.listdir(top)
            except OSError:
                continue
            for name in names:
                try:
                    with open(os.path.join(top, name, SAVED), encoding="utf-8") as f:
                        data = json.load(f)
                    found.append(cls(data["run_id"], float(data["taken"]), [RankStacks(**r) for r in data["ranks"]],
                                     dict(data.get("errors") or {}), os.path.join(top, name)))
                except (OSError, ValueError, KeyError, TypeError):
                    continue
        return max(found, key=lambda s: s.taken, default=None)

    def screen(self) -> list[str]:
        """One screen: the ranks grouped by where they are, the odd one out marked, the hosts not reached."""
        odd = self.odd_one_out()
        where = f" in {self.folder}" if self.folder else ""
        out = [f"stacks of {len(self.ranks)} rank(s) of run {self.run_id}{where}:"]
        groups = self.groups()
        width = max((len(_ranks(ranks)) for _, ranks in groups), default=0)
        for place, ranks in groups:
            mark = "   <- the odd one out" if odd and ranks == [odd[0]] else ""
            out.append(f"  {_ranks(ranks):<{width}}  {place}{mark}")
        for host, why in self.errors.items():
            out.append(f"  {host}: {why}")
        for host, why in dict.fromkeys((r.host, r.native_error) for r in self.ranks if r.native_error):
            out.append(f"  {host}: no native frames: {why}")
        if not self.ranks and not self.errors:
            out.append("  no rank of this run is running on its hosts")
        return out


def _collective(where: str) -> bool:
    """A place (RankStacks.where) that waits on every rank: a collective's call, or the evaluation of its result."""
    return "mx.distributed." in where or "mx.eval(" in where


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def collect(connector: Connector, run_id: str, *, folders: dict[str, str] | None = None, native: bool = False,
            answer_s: float = ANSWER_S) -> Stacks:
    """Ask every rank of `run_id` on the connector's hosts (or those of `folders`: host -> the run's rank files
    there, as launch.json records them) for its stacks; hosts that cannot be asked are named in .errors.
    Takes about a second; `native` (py-spy) longer."""
    taken = time.time()

    def one(host):
        folder = folders[host.name] if folders else connector.rank_files_dir(host, run_id)
        with connector.transport(host) as t:
            return hostscript.run(t, host.python, "stacks.py", folder, run_id, str(answer_s), "1" if native else "0",
                                  timeout=answer_s + (90 if native else 20))

    hosts = [h for h in connector.cluster.hosts if not folders or h.name in folders]
    group = run_all(hosts, one, deadline=connector.deadline(answer_s + (90 if native else 20)))
    ranks, errors = [], {}
    for name, outcome in group.items():
        if outcome.error is not None:
            errors[name] = str(outcome.error)
            continue
        try:
            answer = hostscript.answer(outcome.value)
        except hostscript.NoAnswer as e:
            errors[name] = str(e)
            continue
        for entry in answer:
            ranks.append(RankStacks(int(entry["rank"]), name, entry.get("pid"), entry.get("text") or "",
                                    entry.get("source") or {}, entry.get("kinds") or {}, entry.get("native"),
                                    entry.get("error"), entry.get("native_error")))
    return Stacks(run_id, taken, sorted(ranks, key=lambda r: r.rank), errors)
