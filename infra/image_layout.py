#!/usr/bin/env python3
"""Builds the container image's files without a container engine or a base image: the
Dockerfile's COPY lines into a directory, then its set-up step there (the RUN line that calls
infra/setup.sh, without what follows its `&&`); the base image's own packages (its apt-get
line) are the host's. CI runs the demo from the result, so the image's layout is tested
where no image can be built.

    python3 infra/image_layout.py /tmp/cdclake-image
    cd /tmp/cdclake-image && .venv/bin/cdclake demo
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def steps(dockerfile: str) -> tuple[list[tuple[list[str], str]], list[str]]:
    """The COPY lines (sources, destination) and the set-up command, in the Dockerfile's terms."""
    copies, setup = [], None
    for line in dockerfile.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["COPY"]:
            copies.append((words[1:-1], words[-1]))
        elif words[:1] == ["RUN"] and "infra/setup.sh" in words:
            setup = words[1 : words.index("&&")] if "&&" in words else words[1:]
    if setup is None:
        raise SystemExit("infra/Dockerfile: no RUN line calls infra/setup.sh")
    return copies, setup


def build(out: Path) -> Path:
    copies, setup = steps((ROOT / "infra" / "Dockerfile").read_text())
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for sources, dest in copies:
        for src in sources:
            target = out / dest / Path(src).name if dest.endswith("/") or len(sources) > 1 else out / dest
            if (ROOT / src).is_dir():
                shutil.copytree(ROOT / src, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / src, target)
    subprocess.run(setup, cwd=out, check=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="where to build it (emptied first)")
    print(build(ap.parse_args().dir.resolve()))


if __name__ == "__main__":
    main()
