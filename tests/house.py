#!/usr/bin/env python3
"""The house rules of src/, counted from the source text (docs/architecture.md, "The house").

- No circle: the modules' imports, drawn between siblings at every level (an import of a
  module's own submodule, or of an ancestor, aside), have no cycle. Test modules are left out:
  a test may reach anywhere.
- Long functions: a function body over 100 lines needs a comment line beginning `// Long:`
  (its reason) just above it (above its docs and attributes); at most 3 such functions.
- `unsafe` blocks live in at most 12 files.

Usage: house.py [SRC_DIR] — prints what it found, exits 1 when a rule is broken.
"""
import collections
import os
import re
import sys

MAX_LINES = 100
MAX_LONG = 3
MAX_UNSAFE_FILES = 12


def modules(root):
    mods = {}
    for dp, _, fns in os.walk(root):
        for f in fns:
            if not f.endswith('.rs'):
                continue
            parts = os.path.relpath(os.path.join(dp, f), root)[:-3].split('/')
            if parts[-1] == 'mod':
                parts = parts[:-1]
            if parts == ['lib']:
                parts = []
            mods[tuple(parts)] = os.path.join(dp, f)
    return mods


def is_test(m):
    return any(x in ('tests', 'proptests', 'loom_model') or x.endswith('_tests') for x in m)


def code_of(path):
    s = open(path, encoding='utf-8').read()
    s = re.sub(r'/\*.*?\*/', '', s, flags=re.S)
    s = re.sub(r'//[^\n]*', '', s)
    # an inline test module at the end of a file
    return re.split(r'#\[cfg\(test\)\]\s*mod\s+\w+\s*\{', s)[0]


def use_paths(tree):
    tree = re.sub(r'\s+', '', tree)
    out = []

    def walk(prefix, s):
        depth, cur, items = 0, '', []
        for ch in s:
            depth += ch == '{'
            depth -= ch == '}'
            if ch == ',' and depth == 0:
                items.append(cur)
                cur = ''
            else:
                cur += ch
        items.append(cur)
        for it in filter(None, items):
            if '{' in it:
                i = it.index('{')
                walk(prefix + it[:i], it[i + 1:it.rindex('}')])
            else:
                out.append(prefix + re.sub(r'as\w+$', '', it))
    walk('', tree)
    return out


def circles(root):
    mods = modules(root)
    edges = collections.defaultdict(set)
    for m, f in mods.items():
        if is_test(m):
            continue
        src = code_of(f)
        children = set(re.findall(r'^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', src, re.M))
        paths = [p for u in re.findall(r'\buse\s+([^;]+);', src) for p in use_paths(u)]
        paths += re.findall(r'\b((?:crate|super|self)(?:::\w+)+)', src)
        for p in paths:
            segs = [s for s in p.split("::") if s]
            if not segs:
                continue
            if segs[0] == 'crate':
                cur, segs = [], segs[1:]
            elif segs[0] in ('super', 'self'):
                cur = list(m)
                while segs and segs[0] in ('super', 'self'):
                    if segs[0] == 'super':
                        cur = cur[:-1]
                    segs = segs[1:]
            elif segs[0] in children:
                cur = list(m)
            else:
                continue
            target = tuple(cur)
            for s in segs:
                if target + (s,) not in mods:
                    break
                target += (s,)
            if target != m:
                edges[m].add(target)
    lifted = collections.defaultdict(set)
    why = collections.defaultdict(list)
    for a, bs in edges.items():
        for b in bs:
            i = 0
            while i < min(len(a), len(b)) and a[i] == b[i]:
                i += 1
            if i == len(a) or i == len(b):
                continue  # a module and its own submodule, or an ancestor
            lifted[a[:i + 1]].add(b[:i + 1])
            why[(a[:i + 1], b[:i + 1])].append(f"{'::'.join(a)} -> {'::'.join(b)}")
    index, low, stack, on, found = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(lifted[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
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
    sys.setrecursionlimit(10000)
    for v in sorted(set(lifted) | {b for bs in lifted.values() for b in bs}):
        if v not in index:
            strong(v)
    report = []
    for comp in found:
        report.append('circle: ' + ' , '.join('::'.join(x) for x in comp))
        for a in comp:
            for b in sorted(lifted[a] & set(comp)):
                report.append('    ' + '; '.join(why[(a, b)][:3]))
    return len(found), report


FN = re.compile(r'\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?'
                r'(?:extern\s+"C"\s+)?fn\s+(\w+)')


def long_functions(root):
    found = []
    for m, path in modules(root).items():
        if is_test(m):
            continue
        lines = open(path, encoding='utf-8').read().split('\n')
        for i, line in enumerate(lines):
            f = FN.match(line)
            if not f or line.rstrip().endswith(';'):
                continue
            j = i
            while j < len(lines) and '{' not in lines[j]:
                j += 1
            depth, k = 0, j
            for k in range(j, len(lines)):
                s = re.sub(r'"(\\.|[^"\\])*"', '""', lines[k])
                s = re.sub(r"'(\\.|[^'\\])'", "''", s).split('//')[0]
                depth += s.count('{') - s.count('}')
                if depth <= 0:
                    break
            if k - i + 1 <= MAX_LINES:
                continue
            above = i - 1
            while above >= 0 and re.match(r'\s*(///|#\[|// )', lines[above]) \
                    and not lines[above].strip().startswith('// Long:'):
                above -= 1
            reason = above >= 0 and lines[above].strip().startswith('// Long:')
            found.append((k - i + 1, path, f.group(1), i + 1, reason))
    return sorted(found, reverse=True)


def unsafe_files(root):
    out = []
    for dp, _, fns in os.walk(root):
        for f in fns:
            p = os.path.join(dp, f)
            if f.endswith('.rs') and re.search(r'\bunsafe \{', open(p, encoding='utf-8').read()):
                out.append(p)
    return sorted(out)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', 'src')
    broken = []
    n, report = circles(root)
    print(f'circles between modules: {n}')
    print('\n'.join(report))
    if n:
        broken.append(f'{n} circle(s) between modules')
    longs = long_functions(root)
    print(f'functions over {MAX_LINES} lines: {len(longs)} (at most {MAX_LONG}, each with a `// Long:` reason)')
    for lines, path, name, at, reason in longs:
        print(f'    {lines:4} {path}:{at} {name}' + ('' if reason else '  (no `// Long:` reason)'))
    if len(longs) > MAX_LONG:
        broken.append(f'{len(longs)} functions over {MAX_LINES} lines')
    if any(not r for *_, r in longs):
        broken.append('a function over 100 lines without a `// Long:` reason')
    files = unsafe_files(root)
    print(f'files with unsafe blocks: {len(files)} (at most {MAX_UNSAFE_FILES})')
    for p in files:
        print('    ' + p)
    if len(files) > MAX_UNSAFE_FILES:
        broken.append(f'unsafe blocks in {len(files)} files')
    if broken:
        print('house rules broken: ' + '; '.join(broken))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
