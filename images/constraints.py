"""Print pip constraints (`name==version`) for an extra of kuberl: its dependencies, transitively,
at the versions installed in the current environment (the one the test suite ran in).

    .venv/bin/python images/constraints.py operator > images/operator/constraints.txt
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from packaging.requirements import Requirement


def closure(extra: str) -> dict[str, str]:
    """Distribution name -> installed version, for everything `kuberl[extra]` pulls in."""
    pinned: dict[str, str] = {}
    todo = [(Requirement(f"kuberl[{extra}]"))]
    while todo:
        req = todo.pop()
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # not needed on this platform/Python (an environment marker said so)
        if name != "kuberl":
            if name in pinned and not req.extras:
                continue
            pinned[name] = dist.version
        for line in dist.requires or []:
            sub = Requirement(line)
            envs = [{"extra": e} for e in (req.extras or {""})]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                todo.append(sub)
    return dict(sorted(pinned.items()))


def main(extra: str) -> None:
    print(f"# pip constraints for kuberl[{extra}]: the versions the test suite ran with.")
    print(f"# Regenerate: .venv/bin/python images/constraints.py {extra} > images/{extra}/constraints.txt")
    for name, version in closure(extra).items():
        print(f"{name}=={version}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "operator")
