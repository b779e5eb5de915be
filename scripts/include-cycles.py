#!/usr/bin/env python3
"""Include circles between the rooms of a tree.

A room is a source file and its header (x.c, x.h) with its private header (x_impl.h); a
room depends on another when one of its files includes the other's header. Prints each
set of rooms that depend on each other in a circle (a strongly connected component of
more than one room), one per line, rooms sorted and separated by spaces. Files under
tests/ and node_modules/ are not rooms. Usage: include-cycles.py [ROOT] (default: .),
reading the file list from git in ROOT."""
import os
import re
import subprocess
import sys

root = sys.argv[1] if len(sys.argv) > 1 else '.'
listed = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard',
                         '*.c', '*.h'], capture_output=True, text=True, cwd=root,
                        check=True).stdout.split()
files = [f for f in listed if '/node_modules/' not in f and not f.startswith('tests/')]


def room(path):
    m = os.path.splitext(os.path.normpath(path))[0]
    return m[:-5] if m.endswith('_impl') else m


rooms = {room(f) for f in files}
edges = {}
include = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
for f in files:
    with open(os.path.join(root, f), encoding='utf-8', errors='replace') as fh:
        text = fh.read()
    for inc in include.findall(text):
        target = room(inc if '/' in inc else os.path.join(os.path.dirname(f), inc))
        if target in rooms and target != room(f):
            edges.setdefault(room(f), set()).add(target)

# Tarjan's strongly connected components, iteratively.
index, low, on, stack, found, counter = {}, {}, set(), [], [], 0
for start in sorted(rooms):
    if start in index:
        continue
    work = [(start, iter(sorted(edges.get(start, ()))))]
    index[start] = low[start] = counter
    counter += 1
    stack.append(start)
    on.add(start)
    while work:
        v, it = work[-1]
        w = next(it, None)
        if w is not None:
            if w not in index:
                index[w] = low[w] = counter
                counter += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(edges.get(w, ())))))
            elif w in on:
                low[v] = min(low[v], index[w])
            continue
        work.pop()
        if work:
            low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))
for comp in sorted(found):
    print(' '.join(comp))
