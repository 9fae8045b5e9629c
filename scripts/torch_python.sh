#!/usr/bin/env bash
# Prints the Python that has PyTorch, for the benchmark scripts: $PYTHON when set, else Debian's
# /usr/bin/python3 if it imports torch, else the first python3 on the PATH that does. Exits 1 with
# a message when none does.
if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; exit 0; fi
for candidate in /usr/bin/python3 python3; do
  if "$candidate" -c "import torch" 2>/dev/null; then echo "$candidate"; exit 0; fi
done
echo "no python3 with PyTorch found (set PYTHON)" >&2
exit 1
