"""Reads the timelines `pstrain --trace FILE` writes (Chrome trace-event
JSON, which chrome://tracing and ui.perfetto.dev open): where a worker's
step goes, and how a ps serves its requests.

    tools/trace FILE...               the breakdown of the files' steps and requests
    tools/trace --merge OUT FILE...   one file of several processes' timelines

A worker's step ("step N") is cut into its parts (load batch, forward and
backward, finish, ...); each part into what it spent its time on, layer
names left out (forward, backward, send, wait for replies, copy reply,
upload weights); each figure is the mean per step, in ms and as a share of
the step. A ps's messages (each holds one or more requests): the mean time
queued behind the others of their batch (`queued`), served (`message`), and
per request by op, and in the optimizer's apply. `tools/launch --trace` keeps a run's files in <run_dir>/trace/ and
merges this host's into <run_dir>/trace.json (the clocks of two hosts are
not comparable). Events a process could not keep (past its cap) are counted
as `dropped_events`.
"""

import argparse
import collections
import json
import statistics
import sys


class TraceError(Exception):
    """A file that is not a trace pstrain wrote; the message says why."""


def read(path):
    """The file's events and the count of those its process could not keep;
    TraceError when it is not trace-event JSON."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise TraceError(f"{path}: {e}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise TraceError(f"{path}: no traceEvents list")
    for e in events:
        if e.get("ph") == "X" and not all(k in e for k in ("name", "ts", "dur", "pid", "tid")):
            raise TraceError(f"{path}: a complete event lacks a field: {e}")
    other = doc.get("otherData")
    return events, int(other.get("dropped_events", 0)) if isinstance(other, dict) else 0


def load(path):
    """The file's events (read)."""
    return read(path)[0]


def read_all(paths):
    """Every file's events, and the events their processes could not keep."""
    events, dropped = [], 0
    for p in paths:
        e, d = read(p)
        events += e
        dropped += d
    return events, dropped


def merge(paths, out):
    """Writes the events of every file into `out`: files of one host's
    processes (each keeps its pid, and the clock is the host's, so they line
    up)."""
    events, dropped = read_all(paths)
    with open(out, "w") as f:
        json.dump({"displayTimeUnit": "ms", "otherData": {"dropped_events": dropped},
                   "traceEvents": events}, f)
    return len(events)


def threads(events):
    """Complete events by (pid, tid), by start time, the longer first where
    two start together (so a parent comes before its child)."""
    by = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            by[e["pid"], e["tid"]].append(e)
    for spans in by.values():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
    return by


def tree(spans):
    """The spans of one thread as a forest: [(span, children)]. Raises
    TraceError where two spans overlap without one holding the other."""
    roots, stack = [], []
    for s in spans:
        node = (s, [])
        while stack and s["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
            stack.pop()
        if stack:
            parent = stack[-1][0]
            # The times are rounded to the nanosecond when written.
            if s["ts"] + s["dur"] > parent["ts"] + parent["dur"] + 0.002:
                raise TraceError(f"{s['name']!r} at {s['ts']} overlaps {parent['name']!r} at "
                                 f"{parent['ts']} without nesting in it")
            stack[-1][1].append(node)
        else:
            roots.append(node)
        stack.append(node)
    return roots


def kind(name):
    """A span's name without its detail (a layer, a variable, a step number)."""
    for prefix in ("forward", "backward", "send", "apply", "step"):
        if name == prefix or name.startswith(prefix + " "):
            return prefix
    return name


def breakdown(events):
    """{"steps": n, "step_ms": mean, "parts": {part: {"ms": mean per step,
    "share": of the step, "inner": {kind: mean ms of the part's spans of that
    kind, less their own children}}}, "coverage": [share of each step its
    parts cover], "requests": {kind: {"count", "ms"}}} over every step and
    request in `events`."""
    steps, parts, inner, requests = [], collections.defaultdict(float), {}, {}
    coverage = []
    for spans in threads(events).values():
        for span, children in walk(tree(spans)):
            if kind(span["name"]) == "step":
                steps.append(span["dur"] / 1000)
                covered = 0.0
                for child, grandchildren in children:
                    parts[child["name"]] += child["dur"] / 1000
                    covered += child["dur"]
                    into = inner.setdefault(child["name"], collections.defaultdict(float))
                    for g, below in walk(grandchildren):
                        into[kind(g["name"])] += own_ms(g, below)
                coverage.append(covered / span["dur"] if span["dur"] else 1.0)
            elif span.get("cat") == "ps":
                r = requests.setdefault(kind(span["name"]), {"count": 0, "ms": 0.0})
                r["count"] += 1
                r["ms"] += span["dur"] / 1000
                if "queued_ms" in span.get("args", {}):
                    q = requests.setdefault("queued", {"count": 0, "ms": 0.0})
                    q["count"] += 1
                    q["ms"] += span["args"]["queued_ms"]
    n = len(steps)
    step_ms = statistics.mean(steps) if steps else 0.0
    return {
        "steps": n, "step_ms": step_ms, "coverage": coverage,
        "parts": {p: {"ms": ms / n, "share": ms / n / step_ms if step_ms else 0.0,
                      "inner": {k: v / n for k, v in inner[p].items()}}
                  for p, ms in parts.items()},
        "requests": {k: {"count": r["count"], "ms": r["ms"] / r["count"]}
                     for k, r in requests.items()},
    }


def own_ms(span, children):
    """The span's time not spent in its children (a layer's backward without
    the sends it makes)."""
    return (span["dur"] - sum(c["dur"] for c, _ in children)) / 1000


def walk(forest):
    for node in forest:
        yield node
        yield from walk(node[1])


def text(b):
    lines = []
    if b["steps"]:
        lines.append(f"{b['steps']} steps, {b['step_ms']:.3f} ms each on average; the parts "
                     f"below cover {min(b['coverage']):.1%} of a step at least")
        lines.append(f"{'part':<34} {'ms/step':>9} {'share':>7}")
        for part, p in sorted(b["parts"].items(), key=lambda kv: -kv[1]["ms"]):
            lines.append(f"{part:<34} {p['ms']:>9.3f} {p['share']:>7.1%}")
            for k, ms in sorted(p["inner"].items(), key=lambda kv: -kv[1]):
                lines.append(f"  {k:<32} {ms:>9.3f}")
    if b["requests"]:
        lines.append(f"{'ps: per request':<34} {'count':>9} {'ms each':>9}")
        for k, r in sorted(b["requests"].items()):
            lines.append(f"  {k:<32} {r['count']:>9} {r['ms']:>9.4f}")
    return "\n".join(lines) or "no steps and no ps requests in the trace"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", metavar="FILE")
    ap.add_argument("--merge", metavar="OUT", help="write the files' events into OUT instead")
    ap.add_argument("--json", action="store_true", help="print the breakdown as JSON")
    args = ap.parse_args(argv)
    try:
        if args.merge:
            print(f"trace: {merge(args.files, args.merge)} events in {args.merge}")
            return 0
        events, dropped = read_all(args.files)
        b = breakdown(events)
        b["dropped_events"] = dropped
    except TraceError as e:
        print(f"trace: {e}", file=sys.stderr)
        return 1
    print(json.dumps(b) if args.json else text(b))
    if b["dropped_events"]:
        print(f"trace: {b['dropped_events']} events were past a process's cap and not kept",
              file=sys.stderr)
    return 0
