#!/usr/bin/env python3
"""Config fuzzing (docs/reliability.md): mutated run files through adgt-train's config path.

Generates N fuzzed run files from the shipped configs (configs/*.yaml), seeded
and reproducible, writes each to OUT/cases/case_NNNN.yaml (with its mutation in
case_NNNN.json), runs each through the real binary

    adgt-train --config CASE --print-config          (--mode print-config, default)
    adgt-train --config CASE --dry-run --cluster dgx-h100   (--mode dry-run)

with a per-case timeout, and classifies the result:

  accepted     exit 0
  rejected     non-zero exit with "error: ..." that names the mutated key
               (section.key) or a line (CASE.yaml:LINE)
  bad_message  rejected without naming the key or a line, or with an exit
               status other than 2 (the ConfigError contract of adgt-train)
  crash        killed by a signal, or a sanitizer report on stderr
               (AddressSanitizer, LeakSanitizer, "runtime error:" of UBSan)
  hang         still running at the timeout

Mutations that YAML or the schema must refuse (an unknown key, a NaN, a list
for a scalar, ...) and were accepted are listed as `accepted_invalid` (also a
failure). Prints a summary table and every non-good case with its file; exits
1 when any case is a crash, hang, bad_message or accepted_invalid.

  scripts/reliability/fuzz_configs.py --bin build-gc/apps/adgt-train [-n 1000] [--seed 17]
      [--out runs/fuzz_configs] [--timeout 10] [--jobs 2] [--mode print-config|dry-run]
      [--generate-only] [--run-only]   (--run-only: run the cases already in OUT/cases)
"""
import argparse
import concurrent.futures as cf
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

sys.set_int_max_str_digits(0)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SANITIZER = re.compile(r"AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:|"
                       r"ThreadSanitizer|MemorySanitizer")


# ------------------------------------------------------------------ schema

