#!/usr/bin/env python3
"""import-cycles.py [--strict] [--edges] CRATE_SRC_DIR

Builds the file-level import graph of one crate and prints every cycle between files. With --strict
it exits 1 when there is one; --edges also prints every edge with the path that made it. Run by
.ci/run for every crate.

Edges come from every `use` declaration (grouped trees such as `use crate::aub::{capture::X,
reader::{Y, Z}}` and `as` renames included) and from inline paths that start with `crate::`,
`super::` or `self::`. A path is resolved segment by segment, the way rustc does: a segment that
names a module file descends into it; one that names an item defined in the current file ends
there; one that the current module imports (`use`, `pub use`, globs) is followed to where that
import leads, so `crate::Engine` or `super::AubReader` land on the file that defines the item, not
on the `lib.rs`/`mod.rs` that re-exports it. `super` is the parent of the file's own module (for
`aub/reader.rs`, `aub`), whether the file is a `mod.rs` or not. Not edges: `mod x;`
declarations, a module's `pub use` of its own descendants (a facade), paths in comments and
strings, `#[cfg(test)] mod … { … }` blocks and the files of `#[cfg(test)] mod …;`, and paths into
other crates."""
import os, re, sys

args = [a for a in sys.argv[1:] if not a.startswith('--')]
strict, show_edges = '--strict' in sys.argv, '--edges' in sys.argv
root = args[0].rstrip('/')
IDENT = r'[A-Za-z_][A-Za-z0-9_]*'


def modpath(f):
    rel = os.path.relpath(f, root)[:-3].split('/')
    if rel[-1] in ('mod', 'lib', 'main'):
        rel = rel[:-1]
    return tuple(rel)


