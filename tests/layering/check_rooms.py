#!/usr/bin/env python3
"""The rooms of parallel/ and the layers of the tree, checked against the build.

Each folder of parallel/ is one room and one static library (adgt_<room>,
declared in the folder's CMakeLists.txt). The drawing is the libraries'
target_link_libraries: a room may include headers of itself and of the rooms
its library links, directly or through them. This script fails when

  - a file lies at the top of parallel/ (the top holds CMakeLists.txt and
    README.md alone), or a room has no library of its own;
  - the rooms' links form a cycle;
  - a file includes a room its room does not reach by links (file:line);
  - core/ or kernels/ include parallel/, or core/ includes apps/ (layers
    point down: apps -> parallel -> core -> kernels).

  check_rooms.py ROOT           check the tree at ROOT (exit 1 on a violation)
  check_rooms.py --self-test    check that each rule above catches a planted
                                violation in a small made-up tree
"""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"((?:parallel|core|kernels|apps)/[^"]+)"')
SOURCES = ('.cpp', '.hpp', '.cu', '.cuh', '.h')
TOP_ALLOWED = {'CMakeLists.txt', 'README.md'}


def strip_comments(text):
    return re.sub(r'#[^\n]*', '', text)


def room_links(root):
    """{room: set of rooms its library links}, and problems found on the way."""
    par = os.path.join(root, 'parallel')
    rooms = sorted(d for d in os.listdir(par) if os.path.isdir(os.path.join(par, d)))
    links, problems = {}, []
    for r in rooms:
        cm = os.path.join(par, r, 'CMakeLists.txt')
        if not os.path.isfile(cm):
            problems.append(f'parallel/{r}/: a room without a CMakeLists.txt (one library per room)')
            links[r] = set()
            continue
        text = strip_comments(open(cm, encoding='utf-8').read())
        if not re.search(r'add_library\(\s*adgt_%s\b' % re.escape(r), text):
            problems.append(f'parallel/{r}/CMakeLists.txt: no add_library(adgt_{r} ...)')
        deps = set()
        for m in re.finditer(r'target_link_libraries\(\s*adgt_%s\s+([^)]*)\)' % re.escape(r), text):
            for tok in m.group(1).split():
                if tok.startswith('adgt_') and tok[5:] in rooms:
                    deps.add(tok[5:])
        links[r] = deps
    return rooms, links, problems


def find_cycle(links):
    """One cycle of the link graph as a list of rooms, or None."""
    state, stack = {}, []

    def visit(v):
        state[v] = 1
        stack.append(v)
        for w in sorted(links.get(v, ())):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state:
                c = visit(w)
                if c:
                    return c
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(links):
        if v not in state:
            c = visit(v)
            if c:
                return c
    return None


