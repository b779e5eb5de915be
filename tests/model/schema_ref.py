#!/usr/bin/env python3
"""Every document decoded under a random schema validates against it, by an independent
validator: Debian's python3-jsonschema (Draft 2020-12). tests/model/schema_docs.c draws
the schemas (seeded) and decodes the documents; this reads its JSON lines, parses each
document with Python's json module and validates it. Fails listing the first bad ones.

    schema_ref.py SCHEMA_DOCS TOKENIZER.bin [--budget] [SEED...]

--budget: the documents are decoded under a length limit (schema_docs --budget): every
one must still be whole and valid."""
import json
import subprocess
import sys

import jsonschema


def main():
    exe, tok = sys.argv[1], sys.argv[2]
    flags = [a for a in sys.argv[3:] if a.startswith("--")]
    seeds = [a for a in sys.argv[3:] if not a.startswith("--")] or ["2", "3"]
    bad, total = [], 0
    for seed in seeds:
        out = subprocess.run([exe, tok, "--seed", seed] + flags, check=True, capture_output=True,
                             text=True)
        sys.stderr.write(out.stderr)
        for line in filter(None, out.stdout.split("\n")):
            pair = json.loads(line)
            total += 1
            if pair["doc"] is None:
                bad.append(("(not UTF-8)", None, "the document is not UTF-8"))
                continue
            try:
                value = json.loads(pair["doc"])
                jsonschema.Draft202012Validator(pair["schema"]).validate(value)
            except (ValueError, jsonschema.ValidationError) as e:
                bad.append((pair["doc"], pair["schema"], str(e).splitlines()[0]))
    for doc, schema, why in bad[:10]:
        print("INVALID %r\n  schema %s\n  %s" % (doc, json.dumps(schema), why))
    print("%d documents, %d invalid" % (total, len(bad)))
    if total < 250:
        print("too few documents")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
