#!/usr/bin/env python3
"""import-cycles.py [--strict] CRATE_SRC_DIR

Builds the file-level import graph of one crate from its `crate::…`, `super::…` and `self::…`
paths (in `use` lines, `pub use` re-exports and inline paths; comments and `#[cfg(test)] mod
tests` blocks are skipped; `mod x;` declarations are not edges) and prints every cycle between
files. With --strict it exits 1 when there is one. Run by .ci/run for every crate."""
import os, re, sys
strict = "--strict" in sys.argv
root = [a for a in sys.argv[1:] if a != "--strict"][0].rstrip('/')
def modpath(f):
    rel = os.path.relpath(f, root)[:-3].split('/')
    if rel[-1] in ('mod', 'lib', 'main'): rel = rel[:-1]
    return tuple(rel)
files = {}
for dp, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'): files[modpath(os.path.join(dp, f))] = os.path.join(dp, f)
def resolve(cur, path, is_modfile):
    parts = path.split('::')
    base = list(cur) if is_modfile else list(cur[:-1]) if cur else []
    if parts[0] == 'crate': base, parts = [], parts[1:]
    elif parts[0] == 'self': base = list(cur); parts = parts[1:]
    while parts and parts[0] == 'super':
        base = base[:-1]; parts = parts[1:]
    if not (parts or base): return None
    # longest prefix that is a file
    cand = base + parts
    for n in range(len(cand), 0, -1):
        if tuple(cand[:n]) in files: return tuple(cand[:n])
    return None
edges = {}
for m, f in files.items():
    src = open(f).read()
    src = re.split(r'#\[cfg\(test\)\]\s*mod tests\s*\{', src)[0]
    is_modfile = os.path.basename(f) in ('mod.rs', 'lib.rs', 'main.rs')
    deps = set()
    for line in src.split('\n'):
        s = line.strip()
        if s.startswith('//'): continue
        for p in re.findall(r'\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)', s):
            t = resolve(m, p, is_modfile)
            if t and t != m and not (is_modfile and t[:len(m)] == m and False): deps.add(t)
    edges[m] = deps
# Tarjan SCC
index, low, st, on, res, c = {}, {}, [], set(), [], [0]
def sc(v):
    index[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in index: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: res.append(comp)
sys.setrecursionlimit(10000)
for v in list(edges):
    if v not in index: sc(v)
name = lambda t: '/'.join(t) or '<root>'
if not res: print(f'{root}: no import cycles between files')
for comp in res:
    print(f'{root}: cycle among', ', '.join(sorted(name(x) for x in comp)))
    for a in comp:
        for b in edges[a]:
            if b in comp: print('   ', name(a), '->', name(b))
if strict and res:
    sys.exit(1)
