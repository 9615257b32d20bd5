"""deploy/kubernetes checked against the code: every probe path is a route of the server's app, every port
the one the container's `offgraph` command listens on, every flag and ``OFFGRAPH_*`` variable one that
its subcommand has (its real parser, with the settings read from the environment), every ``AWS_*`` one the
object store reads, given to a container whose --models is in object storage, the updater writing the
folder its server serves from (the copy-down cache, on the models volume, within its claim), the memory and
the grace period what the server's settings need. Each check is shown failing on a broken copy."""

from __future__ import annotations

import copy
import inspect
import os

import pytest
from kube_manifests import (
    LAYOUTS,
    Container,
    container,
    containers,
    find,
    layout_objects,
    mebibytes,
    pod_spec,
    setting,
    subcommand_parser,
    variables_read,
    workloads,
)

from offgraph import __version__

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
# a worker's own memory beside its caches (Python, TensorFlow, the dense model, open store files): 900-920
# MiB PSS measured at --memory-mb 288 (bench/results/scale/README.md), and what a version swap adds while
# the next version loads (peak 1,170 MiB: the same run)
PROCESS_MB = 640
SWAP_MB = 256
EXIT_MARGIN_S = 2  # the server exits within drain + stop timeout + about 2 s (offgraph serve --help)


@pytest.fixture(scope="module")
def app_routes(tmp_path_factory):
    """The leaf routes of the server's real app (built, not started)."""
    from offgraph.server.app import create_app
    from offgraph.server.config import ServerConfig
    from offgraph.server.http.route_match import leaf_routes

    app = create_app(ServerConfig(models_dir=tmp_path_factory.mktemp("models")))
    return list(leaf_routes(app.routes))


def _is_route(routes, path: str, method: str = "GET") -> bool:
    from starlette.routing import Match

    scope = {"type": "http", "path": path, "method": method, "root_path": "", "query_string": b"", "headers": []}
    return any(r.matches(scope)[0] is Match.FULL for r in routes)


def _servers(objects) -> list[Container]:
    return [c for c in containers(objects) if c.subcommand() == "serve"]


def _updaters(objects) -> list[Container]:
    return [c for c in containers(objects) if c.subcommand() == "update"]


# -- the checks (each one raises AssertionError naming what does not match) --------------------------------


