#!/usr/bin/env python3
"""Writes model/unicode_table.h: the code point classes the byte-level BPE pre-tokenizers
split on (\\p{L} letters, \\p{N} numbers, \\s white space), as sorted ranges, the
general categories some of them name (\\p{Lu}, \\p{Ll}, \\p{Lt}, \\p{Lm}, \\p{Lo},
\\p{M}, \\p{P}, \\p{S}), and the
data of NFC normalization (canonical combining classes, canonical decompositions,
primary composites), which Qwen's tokenizers apply first, and the full case mappings
with the Cased and Case_Ignorable properties that the Jinja engine's upper, lower, title
and capitalize follow (as Python's str methods do).

Input: Debian's unicode-data package (UnicodeData.txt for the general categories,
combining classes and decompositions, PropList.txt for White_Space,
DerivedNormalizationProps.txt for Full_Composition_Exclusion, SpecialCasing.txt for the
unconditional full case mappings, DerivedCoreProperties.txt for Cased and
Case_Ignorable). Run from the repository
root after `apt-get install unicode-data`; the generated header is committed so the
build does not need the package.
    scripts/gen-unicode-table.py [/usr/share/unicode] > model/unicode_table.h
"""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/unicode"
OTHER, LETTER, NUMBER, SPACE = 0, 1, 2, 3
cls = {}
GC = {"Lu": 1, "Ll": 2, "Lt": 3, "Lm": 4, "Lo": 5, "M": 6, "N": 7, "P": 8, "S": 9}
gc = {}
ccc = {}
decomp = {}
case = {}   # cp -> [lower, upper, title], each a list of code points

# UnicodeData.txt: "code;name;category;...", with "<X, First>" / "<X, Last>" pairs for ranges.
first = None
with open(os.path.join(root, "UnicodeData.txt"), encoding="utf-8") as f:
    for line in f:
        fields = line.split(";")
        cp, name, cat = int(fields[0], 16), fields[1], fields[2]
        for k, col in ((0, 13), (1, 12), (2, 14)):   # lower, upper, title
            if fields[col].strip():
                case.setdefault(cp, [[cp], [cp], [cp]])[k] = [int(fields[col], 16)]
        if int(fields[3]):
            ccc[cp] = int(fields[3])
        if fields[5] and not fields[5].startswith("<"):
            decomp[cp] = [int(x, 16) for x in fields[5].split()]
        c = LETTER if cat[0] == "L" else NUMBER if cat[0] == "N" else OTHER
        if name.endswith(", First>"):
            first = cp
            continue
        lo = first if name.endswith(", Last>") else cp
        first = None
        g = GC.get(cat, GC.get(cat[0], 0))
        if g:
            for x in range(lo, cp + 1):
                gc[x] = g
        if c != OTHER:
            for x in range(lo, cp + 1):
                cls[x] = c

def property_cps(name, props):
    """(code point, property) for every code point a property file gives one of props:
    lines like "0009..000D    ; White_Space # ..."."""
    with open(os.path.join(root, name), encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line:
                continue
            parts = [x.strip() for x in line.split(";")]
            if parts[1] not in props:
                continue
            lo, _, hi = parts[0].partition("..")
            for x in range(int(lo, 16), int(hi or lo, 16) + 1):
                yield x, parts[1]


for x, _ in property_cps("PropList.txt", ("White_Space",)):
    assert cls.get(x, OTHER) == OTHER, hex(x)
    cls[x] = SPACE

excluded = set(x for x, _ in property_cps("DerivedNormalizationProps.txt",
                                          ("Full_Composition_Exclusion",)))
compose = sorted((d[0], d[1], cp) for cp, d in decomp.items()
                 if len(d) == 2 and cp not in excluded)

# SpecialCasing.txt: "code; lower; title; upper; (condition;)? # comment"; the lines
# without a condition are the full mappings.
with open(os.path.join(root, "SpecialCasing.txt"), encoding="utf-8") as f:
    for line in f:
        line = line.split("#")[0].strip()
        if not line:
            continue
        parts = [x.strip() for x in line.split(";")]
        if parts[4]:
            continue
        cp = int(parts[0], 16)
        m = case.setdefault(cp, [[cp], [cp], [cp]])
        for k, col in ((0, 1), (1, 3), (2, 2)):
            m[k] = [int(x, 16) for x in parts[col].split()]
# A code point with only an upper or a lower simple mapping has its title the same as
# its upper (UnicodeData leaves the title field empty then).
with open(os.path.join(root, "UnicodeData.txt"), encoding="utf-8") as f:
    for line in f:
        fields = line.split(";")
        cp = int(fields[0], 16)
        if cp in case and not fields[14].strip() and fields[12].strip():
            if case[cp][2] == [cp]:
                case[cp][2] = case[cp][1]
for cp, m in case.items():
    assert all(1 <= len(x) <= 3 for x in m), hex(cp)

CASED, CASE_IGNORABLE = 1, 2
caseprop = {}
for x, prop in property_cps("DerivedCoreProperties.txt", ("Cased", "Case_Ignorable")):
    caseprop[x] = caseprop.get(x, 0) | (CASED if prop == "Cased" else CASE_IGNORABLE)

def range_table(values):
    """Sorted [lo, hi, value] runs of equal values over consecutive code points."""
    runs = []
    for cp in sorted(values):
        if runs and runs[-1][1] == cp - 1 and runs[-1][2] == values[cp]:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp, values[cp]])
    return runs


