#!/usr/bin/env python3
"""The module import graph of the workspace's crates, drawn from their source.

For each crate it walks the module tree from src/lib.rs (or src/main.rs),
following `mod x;` declarations and leaving out test-only code
(`#[cfg(test)]` modules and items), and collects every path that names a
module of the same crate: `use crate::…`, `crate::x::…` in code, `super::…`,
`self::…`, and child modules named directly. An edge A -> B means module A
names something in module B.

Modules are grouped into *units*: the module paths listed for the crate in
layers.toml (a module belongs to the longest listed path that prefixes it),
or, for a crate not listed there, its top-level modules. It prints, per crate:

- the strongly connected components of the unit graph with more than one
  unit (circles: each unit in one reaches every other), and
- a layer table: for a listed crate, its layers from layers.toml (bottom
  first) with each unit's imports, marking every edge that goes up a layer
  and every allowed exception; for an unlisted one, layers computed from the
  graph (a unit's layer is one above the highest it uses).

`--check` exits 1 if any listed crate has an upward edge or a circle that
layers.toml does not allow, or an allowance that no longer matches an edge.
The same rules are enforced by `cargo test -p infermesh-tests --test layers`
(tests/tests/layers.rs); this script is the readable picture of them.

Usage: scripts/import-graph.py [--check] [--edges] [CRATE_DIR ...]
"""

