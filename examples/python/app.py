"""Counts the words of the capsule's own files and writes a report into the workdir."""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
words = {}
for name in sorted(os.listdir(here)):
    with open(os.path.join(here, name), encoding="utf-8") as f:
        words[name] = len(f.read().split())
with open(sys.argv[1], "w", encoding="utf-8") as out:
    for name, n in words.items():
        out.write(f"{name}: {n} words\n")
print(f"app.py ran from {here} in {os.getcwd()}: {len(words)} files counted into {sys.argv[1]}")