def write_ranges(out, name, runs):
    out.write("static const struct unicode_range %s[%d] = {\n" % (name, len(runs)))
    for lo, hi, v in runs:
        out.write("    {0x%04X, 0x%04X, %d},\n" % (lo, hi, v))
    out.write("};\n")


version = "Unicode version unknown"
readme = os.path.join(root, "ReadMe.txt")
if os.path.exists(readme):
    m = re.search(r"Unicode(\d+\.\d+\.\d+)", open(readme, encoding="utf-8", errors="replace").read())
    if m:
        version = "Unicode " + m.group(1)

out = sys.stdout
out.write("/* Generated by scripts/gen-unicode-table.py from Debian's unicode-data\n")
out.write(" * (%s). Do not edit. */\n" % version)
out.write("struct unicode_range { unsigned lo, hi; unsigned char v; };\n")
out.write("/* Code point ranges that are letters (1, \\p{L}), numbers (2, \\p{N}) or\n")
out.write(" * white space (3, White_Space); every other code point is class 0. Sorted. */\n")
write_ranges(out, "unicode_ranges", range_table(cls))
out.write("/* General categories as ranges: Lu 1, Ll 2, Lt 3, Lm 4, Lo 5, M* 6, N* 7, P* 8,\n")
out.write(" * S* 9; every other code point (Z*, C*, unassigned) is 0. Sorted. */\n")
write_ranges(out, "unicode_gc", range_table(gc))
out.write("/* Canonical combining classes other than 0, as ranges. Sorted. */\n")
write_ranges(out, "unicode_ccc", range_table(ccc))
out.write("/* Canonical decompositions, one level (b = 0: a singleton). Sorted by cp. */\n")
out.write("static const struct { unsigned cp, a, b; } unicode_decomp[%d] = {\n" % len(decomp))
for cp in sorted(decomp):
    d = decomp[cp] + [0]
    out.write("    {0x%04X, 0x%04X, 0x%04X},\n" % (cp, d[0], d[1]))
out.write("};\n")
out.write("/* Primary composites: a + b -> cp (Full_Composition_Exclusion left out).\n")
out.write(" * Sorted by (a, b). */\n")
out.write("static const struct { unsigned a, b, cp; } unicode_compose[%d] = {\n" % len(compose))
for a, b, cp in compose:
    out.write("    {0x%04X, 0x%04X, 0x%04X},\n" % (a, b, cp))
out.write("};\n")
out.write("/* Case properties as ranges: Cased 1, Case_Ignorable 2 (both 3). Sorted. */\n")
write_ranges(out, "unicode_caseprop", range_table(caseprop))
out.write("/* Full case mappings (lower, upper, title; up to 3 code points each, 0 after the\n")
out.write(" * last) of every code point that has one. Sorted by cp. */\n")
out.write("static const struct { unsigned cp, m[3][3]; } unicode_case[%d] = {\n" % len(case))
for cp in sorted(case):
    ms = ["{" + ", ".join("0x%04X" % x for x in (m + [0, 0])[:3]) + "}" for m in case[cp]]
    out.write("    {0x%04X, {%s}},\n" % (cp, ", ".join(ms)))
out.write("};\n")