def reach(links, r):
    seen, todo = set(), [r]
    while todo:
        v = todo.pop()
        for w in links.get(v, ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def source_files(root, top):
    base = os.path.join(root, top)
    for d, dirs, files in os.walk(base):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(SOURCES):
                yield os.path.relpath(os.path.join(d, f), root)


def check(root):
    problems = []
    par = os.path.join(root, 'parallel')
    for f in sorted(os.listdir(par)):
        if os.path.isfile(os.path.join(par, f)) and f not in TOP_ALLOWED:
            problems.append(f'parallel/{f}: a file at the top of parallel/; put it in the room of its concern')
    rooms, links, p = room_links(root)
    problems += p
    cycle = find_cycle(links)
    if cycle:
        problems.append('the rooms link in a cycle: ' + ' -> '.join(cycle))
    reachable = {r: reach(links, r) for r in rooms}
    for top in ('parallel', 'core', 'kernels'):
        for rel in source_files(root, top):
            parts = rel.split('/')
            with open(os.path.join(root, rel), encoding='utf-8', errors='replace') as fh:
                for n, line in enumerate(fh, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    ip = inc.split('/')
                    if top in ('core', 'kernels'):
                        if ip[0] == 'parallel' or ip[0] == 'apps' or (top == 'kernels' and ip[0] == 'core'):
                            problems.append(f'{rel}:{n}: includes {inc}: {top}/ may not include {ip[0]}/ '
                                            '(layers point down: apps -> parallel -> core -> kernels)')
                        continue
                    if ip[0] == 'apps':
                        problems.append(f'{rel}:{n}: includes {inc}: parallel/ may not include apps/')
                        continue
                    if ip[0] != 'parallel' or len(parts) < 3:
                        continue
                    src, dst = parts[1], ip[1] if len(ip) > 2 else None
                    if dst is None:
                        problems.append(f'{rel}:{n}: includes {inc}, a file at the top of parallel/')
                    elif dst != src and dst not in reachable.get(src, ()):
                        problems.append(f'{rel}:{n}: includes {inc}: room {src} does not link room {dst} '
                                        f'(adgt_{src} links {", ".join(sorted(links.get(src, ()))) or "no room"}; '
                                        'move the code down, or link the room if the drawing allows it)')
    return rooms, links, problems


def self_test():
    def tree(files):
        d = tempfile.mkdtemp(prefix='rooms_')
        for path, text in files.items():
            full = os.path.join(d, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, 'w', encoding='utf-8') as fh:
                fh.write(text)
        return d

    good = {
        'parallel/CMakeLists.txt': 'add_subdirectory(a)\nadd_subdirectory(b)\n',
        'parallel/a/CMakeLists.txt': 'add_library(adgt_a STATIC a.cpp)\ntarget_link_libraries(adgt_a PUBLIC adgt_core)\n',
        'parallel/a/a.hpp': '#include "core/x.hpp"\n',
        'parallel/b/CMakeLists.txt': '# links adgt_c in a comment only\nadd_library(adgt_b STATIC b.cpp)\n'
                                     'target_link_libraries(adgt_b PUBLIC adgt_a)\n',
        'parallel/b/b.cpp': '#include "parallel/a/a.hpp"\n#include "parallel/b/b.hpp"\n',
        'core/x.hpp': '#include "kernels/k.hpp"\n',
        'kernels/k.hpp': '',
    }
    cases = {
        'clean tree': ({}, None),
        'upward include': ({'parallel/a/a.cpp': '#include "parallel/b/b.hpp"\n'}, 'room a does not link room b'),
        'cycle': ({'parallel/a/CMakeLists.txt': 'add_library(adgt_a STATIC a.cpp)\n'
                                                'target_link_libraries(adgt_a PUBLIC adgt_b)\n'},
                  'link in a cycle'),
        'file at the top': ({'parallel/loose.cpp': ''}, 'a file at the top of parallel/'),
        'room without a library': ({'parallel/c/c.hpp': ''}, 'a room without a CMakeLists.txt'),
        'core includes parallel': ({'core/y.cpp': '#include "parallel/a/a.hpp"\n'}, 'core/ may not include parallel/'),
        'kernels include core': ({'kernels/z.cu': '#include "core/x.hpp"\n'}, 'kernels/ may not include core/'),
    }
    failed = 0
    for name, (extra, want) in cases.items():
        files = dict(good)
        files.update(extra)
        _, _, problems = check(tree(files))
        ok = (not problems) if want is None else any(want in p for p in problems)
        print(f'{"ok  " if ok else "FAIL"} {name}: {problems or "no problem found"}')
        failed += not ok
    print(f'{len(cases) - failed} passed, {failed} failed')
    return 1 if failed else 0


def main():
    if sys.argv[1:] == ['--self-test']:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    rooms, links, problems = check(sys.argv[1])
    for r in rooms:
        print(f'{r:9s} -> {", ".join(sorted(links[r])) or "-"}')
    for p in problems:
        print('error: ' + p)
    print(f'{len(rooms)} rooms, {len(problems)} problem(s)')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
