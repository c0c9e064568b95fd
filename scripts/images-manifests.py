"""Print the manifest digests of an image in a containerd (its target, or the manifests of its index).

Used by ``scripts/images.sh import``; standard library and ``ctr`` only.

    python3 scripts/images-manifests.py CONTAINERD_SOCKET IMAGE_REF
"""

from __future__ import annotations

import json
import subprocess
import sys


def main() -> None:
    sock, ref = sys.argv[1:3]
    ctr = ["ctr", "--address", sock, "-n", "k8s.io"]
    listing = subprocess.run([*ctr, "images", "ls"], capture_output=True, text=True, check=True).stdout
    (line,) = [row for row in listing.splitlines() if row.split()[:1] == [ref]]
    digest = next(field for field in line.split() if field.startswith("sha256:"))
    doc = json.loads(subprocess.run([*ctr, "content", "get", digest], capture_output=True, check=True).stdout)
    print(" ".join(m["digest"] for m in doc.get("manifests", [])) or digest)


if __name__ == "__main__":
    main()