import argparse
import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOKEN = re.compile(
    r"""(?P<ident>r\#[A-Za-z_]\w*|[A-Za-z_]\w*)
      | (?P<path>::)
      | (?P<punct>[{}()\[\];,\#!*<>=&'.:+\-/|?@^%$~])
      | (?P<space>\s+)
      | (?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)


def strip(src):
    """Source with comments, strings and char literals blanked out."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
        elif m := re.match(r'b?r(#*)"', src[i:]):
            end = '"' + m.group(1)
            j = src.find(end, i + m.end())
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"' or src.startswith('b"', i):
            i += 1 if c == '"' else 2
            while i < n and src[i] != '"':
                i += 2 if src[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" or src.startswith("b'", i):
            # A char literal ('a', '\n', '\u{1F}') or a lifetime ('a).
            k = i + (1 if c == "'" else 2)
            m = re.match(r"(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", src[k:])
            if m:
                i = k + m.end()
                out.append("' '")
            else:
                out.append(c)
                i += 1
        else:
            # Copy up to the next character that could start one of the above.
            m = re.compile(r"""[^/"'br]+|.""", re.DOTALL).match(src, i)
            piece = m.group(0)
            if piece in ("b", "r"):
                # An identifier continuing (e.g. `sub`, `for`): copy it whole.
                m2 = re.compile(r"\w+").match(src, i)
                piece = m2.group(0)
            out.append(piece)
            i += len(piece)
    return "".join(out)


def tokens(text):
    for m in TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "space":
            continue
        yield m.group(0)


def is_test_cfg(attr):
    a = attr.replace(" ", "")
    return a.startswith("cfg(") and re.search(r"\btest\b", a) and "not(test)" not in a


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of names from the crate root
        self.file = file
        self.children = {}  # name -> Module
        self.refs = []  # paths written in this module, as lists of segments
        self.exports = {}  # crate root only: name imported -> module it comes from


def child_file(parent_file, is_dir_owner, name):
    """The file of `mod name;` declared in parent_file (`#[path]` is not used in the workspace)."""
    base = os.path.dirname(parent_file)
    if not is_dir_owner:
        base = os.path.join(base, os.path.splitext(os.path.basename(parent_file))[0])
    for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
        if os.path.exists(cand):
            return cand
    return None


def parse_use_tree(toks, i, prefix, out):
    """Parses a use tree at toks[i]; appends full paths to out; returns the index after it."""
    segs = list(prefix)
    while i < len(toks):
        t = toks[i]
        if t == "{":
            i += 1
            while toks[i] != "}":
                i = parse_use_tree(toks, i, segs, out)
                if toks[i] == ",":
                    i += 1
            return i + 1
        if t == "*":
            out.append(segs)
            return i + 1
        if t == "::":
            i += 1
            continue
        if t == "self" and segs:
            out.append(segs)
            i += 1
            if i < len(toks) and toks[i] == "as":
                i += 2
            return i
        if re.match(r"\w", t):
            segs = segs + [t]
            i += 1
            if i < len(toks) and toks[i] == "as":
                i += 2
            if i < len(toks) and toks[i] == "::":
                continue
            out.append(segs)
            return i
        return i
    return i


def load_module(mod, krate_modules):
    """Reads mod.file, records its refs, and recurses into child modules."""
    src = open(mod.file, encoding="utf-8").read()
    toks = list(tokens(strip(src)))
    owner = os.path.basename(mod.file) in ("lib.rs", "main.rs", "mod.rs")
    krate_modules[mod.path] = mod
    # Stack of (module path, brace depth at which it closes) for inline modules.
    scope = [(mod, -1)]
    depth = 0
    attrs = []
    i = 0
    n = len(toks)

    def skip_item(j):
        """Index after the item starting at toks[j] (ends at `;` or a closed `{}` block)."""
        d = 0
        while j < n:
            t = toks[j]
            if t in "([":
                d += 1
            elif t in ")]":
                d -= 1
            elif t == ";" and d == 0:
                return j + 1
            elif t == "{" and d == 0:
                b = 1
                j += 1
                while j < n and b:
                    b += {"{": 1, "}": -1}.get(toks[j], 0)
                    j += 1
                return j
            j += 1
        return j

    while i < n:
        t = toks[i]
        cur = scope[-1][0]
        if t == "#" and i + 1 < n and toks[i + 1] in ("[", "!"):
            j = i + 1 + (toks[i + 1] == "!")
            b, k = 0, j
            while k < n:
                b += {"[": 1, "]": -1}.get(toks[k], 0)
                k += 1
                if b == 0:
                    break
            attr = " ".join(toks[j + 1 : k - 1])
            if toks[i + 1] == "!" and is_test_cfg(attr) and cur is mod and depth == 0:
                return  # the whole file is test-only
            if toks[i + 1] == "[":
                attrs.append(attr)
            i = k
            continue
        if attrs:
            test_only = any(is_test_cfg(a) for a in attrs)
            attrs = []
            if test_only:
                i = skip_item(i)
                continue
        if t == "mod" and i + 2 < n and re.match(r"\w", toks[i + 1]) and toks[i + 2] in (";", "{"):
            name = toks[i + 1]
            child_path = cur.path + (name,)
            if toks[i + 2] == ";":
                f = child_file(mod.file, owner or cur is not mod, name)
                child = Module(child_path, f)
                cur.children[name] = child
                if f:
                    load_module(child, krate_modules)
            else:
                child = Module(child_path, mod.file)
                cur.children[name] = child
                krate_modules[child_path] = child
                depth += 1
                scope.append((child, depth))
            i += 3
            continue
        if t == "{":
            depth += 1
        elif t == "}":
            if scope[-1][1] == depth:
                scope.pop()
            depth -= 1
        elif t == "use":
            out = []
            j = parse_use_tree(toks, i + 1, [], out)
            for segs in out:
                # In a `use`, a path not starting with crate/self/super starts
                # with another crate or with a child module (a "bare" path).
                cur.refs.append(segs if segs[0] in ("crate", "self", "super") else ["<bare>"] + segs)
            i = j
            continue
        elif t in ("crate", "super", "self") and i + 1 < n and toks[i + 1] == "::":
            if i > 0 and toks[i - 1] in ("::", "$"):
                i += 1
                continue
            segs = [t]
            j = i + 1
            while j + 1 < n and toks[j] == "::" and re.match(r"\w", toks[j + 1]):
                segs.append(toks[j + 1])
                j += 2
            cur.refs.append(segs)
            i = j
            continue
        elif re.match(r"[A-Za-z_]", t) and i + 1 < n and toks[i + 1] == "::" and (i == 0 or toks[i - 1] != "::"):
            # A bare path; it names a module of this crate only if its first
            # segment is a child module (checked when resolving).
            segs = [t]
            j = i + 1
            while j + 1 < n and toks[j] == "::" and re.match(r"\w", toks[j + 1]):
                segs.append(toks[j + 1])
                j += 2
            cur.refs.append(["<bare>"] + segs)
            i = j
            continue
        i += 1


def resolve(modules, at, segs):
    """The module a path written in module `at` names, or None (another crate, a local)."""
    if not segs:
        return None
    if segs[0] == "<bare>":
        segs = segs[1:]
        m = modules[at]
        if segs[0] not in m.children:
            return None
        base = list(at)
    elif segs[0] == "crate":
        base, segs = [], segs[1:]
    else:
        base = list(at)
        while segs and segs[0] in ("self", "super"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    full = base + list(segs)
    # Longest prefix that is a module.
    for k in range(len(full), -1, -1):
        if tuple(full[:k]) in modules:
            target = tuple(full[:k])
            # A name re-exported by the crate root stands for the module it comes from.
            if target == () and k < len(full):
                re_export = modules[()].exports.get(full[k])
                if re_export is not None:
                    return re_export
            return target
    return None


def crate_graph(crate_dir):
    src = os.path.join(crate_dir, "src")
    root_file = os.path.join(src, "lib.rs")
    if not os.path.exists(root_file):
        root_file = os.path.join(src, "main.rs")
    modules = {}
    root = Module((), root_file)
    load_module(root, modules)
    # The crate root's imports (`pub use x::Y`): `crate::Y` means module x.
    for segs in root.refs:
        t = resolve(modules, (), segs)
        if t:
            root.exports[segs[-1]] = t
    edges = set()
    for path, m in modules.items():
        for segs in m.refs:
            t = resolve(modules, path, segs)
            if t is not None and t != path:
                edges.add((path, t))
    return modules, edges


def unit_of(path, units):
    best = None
    for u in units:
        if path[: len(u)] == u and (best is None or len(u) > len(best)):
            best = u
    return best


def name(path):
    return "::".join(path) if path else "(root)"


def sccs(nodes, succ):
    """Tarjan's strongly connected components."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(succ.get(v, ())):
            if w not in index:
                visit(w)
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def parse_unit(s):
    return tuple(s.split("::")) if s else ()


def parse_edge(s):
    a, b = (x.strip() for x in s.split("->"))
    return parse_unit(a), parse_unit(b)


def report(crate, spec, show_edges):
    """Prints the crate's graph; returns the list of problems (for --check)."""
    modules, edges = crate_graph(os.path.join(ROOT, crate))
    problems = []
    if spec:
        layers = [(l["name"], [parse_unit(u) for u in l["modules"]]) for l in spec["layer"]]
        units = [u for _, us in layers for u in us]
        layer_of = {u: k for k, (_, us) in enumerate(layers) for u in us}
        allow = {parse_edge(e) for e in spec.get("allow", [])}
    else:
        units = sorted({p[:1] for p in modules if p})
        layer_of = None
        allow = set()
    units_set = set(units)
    uedges = set()
    for a, b in edges:
        ua, ub = unit_of(a, units_set), unit_of(b, units_set)
        if a == ():
            continue  # the crate root only declares and re-exports
        if ua is None or ub is None:
            for p, u in ((a, ua), (b, ub)):
                if u is None and p != ():
                    problems.append(f"{crate}: module {name(p)} is in no layer of layers.toml")
            continue
        if ua != ub:
            uedges.add((ua, ub))
    for p in modules:
        if p and unit_of(p, units_set) is None:
            msg = f"{crate}: module {name(p)} is in no layer of layers.toml"
            if msg not in problems:
                problems.append(msg)
    succ = {}
    for a, b in uedges:
        succ.setdefault(a, set()).add(b)
    comps = [c for c in sccs(units_set, succ) if len(c) > 1]
    # The rules (as tests/tests/layers.rs checks them): allowed edges aside,
    # no edge goes up a layer and no edges form a circle.
    checked = {}
    for a, b in uedges:
        if (a, b) not in allow:
            checked.setdefault(a, set()).add(b)
    bad_circles = [set(c) for c in sccs(units_set, checked) if len(c) > 1]

    print(f"## {crate}  ({len(modules)} modules, {len(units_set)} units, {len(uedges)} edges between units)")
    print()
    if comps:
        print("Circles (strongly connected components):")
        for c in comps:
            print("  - " + ", ".join(name(u) for u in c))
    else:
        print("Circles: none")
    print()

    if layer_of is None:
        # Layers from the graph: a unit sits one above the highest unit it uses
        # (the units of a circle share a layer).
        comp_of = {}
        for c in sccs(units_set, succ):
            for u in c:
                comp_of[u] = tuple(c)
        level = {}

        def lv(c):
            if c not in level:
                level[c] = 0
                deps = {comp_of[w] for u in c for w in succ.get(u, ()) if comp_of[w] != c}
                level[c] = 1 + max((lv(d) for d in deps), default=-1)
            return level[c]

        by_level = {}
        for c in set(comp_of.values()):
            by_level.setdefault(lv(c), []).extend(c)
        layers = [(f"{k}", sorted(by_level[k])) for k in sorted(by_level)]
        layer_of = {u: k for k, (_, us) in enumerate(layers) for u in us}

    print("| layer | module | uses |")
    print("|---|---|---|")
    for k, (lname, us) in enumerate(layers):
        for u in us:
            deps = []
            for w in sorted(succ.get(u, ())):
                up = layer_of.get(w, -1) > k
                circle = any(u in c and w in c for c in bad_circles)
                mark = ""
                if (u, w) in allow:
                    mark = " (allowed)"
                elif up or circle:
                    mark = " **UP**" if up else " **CIRCLE**"
                    what = "uses a module of a higher layer" if up else "closes a circle"
                    problems.append(f"{crate}: {name(u)} -> {name(w)}: {what}")
                deps.append(name(w) + mark)
            print(f"| {k + 1}. {lname} | {name(u)} | {', '.join(deps)} |")
    print()
    for a, b in sorted(allow):
        if (a, b) not in uedges:
            problems.append(f"{crate}: allowance {name(a)} -> {name(b)} matches no import any more; remove it")
    if show_edges:
        print("Module edges:")
        for a, b in sorted(edges):
            print(f"  {name(a)} -> {name(b)}")
        print()
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 on a violation of layers.toml")
    ap.add_argument("--edges", action="store_true", help="also list module-level edges")
    ap.add_argument("crates", nargs="*", help="crate directories (default: those in layers.toml)")
    args = ap.parse_args()
    with open(os.path.join(ROOT, "layers.toml"), "rb") as f:
        spec = tomllib.load(f).get("crate", {})
    crates = args.crates or list(spec)
    problems = []
    for c in crates:
        problems += report(c.rstrip("/"), spec.get(c.rstrip("/")), args.edges)
    if problems:
        print("Problems:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        if args.check:
            sys.exit(1)


if __name__ == "__main__":
    main()
