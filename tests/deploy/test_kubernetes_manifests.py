"""deploy/kubernetes: every manifest validates strictly (unknown fields are errors) against the schemas of a
pinned Kubernetes release, and the committed rendered files are what the kustomizations give."""

from __future__ import annotations

import copy
import shutil

import kubernetes_validate
import pytest
import yaml
from kube_manifests import KUBERNETES, KUBERNETES_VERSION, LAYOUTS, RENDERED, load_objects, manifest_files, renderer


def _validate(obj: dict) -> None:
    # SchemaNotFoundError (a kind or apiVersion the release does not have) fails too: it is no pass
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KUBERNETES)))
def test_every_manifest_validates_strictly(path):
    objects = load_objects(path)
    assert objects, f"{path}: no object"
    for obj in objects:
        _validate(obj)


def test_the_files_cover_both_layouts_and_the_base():
    names = {str(p.relative_to(KUBERNETES)) for p in manifest_files()}
    assert {"rendered/rocksdb.yaml", "rendered/redis.yaml"} <= names
    assert {p.split("/")[0] for p in names} == {"base", *LAYOUTS, "rendered"}


def _statefulset() -> dict:
    return next(o for o in load_objects(RENDERED / "rocksdb.yaml") if o["kind"] == "StatefulSet")


@pytest.mark.parametrize(
    "mutate, says",
    [
        # a misspelt field is no error to the API server's lax decoding: strict validation catches it
        (lambda o: o["spec"]["template"]["spec"]["containers"][0].update(readinesProbe={}), "readinesProbe"),
        (lambda o: o["spec"]["template"]["spec"]["volumes"][0]["emptyDir"].update(medium=["Memory"]), "Memory"),
        (lambda o: o["spec"]["template"]["spec"]["containers"][0].pop("name"), "'name' is a required property"),
        (lambda o: o.update(apiVersion="apps/v1beta1"), "apps/v1beta1"),
    ],
    ids=["unknown-field", "wrong-type", "missing-required", "removed-api"],
)
def test_strict_validation_refuses_a_broken_manifest(mutate, says):
    obj = copy.deepcopy(_statefulset())
    _validate(obj)
    mutate(obj)
    with pytest.raises((kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError)) as e:
        _validate(obj)
    assert says in str(getattr(e.value, "message", e.value))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_rendered_files_are_what_the_overlays_give(layout):
    assert (RENDERED / f"{layout}.yaml").read_text() == renderer().render(layout), (
        f"deploy/kubernetes/rendered/{layout}.yaml is stale: run python deploy/kubernetes/render.py"
    )


def test_the_renderer_sees_an_edit_and_refuses_what_it_cannot_render(tmp_path):
    render = renderer()
    root = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, root)
    settings = root / "base" / "serve-settings.yaml"
    settings.write_text(settings.read_text().replace('OFFGRAPH_MEMORY_MB: "288"', 'OFFGRAPH_MEMORY_MB: "512"'))
    assert render.render("rocksdb", root) != (RENDERED / "rocksdb.yaml").read_text()
    edited = [o for o in yaml.safe_load_all(render.render("rocksdb", root)) if o["kind"] == "ConfigMap"]
    assert {o["metadata"]["name"]: o["data"].get("OFFGRAPH_MEMORY_MB") for o in edited}["offgraph-serve"] == "512"

    k = root / "rocksdb" / "kustomization.yaml"
    k.write_text(k.read_text() + "patches:\n  - path: more.yaml\n")
    with pytest.raises(render.RenderError, match="patches: not supported"):
        render.render("rocksdb", root)
    k.write_text(k.read_text().replace("patches:\n  - path: more.yaml\n", "  - ../base/service.yaml\n"))
    with pytest.raises(render.RenderError, match="Service 'offgraph' is given more than once"):
        render.render("rocksdb", root)
