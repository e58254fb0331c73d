#!/usr/bin/env python3
# ruff: noqa  (copied verbatim from /work/shared/tools/kubelet_tables.py; lint its origin, not this copy)
"""Replay kubelet CPU manager allocation tables against an allocator command and judge each answer.

Usage: kubelet_tables.py [--cases FILE] [--topologies FILE] -- CMD...
  CMD is run once per topology with '{topology}' and '{requests}' replaced by file paths; it prints one
  JSON line per request line: {"cpus": "cpulist"} or {"error": "..."}.  Each request line is
  {"free": "cpulist", "cpus": N, "numa_policy": P, "smt": "any"}: P is "best-effort" for kubelet's
  packed cases and "spread" for its distributed (distribute-cpus-across-numa) cases.
Verdict per case: an error where kubelet errors; otherwise a valid set (right size, inside free) that is
at least as good as kubelet's expected set:
  packed/uncore: (NUMA nodes, sockets, L3 groups if the fixture has uncore ids, split cores) compared
                 in that order (lexicographically), ours <= kubelet's;
  distributed:   NUMA nodes <= kubelet's and per-NUMA imbalance (max-min count) <= kubelet's.
Last line: 'kubelet tables: M/N cases at least as good as kubelet'. Exit 0 when all are.
"""
import argparse, json, os, subprocess, sys, tempfile
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(s):
    out = set()
    for p in (s or "").split(","):
        p = p.strip()
        if p:
            a, _, b = p.partition("-")
            out.update(range(int(a), int(b or a) + 1))
    return out


def metrics(topo, cpus):
    info = {c["cpu"]: c for c in topo["cpus"]}
    explicit_uncore = topo.get("explicit_cpuinfo_fields", {}).get("UncoreCacheID", False)
    per_core = Counter((info[c]["socket"], info[c]["core"]) for c in info)
    used_core = Counter((info[c]["socket"], info[c]["core"]) for c in cpus)
    split = sum(1 for k, n in used_core.items() if n < per_core[k])
    numa = Counter(info[c]["numa"] for c in cpus)
    m = {"numa": len(numa), "sockets": len({info[c]["socket"] for c in cpus}), "split": split,
         "imbalance": (max(numa.values()) - min(numa.values())) if numa else 0}
    m["l3"] = len({info[c]["uncore"] for c in cpus}) if explicit_uncore else 0
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=os.path.join(HERE, "../kubelet-cpumanager/cases.json"))
    ap.add_argument("--topologies", default=os.path.join(HERE, "../kubelet-cpumanager/topologies.json"))
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    cases = json.load(open(a.cases))
    topos = json.load(open(a.topologies))
    good = 0
    tmp = tempfile.mkdtemp()
    by_topo = {}
    for c in cases:
        by_topo.setdefault(c["topology"], []).append(c)
    for name, group in by_topo.items():
        tfile = os.path.join(tmp, name + ".json")
        json.dump(topos[name], open(tfile, "w"))
        rfile = os.path.join(tmp, name + ".requests.jsonl")
        with open(rfile, "w") as f:
            for c in group:
                spread = c["options"].get("distribute_across_numa")
                f.write(json.dumps({"free": c["available"], "cpus": c["request"],
                                    "numa_policy": "spread" if spread else "best-effort", "smt": "any"}) + "\n")
        argv = [x.replace("{topology}", tfile).replace("{requests}", rfile) for x in cmd]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        answers = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
        if p.returncode != 0 or len(answers) != len(group):
            for c in group:
                print("%-18s FAIL command: exit %d, %d answers for %d requests %s" % (
                    c["id"], p.returncode, len(answers), len(group), p.stderr.strip()[-160:]))
            continue
        for c, ans in zip(group, answers):
            verdict = judge(topos[name], c, ans)
            good += verdict == "ok"
            print("%-18s %s" % (c["id"], verdict))
    print("kubelet tables: %d/%d cases at least as good as kubelet" % (good, len(cases)))
    sys.exit(0 if good == len(cases) else 1)


def judge(topo, c, ans):
    if c["expected"] is None:
        return "ok" if "error" in ans else "FAIL kubelet errors, got %s" % ans.get("cpus")
    if "error" in ans:
        return "FAIL error: %s" % ans["error"][:120]
    got = parse(ans.get("cpus"))
    if len(got) != c["request"] or not got <= parse(c["available"]):
        return "FAIL invalid set %s" % ans.get("cpus")
    ours, theirs = metrics(topo, got), metrics(topo, parse(c["expected"]))
    if c["options"].get("distribute_across_numa"):
        ok = ours["numa"] <= theirs["numa"] and ours["imbalance"] <= theirs["imbalance"]
    else:
        key = lambda m: (m["numa"], m["sockets"], m["l3"], m["split"])
        ok = key(ours) <= key(theirs)
    return "ok" if ok else "FAIL worse: ours %s kubelet %s (%s)" % (ours, theirs, c["expected"])


if __name__ == "__main__":
    main()
