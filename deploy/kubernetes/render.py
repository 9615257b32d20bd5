"""Render each kustomize overlay of deploy/kubernetes/ into deploy/kubernetes/rendered/OVERLAY.yaml, as
`kubectl kustomize deploy/kubernetes/OVERLAY` would, for machines without kubectl (CI validates and checks
the rendered files; `kubectl apply -f rendered/rocksdb.yaml` applies the same objects as `apply -k`).

    python deploy/kubernetes/render.py           # write rendered/*.yaml
    python deploy/kubernetes/render.py --check   # exit 1 if a rendered file is not what the sources give

It implements only what these kustomizations use: ``resources`` (manifest files, and directories holding
a kustomization.yaml), with kustomize's checks that no object is given twice; the objects come out in
kustomize's legacy order (by kind, then by name), without comments. A kustomization with any other field
(patches, labels, namespace, generators) is refused with its name: teach this script that field first.
Needs PyPI's PyYAML only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
OVERLAYS = ("rocksdb", "redis")
RENDERED = HERE / "rendered"
KUSTOMIZATION = "kustomization.yaml"
SUPPORTED = frozenset({"apiVersion", "kind", "resources"})

# kustomize's legacy resource order (api/resource/resource.go's orderFirst / orderLast); other kinds between
ORDER_FIRST = (
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
)
ORDER_LAST = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


class RenderError(ValueError):
    """A kustomization this renderer cannot render faithfully; the message names the file and why."""


def _load_objects(path: Path) -> list[dict]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise RenderError(f"{path}: {e}") from None
    for d in docs:
        if not isinstance(d, dict) or not d.get("kind") or not d.get("metadata", {}).get("name"):
            raise RenderError(f"{path}: every document must be an object with a kind and metadata.name")
    return docs


def build(directory: Path) -> list[dict]:
    """The objects of the kustomization in ``directory``, in the order its resources give them."""
    kfile = directory / KUSTOMIZATION
    try:
        k = yaml.safe_load(kfile.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise RenderError(f"{kfile}: {e}") from None
    if not isinstance(k, dict) or k.get("kind") != "Kustomization":
        raise RenderError(f"{kfile}: not a Kustomization")
    unknown = sorted(set(k) - SUPPORTED)
    if unknown:
        raise RenderError(f"{kfile}: {', '.join(unknown)}: not supported by this renderer (only {sorted(SUPPORTED)})")
    objects: list[dict] = []
    for entry in k.get("resources") or []:
        target = (directory / entry).resolve()
        if target.is_dir():
            objects += build(target)
        elif target.is_file():
            objects += _load_objects(target)
        else:
            raise RenderError(f"{kfile}: resource {entry!r}: no such file or directory")
    seen: set[tuple[str, str, str]] = set()
    for o in objects:
        ident = (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
        if ident in seen:
            raise RenderError(f"{kfile}: {ident[0]} {ident[2]!r} is given more than once")
        seen.add(ident)
    return objects


def _order(o: dict) -> tuple[int, str, str]:
    kind = o["kind"]
    if kind in ORDER_FIRST:
        rank = ORDER_FIRST.index(kind)
    elif kind in ORDER_LAST:
        rank = len(ORDER_FIRST) + 1 + ORDER_LAST.index(kind)
    else:
        rank = len(ORDER_FIRST)
    return rank, kind, o["metadata"]["name"]


def render(overlay: str, root: Path = HERE) -> str:
    """``kubectl kustomize ROOT/OVERLAY``'s objects as one YAML stream (ROOT: deploy/kubernetes)."""
    objects = sorted(build(root / overlay), key=_order)
    head = (
        f"# Rendered from deploy/kubernetes/{overlay} by deploy/kubernetes/render.py: do not edit, edit the sources.\n"
    )
    return head + "---\n".join(yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in objects)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="render.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only check that rendered/ is up to date")
    args = p.parse_args(argv)
    stale = []
    for overlay in OVERLAYS:
        try:
            text = render(overlay)
        except RenderError as e:
            print(f"render.py: error: {e}", file=sys.stderr)
            return 2
        out = RENDERED / f"{overlay}.yaml"
        if args.check:
            if not out.is_file() or out.read_text() != text:
                stale.append(str(out.relative_to(HERE.parent.parent)))
        else:
            out.parent.mkdir(exist_ok=True)
            out.write_text(text)
    if stale:
        print(f"render.py: stale: {', '.join(stale)}: run python deploy/kubernetes/render.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
