#!/usr/bin/env python3
"""Check that every relative link in README.md and docs/*.md resolves.

    python3 docs/check_links.py            # from the project folder; exit 1 on a broken link

A link is [text](target) or ![alt](target) outside code (fenced blocks and
`inline code` are skipped). Web links (http:, https:, mailto:) are not
fetched. A target must name a file or folder that exists, relative to the
page; a #fragment on a Markdown page must be one of that page's headings,
spelled as GitHub makes anchors of them (lower case, punctuation dropped,
spaces to hyphens, -1, -2 ... for repeats).
"""
import os
import re
import sys

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(path):
    """(line number, text) of the lines outside fenced code, inline code removed."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield n, re.sub(r"`[^`]*`", "``", line)


def anchors(path):
    seen, out = {}, set()
    fenced = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            k = seen.get(slug, 0)
            seen[slug] = k + 1
            out.add(slug if k == 0 else "%s-%d" % (slug, k))
    return out


def main():
    root = os.getcwd()
    pages = ["README.md"] + sorted(
        os.path.join("docs", f) for f in os.listdir("docs") if f.endswith(".md"))
    bad = checked = 0
    for page in pages:
        for n, line in prose_lines(page):
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue
                checked += 1
                path, _, frag = target.partition("#")
                full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                if not os.path.exists(os.path.join(root, full)):
                    print("%s:%d: %s: no such file (%s)" % (page, n, target, full))
                    bad += 1
                elif frag and full.endswith(".md") and frag not in anchors(full):
                    print("%s:%d: %s: %s has no heading for #%s" % (page, n, target, full, frag))
                    bad += 1
    print("check_links: %d links in %d pages, %d broken" % (checked, len(pages), bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
