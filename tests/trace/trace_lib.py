"""Reading adgt's Chrome traces (docs/trace.md) for the tests: events by rank,
each step's span and how much of it the rank's other spans cover."""
import collections
import json


def load(path):
    with open(path) as f:
        t = json.load(f)  # a file that is not JSON fails here
    assert isinstance(t.get("traceEvents"), list), f"{path}: no traceEvents array"
    return t


def by_rank(trace):
    """{pid: [events]} of the spans and instants (metadata left out), and {pid: process name}."""
    events, names = collections.defaultdict(list), {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M":
            if e["name"] == "process_name":
                names[e["pid"]] = e["args"]["name"]
            continue
        assert e["ph"] in ("X", "i"), f"unexpected event phase {e['ph']!r}: {e}"
        if e["ph"] == "X":
            assert e["dur"] >= 0, f"negative duration: {e}"
        events[e["pid"]].append(e)
    return events, names


def covered(spans, a, b):
    """Length of [a, b] covered by the union of (start, end) spans."""
    iv = sorted((max(a, s), min(b, e)) for s, e in spans if s < b and e > a)
    total, cur = 0.0, None
    for s, e in iv:
        if cur is None or s > cur[1]:
            if cur:
                total += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    if cur:
        total += cur[1] - cur[0]
    return total


def step_coverage(events):
    """[(step name, duration us, covered share)] of one rank: each 'step N'
    span against the union of the rank's other spans (all tracks) inside it."""
    out = []
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X" and e["cat"] != "step"]
    for s in (e for e in events if e["ph"] == "X" and e["cat"] == "step"):
        a, b = s["ts"], s["ts"] + s["dur"]
        out.append((s["name"], s["dur"], covered(spans, a, b) / s["dur"] if s["dur"] > 0 else 1.0))
    return out
