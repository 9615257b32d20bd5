"""The Kubernetes manifests of deploy/kubernetes/ as the tests read them: the files, the rendered objects of
each layout, and each container as Kubernetes would start it (its args with ``$(VAR)`` expanded, its
environment with ConfigMap and Secret values resolved), beside the `offgraph` subcommand parser it runs."""

from __future__ import annotations

import argparse
import base64
import importlib.util
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml
from deploy_helpers import DEPLOY

KUBERNETES = DEPLOY / "kubernetes"
RENDERED = KUBERNETES / "rendered"
LAYOUTS = ("rocksdb", "redis")
KUBERNETES_VERSION = "1.33.0"
"""The Kubernetes release whose schemas every manifest is validated against (kubernetes-validate carries them)."""


def renderer():
    """deploy/kubernetes/render.py as a module (a script of the operator's kit, not of the package)."""
    spec = importlib.util.spec_from_file_location("kubernetes_render", KUBERNETES / "render.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def manifest_files() -> list[Path]:
    """Every file of Kubernetes objects: the base's, the overlays' and the rendered ones (not the
    kustomization.yaml files, which are kustomize's, not Kubernetes')."""
    out = [p for d in ("base", *LAYOUTS, "rendered") for p in sorted((KUBERNETES / d).glob("*.yaml"))]
    return [p for p in out if p.name != "kustomization.yaml"]


def load_objects(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def layout_objects(layout: str) -> list[dict]:
    return load_objects(RENDERED / f"{layout}.yaml")


def find(objects: list[dict], kind: str, name: str | None = None) -> dict:
    hits = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, (kind, name, len(hits))
    return hits[0]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def workloads(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]


_VAR_REF = re.compile(r"\$\((\w+)\)|\$\$")


@dataclass
class Container:
    """One container of a workload as Kubernetes starts it."""

    workload: dict
    spec: dict
    objects: list[dict]

    @property
    def name(self) -> str:
        return self.spec["name"]

    def env(self) -> dict[str, str]:
        """Its environment: ``envFrom`` first, then ``env`` (which wins), values resolved."""
        out: dict[str, str] = {}
        for src in self.spec.get("envFrom", []):
            if "configMapRef" in src:
                out.update(self._data("ConfigMap", src["configMapRef"]["name"]))
            else:
                out.update(self._data("Secret", src["secretRef"]["name"]))
        for e in self.spec.get("env", []):
            if "value" in e:
                out[e["name"]] = self._expand(e["value"], out)
            else:
                ref = e["valueFrom"]
                kind, key_ref = (
                    ("ConfigMap", ref["configMapKeyRef"])
                    if "configMapKeyRef" in ref
                    else ("Secret", ref["secretKeyRef"])
                )
                out[e["name"]] = self._data(kind, key_ref["name"])[key_ref["key"]]
        return out

    def _data(self, kind: str, name: str) -> dict[str, str]:
        o = find(self.objects, kind, name)
        data = dict(o.get("data") or {})
        if kind == "Secret":
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
            data.update(o.get("stringData") or {})
        return {k: str(v) for k, v in data.items()}

    @staticmethod
    def _expand(text: str, env: dict[str, str]) -> str:
        # Kubernetes' rule: $(VAR) of a defined variable is replaced, $$ is a literal $, the rest stays
        return _VAR_REF.sub(lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)

    def args(self) -> list[str]:
        """``command`` + ``args`` after the image's entrypoint (`offgraph`), ``$(VAR)`` expanded."""
        assert "command" not in self.spec, f"{self.name}: command replaces the image's entrypoint (`offgraph`)"
        env = self.env()
        return [self._expand(str(a), env) for a in self.spec.get("args", [])]

    def subcommand(self) -> str:
        return self.args()[0]

    def port(self, name: str) -> int:
        return next(p["containerPort"] for p in self.spec.get("ports", []) if p.get("name") == name)

    def mounts(self) -> dict[str, str]:
        """volume name -> mount path."""
        return {m["name"]: m["mountPath"] for m in self.spec.get("volumeMounts", [])}


def containers(objects: list[dict]) -> list[Container]:
    return [Container(w, c, objects) for w in workloads(objects) for c in pod_spec(w)["containers"]]


def container(objects: list[dict], name: str, workload: str | None = None) -> Container:
    hits = [c for c in containers(objects) if c.name == name and workload in (None, c.workload["metadata"]["name"])]
    assert len(hits) == 1, (name, workload, len(hits))
    return hits[0]


@cache
def subcommand_parser(name: str) -> argparse.ArgumentParser:
    """The real parser of ``offgraph NAME`` (offgraph.cli builds it)."""
    from offgraph.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def setting_variables(name: str) -> dict[str, str]:
    """``OFFGRAPH_*`` variable -> flag, of every setting ``offgraph NAME`` takes from the environment."""
    from offgraph.cli.settings_sources import settings_of

    return {s.env: "--" + s.name for s in settings_of(subcommand_parser(name))}


def variables_read(name: str) -> set[str]:
    """Every ``OFFGRAPH_*`` variable ``offgraph NAME`` reads: its settings', the config file's and the write
    feed's folder."""
    from offgraph.cli.settings_sources import CONFIG_ENV
    from offgraph.store.feed_dirs import SHM_ENV

    return set(setting_variables(name)) | {CONFIG_ENV, SHM_ENV}


def setting(c: Container, flag: str) -> str | None:
    """The text of ``flag`` for container ``c`` as the CLI resolves it: its args, else its variable, else
    the parser's default (None: none)."""
    args = c.args()
    for i, a in enumerate(args):
        if a == flag:
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    variable = {f: v for v, f in setting_variables(c.subcommand()).items()}[flag]
    if c.env().get(variable):
        return c.env()[variable]
    action = next(a for a in subcommand_parser(c.subcommand())._actions if flag in a.option_strings)
    return None if action.default is None else str(action.default)


MiB_UNITS = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}


def mebibytes(quantity: str) -> float:
    """A Kubernetes memory quantity in MiB (binary suffixes only: what these manifests use)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)", str(quantity))
    assert m, f"memory quantity {quantity!r}: give it in Ki, Mi, Gi or Ti"
    return float(m[1]) * MiB_UNITS[m[2]]