def load_schema():
    """{'model.vocab_size': (type, allowed)} from docs/config.md's key table."""
    schema = {}
    with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\| `([a-z_]+)\.([a-z_0-9]+)` \| ([a-z0-9 ]+) \| `([^`]*)` \| ([^|]*) \|", line)
            if m:
                schema[f"{m[1]}.{m[2]}"] = (m[3].strip(), m[5].strip(), m[4])
    if not schema:
        sys.exit("fuzz_configs: no key table found in docs/config.md")
    return schema


def sections_of(schema):
    out = []
    for k in schema:
        s = k.split(".")[0]
        if s not in out:
            out.append(s)
    return out


# ------------------------------------------------------------ base configs

class Base:
    """A shipped config as lines, with where each section and key is."""

    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.keys = []      # (line index, section, key, value text)
        self.sections = []  # (line index, section)
        sec = None
        for i, l in enumerate(self.lines):
            m = re.match(r"^([a-z_]+):\s*(#.*)?$", l)
            if m:
                sec = m[1]
                self.sections.append((i, sec))
                continue
            m = re.match(r"^  ([a-z_0-9]+):\s*(.*?)\s*(#.*)?$", l)
            if m and sec:
                self.keys.append((i, sec, m[1], m[2]))


# -------------------------------------------------------------- mutations

HUGE_INTS = ["9223372036854775807", "9223372036854775808", "-9223372036854775808",
             "-9223372036854775809", "18446744073709551615", "18446744073709551616",
             str(2 ** 70), str(2 ** 62), str(2 ** 40), str(2 ** 31), "4611686018427387904",
             "9" * 400]
HUGE_REALS = ["1e400", "-1e400", "1e308", "1.7976931348623157e308", "4.9e-324", "1e-400",
              "2.5e-310", "1e30"]
NAN_INF = [".nan", ".NaN", "nan", "NaN", ".inf", "-.inf", "inf", "-inf", "+.inf", "Infinity"]
ODD_NUMBERS = ["0x10", "0o17", "010", "1_000", "+8", "8.", ".5", "8.0", "1e3", "-0", "+-1", "1e",
               "08", "0b101", "١٢", "８"]
UNICODE = ["ünïcödé", "日本語", "😀", "a\u202eb", "\u00a0", "e\u0301", "\ufeff"]


def mutate_name(rng, name):
    ops = ["swap", "drop", "insert", "replace", "upper", "dash", "space"]
    op = rng.choice(ops)
    if len(name) < 2:
        op = "insert"
    i = rng.randrange(len(name))
    letters = "abcdefghijklmnopqrstuvwxyz_0123456789"
    if op == "swap" and i + 1 < len(name):
        return name[:i] + name[i + 1] + name[i] + name[i + 2:]
    if op == "drop":
        return name[:i] + name[i + 1:]
    if op == "insert":
        return name[:i] + rng.choice(letters) + name[i:]
    if op == "upper":
        return name.upper()
    if op == "dash":
        return name.replace("_", "-") if "_" in name else name + "-x"
    if op == "space":
        return name + " x"
    return name[:i] + rng.choice(letters) + name[i + 1:]


def numeric(typ):
    return typ in ("int", "uint64", "float")


def value_rejected(schema, full, value):
    """Whether value (YAML text) must be refused for key `full` (None: unknown)."""
    typ, allowed, _ = schema[full]
    v = value.strip(" ")
    if v in ("~", "null", "") or v.startswith(("[", "{")):
        return not (typ == "int list" and v.startswith("["))
    if numeric(typ) or typ == "bool":
        if v in NAN_INF or v.startswith(('"', "'")):
            return True
        if v in ("1e400", "-1e400"):
            return True
        if typ in ("int", "uint64") and v in ("9" * 400, str(2 ** 70), "18446744073709551616"):
            return True
    if typ == "int" and re.fullmatch(r"[+-]?[0-9]+", v):
        x = int(v)
        if x >= 2 ** 63 or x < -2 ** 63:
            return True
        if "positive" in allowed and x < 1:
            return True
        if "non-negative" in allowed and x < 0:
            return True
    if typ == "float" and re.fullmatch(r"[+-]?[0-9.eE+-]+", v):
        try:
            x = float(v)
        except ValueError:
            return True
        if x != x or x in (float("inf"), float("-inf")):
            return True
        if "> 0" in allowed and x <= 0:
            return True
        if ">= 0" in allowed and x < 0:
            return True
    if typ == "bool" and v not in ("true", "false", "True", "False", "TRUE", "FALSE"):
        return True
    if typ in ("int", "uint64") and not re.fullmatch(r"\+?-?[0-9]+", v):
        return True
    if typ == "string" and "one of" in allowed and not v.startswith(("'", '"')):
        choices = re.findall(r"[a-z0-9-]+", allowed.split("{", 1)[-1])
        return v not in choices
    return None


def set_value(base, idx, value):
    lines = list(base.lines)
    i, sec, key, _ = base.keys[idx]
    lines[i] = f"  {key}: {value}"
    return lines, i + 1, f"{sec}.{key}"


def gen_case(rng, base, schema, sections):
    """One mutation of `base`: (text as bytes, meta)."""
    family = rng.choices(["key", "type", "value", "structure"], weights=[2, 2, 3, 3])[0]
    lines = list(base.lines)
    meta = {"base": base.name, "family": family}
    k_idx = rng.randrange(len(base.keys))
    li, sec, key, val = base.keys[k_idx]
    full = f"{sec}.{key}"
    typ = schema.get(full, ("?", "", ""))[0]
    must = None

    if family == "key":
        kind = rng.choice(["typo", "unknown", "wrong_section", "section_typo", "duplicate_key",
                           "duplicate_section", "key_in_root", "empty_key"])
        meta["kind"] = kind
        if kind == "typo":
            new = mutate_name(rng, key)
            lines[li] = f"  {new}: {val}"
            meta.update(key=f"{sec}.{new}", line=li + 1)
            must = f"{sec}.{new}" not in schema
        elif kind == "unknown":
            new = rng.choice(["zz_unknown", "learning_rate", "batch_size", "n_embd", "dropout", "foo"])
            lines.insert(li + 1, f"  {new}: {rng.choice(['1', 'true', 'x', '0.5'])}")
            meta.update(key=f"{sec}.{new}", line=li + 2)
            must = f"{sec}.{new}" not in schema
        elif kind == "wrong_section":
            others = [s for _, s in base.sections if s != sec]
            if not others:
                others = [s for s in sections if s != sec]
            dest = rng.choice(others)
            del lines[li]
            d = next((j for j, s in base.sections if s == dest), None)
            if d is None:
                lines += [f"{dest}:", f"  {key}: {val}"]
                line = len(lines)
            else:
                d = d - 1 if d > li else d
                lines.insert(d + 1, f"  {key}: {val}")
                line = d + 2
            meta.update(key=f"{dest}.{key}", line=line)
            must = f"{dest}.{key}" not in schema
        elif kind == "section_typo":
            si, s = rng.choice(base.sections)
            new = mutate_name(rng, s)
            lines[si] = f"{new}:"
            meta.update(key=new, line=si + 1)
            must = new not in sections
        elif kind == "duplicate_key":
            lines.insert(li + 1, lines[li])
            meta.update(key=full, line=li + 2)
            must = True
        elif kind == "duplicate_section":
            lines += [f"{sec}:", f"  {key}: {val}"]
            meta.update(key=sec, line=len(lines) - 1)
            must = True
        elif kind == "key_in_root":
            lines.insert(0, f"{key}: {val}")
            meta.update(key=key, line=1)
            must = True
        else:  # empty_key
            lines.insert(li + 1, "  : 3")
            meta.update(key=sec, line=li + 2)
            must = True

    elif family == "type":
        kind, value = rng.choice([
            ("string", rng.choice(["eight", "abc", "'8'", '"8"', "'true'", "x y z"])),
            ("list", rng.choice(["[1, 2]", "[]", "[a]", "[[1]]", "[1, [2, 3]]"])),
            ("block_list", None),
            ("map", rng.choice(["{a: 1}", "{}", "{value: 8}"])),
            ("block_map", None),
            ("null", rng.choice(["~", "null", ""])),
            ("bool", rng.choice(["true", "false", "yes", "on", "True"])),
            ("float_for_int", rng.choice(["8.5", "1.0", "1e2", "0.0"])),
            ("int_for_string", rng.choice(["0", "12", "-1"])),
        ])
        meta["kind"] = kind
        if kind == "block_list":
            lines[li] = f"  {key}:"
            lines[li + 1:li + 1] = ["    - 1", "    - 2"]
            value = "[1, 2]"
        elif kind == "block_map":
            lines[li] = f"  {key}:"
            lines[li + 1:li + 1] = ["    a: 1", "    b: 2"]
            value = "{a: 1, b: 2}"
        else:
            lines[li] = f"  {key}: {value}"
        meta.update(key=full, line=li + 1, value=value)
        must = value_rejected(schema, full, value)

    elif family == "value":
        pool = []
        if numeric(typ) or typ == "int list":
            pool += ["-1", "0", "-3", "1", "-0.5"] + HUGE_INTS + HUGE_REALS + NAN_INF + ODD_NUMBERS
        if typ == "int list":
            pool += ["[0]", "[-1, 2]", "[" + ", ".join(["1"] * 5000) + "]",
                     "[" + HUGE_INTS[2] + "]", "[1e400]", "[.nan]", "1,2,3", "1,,2", "[2, 2]"]
        if typ == "string":
            pool += ['""', "''", "' '"] + UNICODE + ["x" * 100000, '"' + "\\x00" + '"', "/dev/null",
                                                      "../../../../etc/passwd", "-1", "0"]
        if typ == "bool":
            pool += ["TRUE", "tRue", "1", "0", "yes", "off"]
        pool += ["9" * 20000, "'" + "ü" * 5000 + "'", "x" * 70000]
        value = rng.choice(pool)
        if typ in ("int", "uint64") and rng.random() < 0.3:  # the extremes, more often
            value = rng.choice(HUGE_INTS[:8] + ["-1", "0"])
        lines[li] = f"  {key}: {value}"
        meta.update(kind="value", key=full, line=li + 1, value=value[:80])
        must = value_rejected(schema, full, value)

    else:  # structure
        kind = rng.choice(["indent", "tab", "unclosed_quote", "unclosed_bracket", "unclosed_brace",
                           "anchor_alias", "alias_undefined", "merge_key", "deep_list", "deep_map",
                           "truncate", "garbage_bytes", "garbage_file", "nul_byte", "bom", "crlf",
                           "documents", "colon_value", "long_line", "only_comment", "scalar_root",
                           "list_root", "anchor_section"])
        meta["kind"] = kind
        text = None
        if kind == "indent":
            n = rng.choice([0, 1, 3, 4, 6])
            lines[li] = " " * n + lines[li].lstrip()
            meta.update(key=full if n in (0,) else None, line=li + 1)
            must = n in (1, 3)  # 0: a section-level key; 4/6: may continue a scalar
            must = None
        elif kind == "tab":
            lines[li] = "\t" + lines[li].lstrip()
            meta.update(key=full, line=li + 1)
        elif kind == "unclosed_quote":
            q = rng.choice(['"', "'"])
            lines[li] = f"  {key}: {q}{val}"
            meta.update(key=full, line=li + 1)
            must = True
        elif kind == "unclosed_bracket":
            lines[li] = f"  {key}: [{val}, 2"
            meta.update(key=full, line=li + 1)
            must = True
        elif kind == "unclosed_brace":
            lines[li] = f"  {key}: {{a: {val}"
            meta.update(key=full, line=li + 1)
            must = True
        elif kind == "anchor_alias":
            # the value of one key reused for another of the same section
            others = [k for k in base.keys if k[1] == sec and k[0] != li]
            if others:
                oi, _, okey, oval = rng.choice(others)
                lines[li] = f"  {key}: &v {val}"
                if oi > li:
                    lines[oi] = f"  {okey}: *v"
                    meta.update(key=f"{sec}.{okey}", line=oi + 1)
                else:
                    lines[oi] = f"  {okey}: &v {oval}"
                    lines[li] = f"  {key}: *v"
                    meta.update(key=full, line=li + 1)
            else:
                meta.update(key=full, line=li + 1)
        elif kind == "alias_undefined":
            lines[li] = f"  {key}: *nowhere"
            meta.update(key=full, line=li + 1)
            must = True
        elif kind == "merge_key":
            si, s = base.sections[0]
            lines[si] = f"{s}: &sec"
            lines += ["other_section:", "  <<: *sec"]
            meta.update(key="other_section", line=len(lines) - 1)
            must = True
        elif kind == "deep_list":
            d = rng.choice([50, 500, 5000, 50000])
            lines[li] = f"  {key}: " + "[" * d + "1" + "]" * d
            meta.update(key=full, line=li + 1, depth=d)
            must = True
        elif kind == "deep_map":
            d = rng.choice([50, 500, 5000, 50000])
            lines[li] = f"  {key}: " + "{a: " * d + "1" + "}" * d
            meta.update(key=full, line=li + 1, depth=d)
            must = True
        elif kind == "anchor_section":
            # a whole section aliased under another name: a billion-laughs-lite
            si, s = base.sections[0]
            lines[si] = f"{s}: &s"
            lines += ["train: *s"] if s != "train" else ["model: *s"]
            meta.update(key=None, line=len(lines))
            must = True
        elif kind == "colon_value":
            lines[li] = f"  {key}: a: b"
            meta.update(key=full, line=li + 1)
            must = True
        elif kind == "long_line":
            lines[li] = f"  {key}: " + "1" * rng.choice([1000, 100000])
            meta.update(key=full, line=li + 1)
            must = typ != "string"
        elif kind == "only_comment":
            lines = ["# nothing but a comment"]
            meta.update(key=None, line=None)
            must = False
        elif kind == "scalar_root":
            lines = [rng.choice(["42", "hello", "'model'", "~"])]
            meta.update(key=None, line=1)
        elif kind == "list_root":
            lines = ["- model", "- train"]
            meta.update(key=None, line=1)
            must = True
        elif kind == "documents":
            lines = ["---"] + lines + ["---", "model:", "  n_layers: 2"]
            meta.update(key=None, line=None)
        elif kind == "crlf":
            text = "\r\n".join(lines).encode()
            meta.update(key=None, line=None)
            must = False
        elif kind == "bom":
            text = b"\xef\xbb\xbf" + "\n".join(lines).encode()
            meta.update(key=None, line=None)
            must = False
        data = text if text is not None else "\n".join(lines).encode("utf-8")
        if kind == "truncate":
            cut = rng.randrange(len(data) + 1)
            data = data[:cut]
            meta.update(key=None, line=None, offset=cut)
        elif kind == "garbage_bytes":
            off = rng.randrange(len(data) + 1)
            junk = bytes(rng.randrange(256) for _ in range(rng.choice([1, 4, 16, 64])))
            data = data[:off] + junk + data[off:]
            meta.update(key=None, line=data[:off].count(b"\n") + 1, offset=off)
        elif kind == "garbage_file":
            data = bytes(rng.randrange(256) for _ in range(rng.choice([1, 16, 512, 4096])))
            meta.update(key=None, line=None)
        elif kind == "nul_byte":
            off = rng.randrange(len(data) + 1)
            data = data[:off] + b"\x00" + data[off:]
            meta.update(key=None, line=data[:off].count(b"\n") + 1, offset=off)
        meta["must_reject"] = must
        return data, meta

    meta["must_reject"] = must
    return "\n".join(lines).encode("utf-8"), meta


# ------------------------------------------------------------------ running

def run_case(args, path, meta):
    cmd = [args.bin, "--config", path]
    cmd += ["--print-config"] if args.mode == "print-config" else ["--dry-run", "--cluster", "dgx-h100"]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=args.cwd,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {"class": "hang", "why": f"still running after {args.timeout} s", "rc": None,
                "err": "", "secs": time.time() - t0}
    err = err.decode("utf-8", "replace")
    res = {"rc": p.returncode, "err": err[-4000:], "secs": round(time.time() - t0, 3)}
    if p.returncode < 0:
        res.update({"class": "crash", "why": f"killed by signal {-p.returncode} "
                    f"({signal.Signals(-p.returncode).name})"})
    elif SANITIZER.search(err):
        res.update({"class": "crash", "why": "sanitizer report: " + SANITIZER.search(err)[0]})
    elif p.returncode == 0:
        if meta.get("must_reject"):
            res.update({"class": "accepted_invalid", "why": "accepted a mutation that must be refused"})
        else:
            res.update({"class": "accepted", "why": ""})
    else:
        res.update(classify_rejection(path, meta, err, p.returncode))
    return res


def classify_rejection(path, meta, err, rc):
    base = re.escape(os.path.basename(path))
    msg = next((l for l in err.splitlines() if l.startswith("error: ")), "")
    if not msg:
        return {"class": "bad_message", "why": f"exit {rc} without an 'error: ' line"}
    if rc != 2:
        return {"class": "bad_message", "why": f"exit {rc}, not 2 (not a ConfigError): {msg[:200]}"}
    if re.search(base + r":[0-9]+", msg):
        return {"class": "rejected", "why": "names a line"}
    key = meta.get("key")
    if key and key in msg:
        return {"class": "rejected", "why": "names the key"}
    if key and "." in key and re.search(r"\b" + re.escape(key.split(".", 1)[1]) + r"\b", msg) \
            and key.split(".")[0] in msg:
        return {"class": "rejected", "why": "names the key"}
    if not key and re.search(r"\b(model|train|data|parallel|checkpoint|log|emulate)\.[a-z_0-9]+", msg):
        return {"class": "rejected", "why": "names a key"}
    return {"class": "bad_message", "why": "names neither the key nor a line: " + msg[:300]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "apps", "adgt-train"))
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "fuzz_configs"))
    ap.add_argument("--timeout", type=float, default=10)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--mode", choices=["print-config", "dry-run"], default="print-config")
    ap.add_argument("--generate-only", action="store_true")
    ap.add_argument("--run-only", action="store_true")
    ap.add_argument("--report", help="write the per-case results as JSON here")
    args = ap.parse_args()
    args.bin = os.path.abspath(args.bin)
    args.out = os.path.abspath(args.out)
    cases_dir = os.path.join(args.out, "cases")
    args.cwd = args.out

    if not args.run_only:
        schema = load_schema()
        sections = sections_of(schema)
        bases = [Base(p) for p in sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))]
        shutil.rmtree(cases_dir, ignore_errors=True)
        os.makedirs(cases_dir)
        rng = random.Random(args.seed)
        for i in range(args.n):
            base = rng.choice(bases)
            data, meta = gen_case(rng, base, schema, sections)
            name = os.path.join(cases_dir, f"case_{i:04d}")
            with open(name + ".yaml", "wb") as f:
                f.write(data)
            with open(name + ".json", "w") as f:
                json.dump(meta, f, ensure_ascii=True)
        print(f"wrote {args.n} cases to {cases_dir} (seed {args.seed})")
        if args.generate_only:
            return 0
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"fuzz_configs: {args.bin} is not an executable (build adgt-train, or pass --bin)")

    paths = sorted(glob.glob(os.path.join(cases_dir, "case_*.yaml")))
    metas = {}
    for p in paths:
        with open(p[:-5] + ".json") as f:
            metas[p] = json.load(f)
    t0 = time.time()
    results = {}
    with cf.ThreadPoolExecutor(max_workers=args.jobs) as ex:
        futs = {ex.submit(run_case, args, p, metas[p]): p for p in paths}
        for fut in cf.as_completed(futs):
            results[futs[fut]] = fut.result()
    wall = time.time() - t0

    classes = ["accepted", "rejected", "bad_message", "accepted_invalid", "crash", "hang"]
    counts = {c: 0 for c in classes}
    by_family = {}
    for p in paths:
        c = results[p]["class"]
        counts[c] += 1
        fam = metas[p]["family"]
        by_family.setdefault(fam, {k: 0 for k in classes})[c] += 1
    print(f"\n{len(paths)} cases, mode {args.mode}, binary {args.bin}, {wall:.0f} s "
          f"(slowest case {max((r['secs'] or 0) for r in results.values()):.2f} s)\n")
    print(f"{'family':<12}" + "".join(f"{c:>18}" for c in classes))
    for fam in sorted(by_family):
        print(f"{fam:<12}" + "".join(f"{by_family[fam][c]:>18}" for c in classes))
    print(f"{'total':<12}" + "".join(f"{counts[c]:>18}" for c in classes))
    bad = [p for p in paths if results[p]["class"] in ("bad_message", "accepted_invalid", "crash", "hang")]
    if bad:
        print(f"\n{len(bad)} case(s) not good:")
        for p in bad:
            r, m = results[p], metas[p]
            print(f"  {r['class']:<16} {p}  [{m['base']} {m['family']}/{m.get('kind')} "
                  f"key={m.get('key')} line={m.get('line')}] {r['why']}")
            if r["class"] == "crash":
                print("      " + "\n      ".join(r["err"].splitlines()[-12:]))
    if args.report:
        with open(args.report, "w") as f:
            json.dump({p: {**results[p], "meta": metas[p]} for p in paths}, f, indent=1)
    print("\nPASS: 0 crashes, 0 hangs, every rejection names the key or a line" if not bad else "\nFAIL")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
