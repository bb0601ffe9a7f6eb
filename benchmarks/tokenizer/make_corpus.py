#!/usr/bin/env python3
"""Builds the tokenizer benchmark text: about 10 MB of mixed-language UTF-8 from files every Debian machine has.

  python3 benchmarks/tokenizer/make_corpus.py OUT.txt [--mb 10]

Half of it is translated messages from the gettext catalogs under /usr/share/locale (some 190 languages: Latin,
Cyrillic, Greek, Arabic, Hebrew, Indic, CJK, Thai, ... scripts), a quarter Python source code from the standard
library, a quarter English (the catalogs' source messages and /usr/share/common-licenses). Chunks of about 2 KB are
interleaved in a fixed pseudo-random order, so the text is the same on every machine with the same packages.
"""
import argparse
import gettext
import random
import sys
import sysconfig
from pathlib import Path


def chunks(texts, size=2048):
    buf = []
    n = 0
    for t in texts:
        buf.append(t)
        n += len(t.encode("utf-8"))
        if n >= size:
            yield "".join(buf)
            buf, n = [], 0
    if buf:
        yield "".join(buf)


def catalogs():
    translated, english = [], []
    for f in sorted(Path("/usr/share/locale").glob("*/LC_MESSAGES/*.mo")):
        try:
            with open(f, "rb") as fh:
                cat = gettext.GNUTranslations(fh)
        except Exception:
            continue
        for k, v in sorted((k, v) for k, v in cat._catalog.items() if isinstance(k, str) and isinstance(v, str)):
            if k and v and v != k:
                translated.append(v + "\n")
                english.append(k + "\n")
    return translated, english


def python_sources():
    root = Path(sysconfig.get_paths()["stdlib"])
    for f in sorted(root.glob("*.py")):
        try:
            yield f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def licenses():
    for f in sorted(Path("/usr/share/common-licenses").glob("*")):
        if f.is_file():
            try:
                yield f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--mb", type=float, default=10.0)
    args = ap.parse_args()
    target = int(args.mb * 1_000_000)
    translated, english = catalogs()
    rng = random.Random(1234)
    rng.shuffle(translated)
    rng.shuffle(english)
    streams = [
        (0.50, chunks(translated)),
        (0.25, chunks(python_sources())),
        (0.25, chunks(list(licenses()) + english)),
    ]
    out, sizes = [], [0, 0, 0]
    total = 0
    while total < target:
        progressed = False
        for k, (share, it) in enumerate(streams):
            if sizes[k] > share * target:
                continue
            piece = next(it, None)
            if piece is None:
                continue
            b = len(piece.encode("utf-8"))
            out.append(piece)
            sizes[k] += b
            total += b
            progressed = True
        if not progressed:
            break
    text = "".join(out)
    data = text.encode("utf-8")[:target]
    data = data.decode("utf-8", errors="ignore").encode("utf-8")  # do not cut a character
    Path(args.out).write_bytes(data)
    print(f"{args.out}: {len(data)} bytes (translations {sizes[0]}, code {sizes[1]}, English {sizes[2]})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