def check_probes(objects, routes) -> None:
    for c in _servers(objects):
        assert all(p in c.spec for p in PROBES), f"{c.name}: probes {[p for p in PROBES if p not in c.spec]} missing"
        for kind in PROBES:
            get = c.spec[kind]["httpGet"]
            assert _is_route(routes, get["path"]), f"{c.name} {kind}: {get['path']} is no GET route of the server"
            port = get["port"]
            number = c.port(port) if isinstance(port, str) else port
            assert number == int(setting(c, "--port")), f"{c.name} {kind}: port {port} is not the serve port"
        assert c.spec["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness must be /readyz"


def check_ports(objects) -> None:
    for c in _servers(objects):
        assert c.port("http") == int(setting(c, "--port")), (
            f"{c.name}: containerPort http {c.port('http')} != --port {setting(c, '--port')}"
        )
        assert setting(c, "--host") == "0.0.0.0", f"{c.name}: listens on {setting(c, '--host')}, not every address"
    for c in _updaters(objects):
        assert c.port("metrics") == int(setting(c, "--metrics-port")), (
            f"{c.name}: containerPort metrics {c.port('metrics')} != --metrics-port {setting(c, '--metrics-port')}"
        )
    svc = find(objects, "Service")
    served = [c for c in _servers(objects) if svc["spec"]["selector"].items() <= _pod_labels(c).items()]
    assert served, f"Service selector {svc['spec']['selector']} selects no server pod"
    for p in svc["spec"]["ports"]:
        for c in served:
            target = p["targetPort"]
            assert (c.port(target) if isinstance(target, str) else target) == int(setting(c, "--port")), (
                f"Service port {p['name']}: targetPort {target} is not the serve port"
            )


def _pod_labels(c: Container) -> dict:
    return c.workload["spec"]["template"]["metadata"]["labels"]


def check_flags(objects, monkeypatch) -> None:
    """Each container's args parse with its subcommand's real parser, in its environment (the settings'
    variables are parsed and checked as the CLI does)."""
    for c in containers(objects):
        args = c.args()
        parser = subcommand_parser(args[0])
        for a in args[1:]:
            if a.startswith("-"):
                assert a.split("=", 1)[0] in parser._option_string_actions, f"{c.name}: {a} is no flag of {args[0]}"
        with monkeypatch.context() as m:
            for k in [k for k in os.environ if k.startswith("OFFGRAPH_")]:
                m.delenv(k)
            for k, v in c.env().items():
                m.setenv(k, v)
            try:
                parser.parse_args(args[1:])
            except SystemExit as e:
                raise AssertionError(f"{c.name}: offgraph {' '.join(args)} is refused (exit {e.code})") from None


def _object_storage(c: Container) -> bool:
    """Whether the container's --models names object storage (s3://...) rather than a folder."""
    from offgraph.objectstore import scheme_of

    models = setting(c, "--models")
    return models is not None and scheme_of(models) is not None


def check_variables(objects) -> None:
    from offgraph.objectstore.s3 import ENV_VARIABLES

    for c in containers(objects):
        known = variables_read(c.subcommand())
        for name in c.env():
            if name.startswith("OFFGRAPH_"):
                assert name in known, f"{c.name}: {name} names no setting of offgraph {c.subcommand()}"
            elif name.startswith("AWS_"):  # the object store's, not a setting's
                assert name in ENV_VARIABLES, f"{c.name}: {name} is no variable the object store reads"
                assert _object_storage(c), f"{c.name}: {name} given, but its --models names no object storage"


def check_feed(objects) -> None:
    """Server and updater of one pod share one memory-backed folder, where OFFGRAPH_FEED_SHM points in
    both, sized for the updater's live epochs at the server's feed budget, and counted in the updater."""
    from offgraph.scoring.memory_budget import split_memory
    from offgraph.store.feed import FeedWriter
    from offgraph.store.feed_dirs import SHM_ENV

    defaults = inspect.signature(FeedWriter.__init__).parameters
    epochs = 1 + defaults["keep_seconds"].default / defaults["epoch_seconds"].default
    for c in _updaters(objects):
        volumes = {v["name"]: v for v in pod_spec(c.workload).get("volumes", [])}
        feed_dir = c.env().get(SHM_ENV)
        assert feed_dir, f"{c.name}: {SHM_ENV} unset: the feed would go to the container's own 64 MiB /dev/shm"
        vol = next((n for n, p in c.mounts().items() if p == feed_dir), None)
        assert vol in volumes and volumes[vol].get("emptyDir", {}).get("medium") == "Memory", (
            f"{c.name}: {SHM_ENV}={feed_dir} is not a memory-backed emptyDir"
        )
        size = mebibytes(volumes[vol]["emptyDir"]["sizeLimit"])
        partners = [s for s in _servers(objects) if s.workload is c.workload]
        for s in partners:
            assert s.env().get(SHM_ENV) == feed_dir and s.mounts().get(vol) == feed_dir, (
                f"{s.name}: does not see the updater's feed at {feed_dir}"
            )
            memory_mb = float(setting(s, "--memory-mb"))
            need = epochs * split_memory(memory_mb, models=1).feed_mb
            assert size >= need, f"feed sizeLimit {size:g} MiB < {epochs:g} epochs x the feed budget = {need:g} MiB"
        res = c.spec["resources"]
        # the feed's pages are charged to the updater, which writes them
        assert mebibytes(res["requests"]["memory"]) >= size, f"{c.name}: memory request below the feed's {size:g} MiB"
        assert mebibytes(res["limits"]["memory"]) > size, (
            f"{c.name}: memory limit does not hold the feed's {size:g} MiB"
        )


def _claim_mb(w: dict, volume: str) -> float:
    """The size of the claim behind a workload's volume (a StatefulSet's claim template, else a claim)."""
    for t in w["spec"].get("volumeClaimTemplates", []):
        if t["metadata"]["name"] == volume:
            return mebibytes(t["spec"]["resources"]["requests"]["storage"])
    raise AssertionError(f"{w['metadata']['name']}: volume {volume} has no claim template")


def check_models(objects) -> None:
    """The updater of a pod writes the folder its server serves from: --models, or the copy-down cache
    (--model-cache-dir) when --models names object storage; that folder is on the models volume, mounted
    at one path in both. A cache is a folder of the volume (its root may hold a root-only lost+found) and
    its bound fits the volume's claim."""
    for c in _updaters(objects):
        for s in [s for s in _servers(objects) if s.workload is c.workload]:
            remote = _object_storage(s)
            served = setting(s, "--model-cache-dir") if remote else setting(s, "--models")
            assert setting(c, "--models") == served, (
                f"{c.name}: --models {setting(c, '--models')} is not the folder {s.name} serves from ({served})"
            )
            mount = s.mounts().get("models")
            assert mount is not None and c.mounts().get("models") == mount, f"{c.name}, {s.name}: models volume"
            assert served == mount or served.startswith(mount + "/"), f"{served} is not on the models volume"
            if remote:
                assert served != mount, f"the model cache {served} is the models volume's root (lost+found)"
                bound, claim = float(setting(s, "--model-cache-mb")), _claim_mb(s.workload, "models")
                assert bound < claim, f"--model-cache-mb {bound:g} does not fit the models claim ({claim:g} MiB)"


def check_resources(objects) -> None:
    for c in _servers(objects):
        memory_mb, workers = float(setting(c, "--memory-mb")), int(setting(c, "--workers"))
        res = c.spec["resources"]
        request, limit = mebibytes(res["requests"]["memory"]), mebibytes(res["limits"]["memory"])
        assert request >= workers * (memory_mb + PROCESS_MB), (
            f"{c.name}: memory request {request:g} MiB < {workers} x ({memory_mb:g} + {PROCESS_MB}) MiB"
        )
        assert limit >= workers * (memory_mb + PROCESS_MB + SWAP_MB), (
            f"{c.name}: memory limit {limit:g} MiB < {workers} x ({memory_mb:g} + {PROCESS_MB} + {SWAP_MB}) MiB"
        )
        assert float(res["requests"]["cpu"]) >= workers, f"{c.name}: less than a core per worker"


def check_grace(objects) -> None:
    from offgraph.streaming.stop_watchdog import STOP_GRACE_S

    for w in workloads(objects):
        grace = pod_spec(w)["terminationGracePeriodSeconds"]
        for c in [c for c in containers(objects) if c.workload is w]:
            if c.subcommand() == "serve":
                drain, stop = float(setting(c, "--drain-seconds")), float(setting(c, "--stop-timeout"))
                assert grace >= drain + stop + EXIT_MARGIN_S, (
                    f"{w['metadata']['name']}: grace {grace} s < drain {drain:g} + stop {stop:g} + {EXIT_MARGIN_S} s"
                )
                r = c.spec["readinessProbe"]
                assert r["periodSeconds"] * r["failureThreshold"] <= drain, (
                    f"{c.name}: readiness sees the drain after {r['periodSeconds'] * r['failureThreshold']} s, "
                    f"the drain lasts {drain:g} s"
                )
            else:
                assert grace > STOP_GRACE_S, (
                    f"{w['metadata']['name']}: grace {grace} s <= the updater's {STOP_GRACE_S} s"
                )


def check_scaling(objects) -> None:
    hpa = find(objects, "HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    target = find(objects, ref["kind"], ref["name"])
    for m in hpa["spec"]["metrics"]:
        named = m.get("containerResource", {}).get("container")
        if named:
            assert any(c.name == named and c.workload is target for c in containers(objects)), (
                f"HPA metric names container {named}, which {ref['kind']} {ref['name']} does not have"
            )
    pdb = find(objects, "PodDisruptionBudget")
    labels = target["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), "the PodDisruptionBudget selects no pod"


def check_image(objects) -> None:
    for c in containers(objects):
        assert c.spec["image"] == f"localhost/offgraph:{__version__}", f"{c.name}: image {c.spec['image']}"


# -- the tests -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_manifests_match_the_code(layout, app_routes, monkeypatch):
    objects = layout_objects(layout)
    assert _servers(objects) and _updaters(objects)
    check_probes(objects, app_routes)
    check_ports(objects)
    check_flags(objects, monkeypatch)
    check_variables(objects)
    check_feed(objects)
    check_models(objects)
    check_resources(objects)
    check_grace(objects)
    check_scaling(objects)
    check_image(objects)


def test_the_rocksdb_pod_runs_server_and_updater_side_by_side():
    objects = layout_objects("rocksdb")
    server, updater = container(objects, "server"), container(objects, "updater")
    assert server.workload is updater.workload
    assert _updaters(objects) == [updater]  # no updater of the pod's store elsewhere


def test_the_redis_layout_has_one_updater_apart_from_stateless_servers():
    objects = layout_objects("redis")
    updater = container(objects, "updater")
    assert updater.workload["spec"]["replicas"] == 1 and updater.workload["spec"]["strategy"]["type"] == "Recreate"
    assert all(s.workload is not updater.workload for s in _servers(objects))
    assert all(w["kind"] == "Deployment" for w in workloads(objects))


def _server_spec(o):
    return next(c for c in o if c["kind"] == "StatefulSet")["spec"]["template"]["spec"]["containers"][0]


def _updater_spec(o):
    return next(c for c in o if c["kind"] == "StatefulSet")["spec"]["template"]["spec"]["containers"][1]


def _serve_settings(o):
    return find(o, "ConfigMap", "offgraph-serve")["data"]


def _update_settings(o):
    return find(o, "ConfigMap", "offgraph-update")["data"]


def _sts(o):
    return find(o, "StatefulSet")


def _models_source(o):
    return find(o, "ConfigMap", "offgraph-models")["data"]


def _s3_secret(o):
    return find(o, "Secret", "offgraph-s3")["stringData"]


BROKEN = {
    "probe-path": (lambda o: _server_spec(o)["livenessProbe"]["httpGet"].update(path="/health"), "probes", "/health"),
    "probe-port": (lambda o: _server_spec(o)["startupProbe"]["httpGet"].update(port=8080), "probes", "port 8080"),
    "serve-port": (lambda o: _serve_settings(o).update(OFFGRAPH_PORT="8000"), "ports", "!= --port 8000"),
    "metrics-port": (lambda o: _update_settings(o).update(OFFGRAPH_METRICS_PORT="9000"), "ports", "--metrics-port"),
    "flag": (lambda o: _server_spec(o)["args"].extend(["--memory", "512"]), "flags", "--memory is no flag"),
    "flag-of-the-other-command": (lambda o: _updater_spec(o)["args"].extend(["--workers", "2"]), "flags", "--workers"),
    "bad-value": (lambda o: _serve_settings(o).update(OFFGRAPH_MEMORY_MB="lots"), "flags", "is refused"),
    "variable": (lambda o: _serve_settings(o).update(OFFGRAPH_CACHE_SIZE_MB="64"), "variables", "OFFGRAPH_CACHE"),
    "variable-of-the-other-command": (
        lambda o: _update_settings(o).update(OFFGRAPH_MEMORY_MB="64"),
        "variables",
        "OFFGRAPH_MEMORY_MB names no setting of offgraph update",
    ),
    "aws-variable": (lambda o: _s3_secret(o).update(AWS_SECRET_KEY="x"), "variables", "AWS_SECRET_KEY is no"),
    "aws-variable-of-the-updater": (
        lambda o: _updater_spec(o)["env"].append({"name": "AWS_REGION", "value": "eu-west-1"}),
        "variables",
        "updater: AWS_REGION given, but its --models names no object storage",
    ),
    "models-elsewhere": (
        lambda o: _updater_spec(o)["env"].append({"name": "OFFGRAPH_MODELS", "value": "/models"}),
        "models",
        "is not the folder server serves from",
    ),
    "cache-off-the-volume": (
        lambda o: _models_source(o).update(OFFGRAPH_MODEL_CACHE_DIR="/var/cache/offgraph"),
        "models",
        "not on the models volume",
    ),
    "cache-at-the-volume-root": (
        lambda o: _models_source(o).update(OFFGRAPH_MODEL_CACHE_DIR="/models"),
        "models",
        "lost+found",
    ),
    "cache-beyond-the-claim": (
        lambda o: _models_source(o).update(OFFGRAPH_MODEL_CACHE_MB="51200"),
        "models",
        "does not fit the models claim",
    ),
    "feed-unshared": (lambda o: _updater_spec(o)["env"].clear(), "feed", "OFFGRAPH_FEED_SHM unset"),
    "feed-on-disk": (
        lambda o: _sts(o)["spec"]["template"]["spec"]["volumes"][0]["emptyDir"].pop("medium"),
        "feed",
        "not a memory-backed emptyDir",
    ),
    "feed-small": (lambda o: _serve_settings(o).update(OFFGRAPH_MEMORY_MB="640"), "feed", "sizeLimit"),
    "feed-uncounted": (lambda o: _updater_spec(o)["resources"]["limits"].update(memory="64Mi"), "feed", "limit"),
    "memory": (lambda o: _serve_settings(o).update(OFFGRAPH_MEMORY_MB="512"), "resources", "memory request"),
    "workers": (lambda o: _serve_settings(o).update(OFFGRAPH_WORKERS="2"), "resources", "2 x"),
    "grace": (
        lambda o: _sts(o)["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=15),
        "grace",
        "grace 15",
    ),
    "drain": (lambda o: _serve_settings(o).update(OFFGRAPH_DRAIN_SECONDS="30"), "grace", "drain 30"),
    "hpa-container": (
        lambda o: find(o, "HorizontalPodAutoscaler")["spec"]["metrics"][0]["containerResource"].update(container="x"),
        "scaling",
        "names container x",
    ),
    "image": (
        lambda o: [c.update(image="offgraph:latest") for c in _sts(o)["spec"]["template"]["spec"]["containers"]],
        "image",
        "offgraph:latest",
    ),
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_each_check_fails_on_a_broken_copy(broken, app_routes, monkeypatch):
    mutate, check, says = BROKEN[broken]
    objects = copy.deepcopy(layout_objects("rocksdb"))
    mutate(objects)
    run = {
        "probes": lambda: check_probes(objects, app_routes),
        "ports": lambda: check_ports(objects),
        "flags": lambda: check_flags(objects, monkeypatch),
        "variables": lambda: check_variables(objects),
        "feed": lambda: check_feed(objects),
        "models": lambda: check_models(objects),
        "resources": lambda: check_resources(objects),
        "grace": lambda: check_grace(objects),
        "scaling": lambda: check_scaling(objects),
        "image": lambda: check_image(objects),
    }[check]
    with pytest.raises(AssertionError) as e:
        run()
    assert says in str(e.value), str(e.value)
