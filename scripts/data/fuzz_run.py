"""Runs the damaged inputs of scripts/data/fuzz_inputs.py against a build and
counts what went wrong (docs/data-format.md, "Damaged inputs").

    python3 scripts/data/fuzz_inputs.py --out build-asan/fuzz --count 500 --seed 1
    python3 scripts/data/fuzz_run.py --cases build-asan/fuzz --build build-asan \
        --model tests/layouts/model.yaml -j 2

Each case runs with a time limit (--timeout, 20 s) under ASAN_OPTIONS and
UBSAN_OPTIONS that stop at the first report with exit codes of their own, and
gets one verdict:

  crash    killed by a signal, a sanitizer report, or a sanitizer exit code
  hang     still running at the time limit
  unnamed  exit != 0 without the damaged file's name in the output
  silent   exit 0 on a damaged input with no bad record naming it
  mismatch a named error where a counted skip was expected (or the other way
           round), or a count of bad records outside the case's bounds
  pass     what the case expects

A table per class follows; with --check the exit status is 1 when any case is
not a pass. --self-test runs the verdicts against stand-in programs that
crash, hang, fail without a name and drop input silently (the runner must see
each).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

ASAN_EXIT, UBSAN_EXIT = 86, 87
SANITIZER_ENV = {
    'ASAN_OPTIONS': f'halt_on_error=1:abort_on_error=0:exitcode={ASAN_EXIT}:detect_leaks=0',
    'UBSAN_OPTIONS': f'halt_on_error=1:abort_on_error=0:print_stacktrace=1:exitcode={UBSAN_EXIT}',
    'OMP_NUM_THREADS': '1',
}
SANITIZER_MARKS = ('ERROR: AddressSanitizer', 'ERROR: LeakSanitizer', 'runtime error:',
                   'SUMMARY: UndefinedBehaviorSanitizer', 'terminate called')
VERDICTS = ('pass', 'crash', 'hang', 'unnamed', 'silent', 'mismatch')


def count_bad(work, needle):
    """Bad records naming the damaged file in WORK/out/bad_records.txt."""
    path = os.path.join(work, 'out', 'bad_records.txt')
    if not os.path.exists(path):
        return 0
    with open(path, 'rb') as f:
        return sum(1 for line in f if needle.encode() in line.split(b':', 1)[0])


def verdict(case, rc, output, timed_out, n_bad):
    """(verdict, why) of one run: rc the exit status (negative: a signal)."""
    if timed_out:
        return 'hang', 'still running at the time limit'
    mark = next((m for m in SANITIZER_MARKS if m in output), None)
    if rc < 0 or rc in (ASAN_EXIT, UBSAN_EXIT) or rc >= 128 or mark:
        return 'crash', (f'signal {signal.Signals(-rc).name}' if rc < 0 else f'exit {rc}') + (
            f', "{mark}"' if mark else '')
    expect, needle = case['expect'], case['needle']
    if rc != 0:
        # adgt-train heads a configuration error with the --set that caused
        # it: that echo alone does not name the file.
        if needle not in re.sub(r'--set data\.(train|val)=\S+', '', output):
            return 'unnamed', f'exit {rc} without "{needle}" in the message'
        if expect in ('error', 'error-or-ok'):
            return 'pass', ''
        return 'mismatch', f'exit {rc} where a counted skip was expected'
    if expect == 'error':
        return 'silent', 'exit 0 on a damaged file'
    if expect == 'error-or-ok':
        return 'pass', ''
    lo, hi = case.get('bad_min', 0), case.get('bad_max')
    if expect == 'skip' and n_bad == 0:
        return 'silent', 'exit 0 and no bad record names the file'
    if n_bad < lo or (hi is not None and n_bad > hi):
        return 'mismatch', f'{n_bad} bad records, expected {lo}..{"" if hi is None else hi}'
    return 'pass', ''


def substitute(argv, env):
    return [a.format(**env) for a in argv]


def run_case(case, places, timeout):
    work = os.path.join(places['work_root'], case['id'])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    argv = substitute(case['argv'], dict(places, work=work))
    env = dict(os.environ, **SANITIZER_ENV)
    # Its own process group: a hang is killed with everything it started.
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=work,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        rc, timed_out = p.returncode, False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        rc, timed_out = None, True
    output = out.decode(errors='replace')
    v, why = verdict(case, rc, output, timed_out, count_bad(work, case['needle']))
    last = [l for l in output.strip().split('\n') if l.strip()][-3:]
    if v == 'pass':
        shutil.rmtree(work, ignore_errors=True)
    return dict(id=case['id'], cls=case['class'], what=case['what'], verdict=v, why=why, rc=rc,
                tail=last, argv=argv)


def table(results):
    classes = sorted({r['cls'] for r in results})
    head = ['class', 'cases'] + list(VERDICTS)
    rows = []
    for c in classes + ['all']:
        rs = [r for r in results if c == 'all' or r['cls'] == c]
        rows.append([c, len(rs)] + [sum(r['verdict'] == v for r in rs) for v in VERDICTS])
    w = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    line = lambda xs: '  '.join(str(x).rjust(n) if i else str(x).ljust(n) for i, (x, n) in enumerate(zip(xs, w)))
    return '\n'.join([line(head)] + [line(r) for r in rows])


def run_all(cases, places, timeout, jobs):
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for r in pool.map(lambda c: run_case(c, places, timeout), cases):
            results.append(r)
    return results


def report(results, out):
    print(table(results))
    bad = [r for r in results if r['verdict'] != 'pass']
    for r in bad:
        print(f"\n{r['id']} {r['cls']}: {r['verdict']}: {r['why']}\n  {r['what']}\n  $ {' '.join(r['argv'])}")
        for l in r['tail']:
            print('  | ' + l[:300])
    with open(out, 'w') as f:
        for r in results:
            f.write(json.dumps(r) + '\n')
    print(f'\nresults: {out}')
    return bad


def self_test():
    """Each verdict from a stand-in program: the runner must tell them apart."""
    d = tempfile.mkdtemp(prefix='fuzz_run_self_test_')
    needle = 'c0000/in.jsonl'
    sh = lambda script: ['sh', '-c', script]
    stand_ins = [
        ('crash', 'error', sh('kill -SEGV $$')),
        ('crash', 'error', sh(f'echo "==1==ERROR: AddressSanitizer: heap-buffer-overflow {needle}" >&2; exit {ASAN_EXIT}')),
        ('crash', 'skip', sh(f'echo "x.cpp:3:5: runtime error: signed integer overflow" >&2; exit 0')),
        ('hang', 'error', sh('sleep 600')),
        ('unnamed', 'error', sh('echo "adgt-data: error: bad data" >&2; exit 1')),
        ('unnamed', 'error', sh(f'echo "error: x.yaml, --set data.train=/x/{needle}: bad data" >&2; exit 1')),
        ('pass', 'error', sh(f'echo "adgt-data: error: {needle}: damaged" >&2; exit 1')),
        ('silent', 'error', sh('exit 0')),
        ('silent', 'skip', sh('mkdir -p out; exit 0')),
        ('pass', 'skip', sh(f'mkdir -p out; echo "/x/{needle}:3: not valid UTF-8" > out/bad_records.txt')),
        ('mismatch', 'skip', sh(f'echo "error: {needle}:3: not valid UTF-8" >&2; exit 1')),
        ('mismatch', 'skip', sh(f'mkdir -p out; printf "/x/{needle}:3: a\\n/x/{needle}:4: b\\n" > out/bad_records.txt')),
    ]
    failures = 0
    for i, (want, expect, argv) in enumerate(stand_ins):
        case = dict(id=f's{i}', **{'class': 'self'}, what=' '.join(argv), argv=argv, expect=expect,
                    needle=needle, bad_min=1, bad_max=1)
        # 2 s for the sleeper; the others have a minute, so load cannot make them hang
        got = run_case(case, {'work_root': d}, timeout=2 if want == 'hang' else 60)
        ok = got['verdict'] == want
        failures += not ok
        print(f"{'ok' if ok else 'FAIL'}: {want:8} <- {got['verdict']:8} {got['why']}  ({argv[-1][:60]})")
    shutil.rmtree(d, ignore_errors=True)
    if failures:
        sys.exit(f'FAIL: {failures} stand-in(s) given the wrong verdict')
    print('ok: every verdict seen')


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--cases', help='the folder fuzz_inputs.py wrote')
    ap.add_argument('--build', help='build folder (apps/adgt-data, apps/adgt-train)')
    ap.add_argument('--data', help='adgt-data (default: BUILD/apps/adgt-data)')
    ap.add_argument('--train', help='adgt-train (default: BUILD/apps/adgt-train; without it those cases are left out)')
    ap.add_argument('--model', help='model config for adgt-train cases (tests/layouts/model.yaml)')
    ap.add_argument('--work', help='scratch folder (default CASES/work)')
    ap.add_argument('--timeout', type=float, default=20.0, help='seconds a case may take (a hang guard)')
    ap.add_argument('-j', '--jobs', type=int, default=2)
    ap.add_argument('--only', help='comma-separated classes to run')
    ap.add_argument('--check', action='store_true', help='exit 1 unless every case passes')
    ap.add_argument('--self-test', action='store_true', help='check the verdicts on stand-in programs')
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not args.cases:
        ap.error('--cases is required')
    data = args.data or os.path.join(args.build, 'apps', 'adgt-data')
    train = args.train or (os.path.join(args.build, 'apps', 'adgt-train') if args.build else None)
    with open(os.path.join(args.cases, 'cases.jsonl')) as f:
        cases = [json.loads(l) for l in f if l.strip()]
    if args.only:
        cases = [c for c in cases if c['class'] in args.only.split(',')]
    needs_train = [c for c in cases if '{train}' in c['argv']]
    if not (train and os.path.exists(train) and args.model):
        cases = [c for c in cases if c not in needs_train]
        print(f'note: {len(needs_train)} adgt-train case(s) left out (no adgt-train or --model)')
    places = dict(data=os.path.abspath(data), train=os.path.abspath(train or ''), root=os.path.abspath(args.cases),
                  model=os.path.abspath(args.model or ''),
                  work_root=os.path.abspath(args.work or os.path.join(args.cases, 'work')))
    results = run_all(cases, places, args.timeout, args.jobs)
    bad = report(results, os.path.join(places['work_root'], 'results.jsonl'))
    if args.check and bad:
        sys.exit(f'FAIL: {len(bad)} of {len(results)} damaged inputs not handled as expected')


if __name__ == '__main__':
    main()