def strip(src):
    """The code of a file with comments, string and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            i = n if j < 0 else j
        elif src.startswith('/*', i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith('/*', i): depth, i = depth + 1, i + 2
                elif src.startswith('*/', i): depth, i = depth - 1, i + 2
                else:
                    if src[i] == '\n': out.append('\n')
                    i += 1
        elif (m := re.match(r'b?r(#*)"', src[i:i + 300])) and (i == 0 or not re.match(r'\w', src[i - 1])):
            end = '"' + m.group(1)
            j = src.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + '\n' * src.count('\n', i, j)); i = j
        elif c == '"' or (c == 'b' and src.startswith('b"', i) and (i == 0 or not re.match(r'\w', src[i - 1]))):
            i += 1 if c == '"' else 2
            start = i
            while i < n and src[i] != '"':
                i += 2 if src[i] == '\\' else 1
            out.append('""' + '\n' * src.count('\n', start, i)); i += 1
        elif c == "'" and (m := re.match(r"'(?:\\[^']{1,10}|[^\\'\n])'", src[i:i + 14])):
            out.append("' '"); i += m.end()
        else:
            out.append(c); i += 1
    return ''.join(out)


def drop_test_mods(code):
    """Blanks `#[cfg(test)] mod name { … }` blocks (balanced braces; literals are already gone)."""
    while m := re.search(r'#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+' + IDENT + r'\s*\{', code):
        depth, i = 1, m.end()
        while i < len(code) and depth:
            depth += {'{': 1, '}': -1}.get(code[i], 0); i += 1
        code = code[:m.start()] + '\n' * code.count('\n', m.start(), i) + code[i:]
    return code


def split_top(s):
    """Splits on commas outside braces."""
    parts, depth, cur = [], 0, ''
    for ch in s:
        if ch == ',' and depth == 0:
            parts.append(cur); cur = ''
            continue
        depth += {'{': 1, '}': -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def expand(tree, prefix=()):
    """`a::{b, c::{d as e, self}, f::*}` → [(path, bound name or None)]."""
    tree = re.sub(r'\s+', ' ', tree).strip()
    if tree.startswith('::'):  # an extern crate, written absolute
        return []
    b = tree.find('{')
    if b >= 0:
        head = [p.strip() for p in tree[:b].split('::') if p.strip()]
        inner = tree[b + 1:tree.rfind('}')]
        return [r for part in split_top(inner) for r in expand(part, prefix + tuple(head))]
    alias = None
    if ' as ' in tree:
        tree, alias = [x.strip() for x in tree.split(' as ', 1)]
    segs = prefix + tuple(p.strip() for p in tree.split('::') if p.strip())
    if segs and segs[-1] == 'self':
        segs = segs[:-1]
    if not segs:
        return []
    name = None if segs[-1] == '*' else (alias or segs[-1])
    return [(segs, name)]


files, info = {}, {}
for dp, _, fs in os.walk(root):
    for f in fs:
        if f.endswith('.rs'):
            files[modpath(os.path.join(dp, f))] = os.path.join(dp, f)

# Files that only tests compile (`#[cfg(test)] mod tests;`), with their descendants, are left out.
codes = {m: strip(open(f).read()) for m, f in files.items()}
test_only = {m + (t,) for m, code in codes.items() for t in re.findall(
    r'#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(' + IDENT + r')\s*;', code)}
files = {m: f for m, f in files.items() if not any(m[:len(t)] == t for t in test_only)}

USE = re.compile(r'\b(pub(?:\s*\([^)]*\))?\s+)?use\s+([^;]+);')
for m, f in files.items():
    code = drop_test_mods(codes[m])
    code = re.sub(r'pub\s*\(\s*in\s+[^)]*\)', 'pub', code)
    uses = []  # (segs, bound name, is pub, text)
    for u in USE.finditer(code):
        for segs, name in expand(u.group(2)):
            uses.append((segs, name, bool(u.group(1)), 'use ' + '::'.join(segs)))
    rest = USE.sub(lambda u: '\n' * u.group(0).count('\n'), code)
    defs = set(re.findall(r'\b(?:fn|struct|enum|union|trait|type|const|static|mod)\s+(' + IDENT + ')', rest))
    defs |= set(re.findall(r'macro_rules!\s*(' + IDENT + ')', rest))
    info[m] = dict(code=rest, uses=uses, defs=defs)


def children(mod):
    return {k[-1] for k in files if len(k) == len(mod) + 1 and k[:len(mod)] == mod}


def start(mod, segs):
    """(module the path starts in, remaining segments), or None for a path into another crate."""
    segs = list(segs)
    if segs[0] == 'crate':
        base, segs = (), segs[1:]
    elif segs[0] in ('self', 'super'):
        base = mod
        if segs[0] == 'self':
            segs = segs[1:]
        while segs and segs[0] == 'super':
            base, segs = base[:-1], segs[1:]
    elif segs[0] in children(mod) or any(name == segs[0] for _, name, _, _ in info[mod]['uses']):
        base = mod  # a child module, or a name imported here (2018 paths are relative)
    else:
        return None
    return base, segs


def resolve(mod, segs, seen=frozenset()):
    """Files a path used in module `mod` leads to."""
    s = start(mod, segs)
    if s is None:
        return set()
    base, segs = s
    return walk(base, segs, seen)


def walk(mod, segs, seen):
    while segs and mod + (segs[0],) in files:
        mod, segs = mod + (segs[0],), segs[1:]
    if not segs or mod not in files:
        return {mod} if mod in files else set()
    name, key = segs[0], (mod, segs[0])
    if name in info[mod]['defs'] or key in seen:
        return {mod}
    seen = seen | {key}
    out = set()
    for usegs, bound, _, _ in info[mod]['uses']:
        if bound == name:
            out |= resolve(mod, usegs + tuple(segs[1:]), seen)
    if not out:  # through glob imports
        for usegs, bound, _, _ in info[mod]['uses']:
            if bound is None and (st := start(mod, usegs[:-1])):
                out |= walk(st[0], st[1] + list(segs), seen)
    return out or {mod}


def is_facade(mod, segs, is_pub):
    """A `pub use` of the module's own descendants."""
    s = start(mod, segs)
    return is_pub and s is not None and s[0][:len(mod)] == mod and (len(s[0]) > len(mod) or (
        s[1] and s[0] + (s[1][0],) in files))


edges = {}
for m in files:
    deps = {}
    def add(targets, why):
        for t in targets:
            if t != m:
                deps.setdefault(t, why)
    for segs, _, is_pub, text in info[m]['uses']:
        if not is_facade(m, segs, is_pub):
            add(resolve(m, segs), text)
    for p in re.findall(r'(?<![\w:])((?:crate|super|self)(?:::' + IDENT + r')+)', info[m]['code']):
        add(resolve(m, p.split('::')), p)
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
for v in sorted(edges):
    if v not in index: sc(v)
name = lambda t: '/'.join(t) or '<root>'
if show_edges:
    for a in sorted(edges):
        for b in sorted(edges[a]):
            print(f'  {name(a)} -> {name(b)}   ({edges[a][b]})')
if not res: print(f'{root}: no import cycles between files')
for comp in res:
    print(f'{root}: cycle among', ', '.join(sorted(name(x) for x in comp)))
    for a in sorted(comp):
        for b in sorted(edges[a]):
            if b in comp: print('   ', name(a), '->', name(b), f'  ({edges[a][b]})')
if strict and res:
    sys.exit(1)
