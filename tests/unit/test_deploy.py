"""The deployment files in deploy/ stay valid and agree with each other (docs/deployment.md).

* The image gets the model: every file the Dockerfile copies or mounts from the build context, the
  model folder (``MODEL_DIR``: its ``server.py``, ``requirements.txt`` and weights) included, passes
  ``Dockerfile.dockerignore`` read with Docker's rules; the model's requirements are installed.
* Every Kubernetes resource under ``deploy/kubernetes/`` validates, offline, against the Kubernetes
  API JSON schemas bundled in ``kubernetes-validate`` (strict: an unknown or misspelt field fails),
  for the oldest and the newest Kubernetes version that package bundles.
* The KServe resources (``deploy/kserve/``; no schema is bundled for KServe's custom resources)
  have the fields KServe needs.
* The pieces agree: probe paths and ports with the container ports, the Service and the server's
  own configuration (the model's ``server.py``, read with the image's and the container's
  environment); the termination grace period with the preStop sleep and the drain bound; the
  image's user, paths and cache directories with the security context and the writable volumes;
  the default autoscaler needs no metrics adapter, the opt-in one's metric matches the adapter rule.

No cluster, no Docker, no network.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import pathlib
import re
import shlex
from typing import Any, Dict, Iterator, List, Tuple

import kubernetes_validate
import pytest
import yaml

from pytriton.server.security import AccessPolicy
from pytriton.triton import EXIT_TIMEOUT_S

ROOT = pathlib.Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KSERVE = DEPLOY / "kserve"
QUEUE_TIME_HPA = KUBERNETES / "queue-time" / "hpa.yaml"
ADAPTER_RULES = KUBERNETES / "monitoring" / "prometheus-adapter-config.yaml"

# The oldest and the newest Kubernetes release whose schemas kubernetes-validate bundles (1.25 and,
# with kubernetes-validate 1.37, 1.37): the manifests use nothing newer than 1.25 has.
OLDEST_VERSION = kubernetes_validate.utils.all_versions()[0]
NEWEST_VERSION = kubernetes_validate.utils.latest_version()

# Seconds the server may still need after the drain bound: stopping the watchdog and supervisor,
# removing the workspace, interpreter exit (well under a second measured; this is the margin).
CLEANUP_MARGIN_S = 5


def _load(path: pathlib.Path) -> List[Dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _kubernetes_files() -> List[pathlib.Path]:
    return sorted(KUBERNETES.rglob("*.yaml"))


def _resources(directory: pathlib.Path) -> Dict[str, Dict[str, Any]]:
    """The resources ``kubectl apply -f directory`` applies (not recursive), by kind (each appears once)."""
    found: Dict[str, Dict[str, Any]] = {}
    for path in sorted(directory.glob("*.yaml")):
        for doc in _load(path):
            assert doc["kind"] not in found, f"{path}: a second {doc['kind']}"
            found[doc["kind"]] = doc
    return found


@pytest.fixture(scope="module")
def kube() -> Dict[str, Dict[str, Any]]:
    return _resources(KUBERNETES)


@pytest.fixture(scope="module")
def kserve() -> Dict[str, Dict[str, Any]]:
    return _resources(KSERVE)


@pytest.fixture(scope="module")
def server() -> Any:
    """The server.py of the image's model folder as a module (its ``main()`` is not run)."""
    spec = importlib.util.spec_from_file_location(
        "pytriton_deploy_server", ROOT / _build_args()["MODEL_DIR"] / "server.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dockerfile() -> List[Tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of deploy/Dockerfile, continuation lines joined, comments dropped."""
    instructions: List[Tuple[str, str]] = []
    pending = ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        word, _, rest = text.partition(" ")
        instructions.append((word.upper(), rest.strip()))
    assert not pending, "deploy/Dockerfile ends inside a continued line"
    return instructions


def _dockerfile_env() -> Dict[str, str]:
    env: Dict[str, str] = {}
    for word, rest in _dockerfile():
        if word == "ENV":
            for item in shlex.split(rest):
                name, equals, value = item.partition("=")
                assert equals, f"deploy/Dockerfile: write ENV as NAME=value, got {item!r}"
                env[name] = value
    return env


def _build_args() -> Dict[str, str]:
    """The Dockerfile's ``ARG NAME=default`` values (what a plain ``docker build`` uses)."""
    args: Dict[str, str] = {}
    for word, rest in _dockerfile():
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
    return args


def _substitute(text: str) -> str:
    args = _build_args()
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def _context_sources() -> List[str]:
    """Paths in the build context the image reads: COPY sources (not ``--from`` a stage) and bind mounts."""
    sources: List[str] = []
    for word, rest in _dockerfile():
        if word == "COPY":
            words = [item for item in shlex.split(_substitute(rest)) if not item.startswith("--")]
            assert "--from" not in rest, "a COPY --from reads a stage, not the context: teach this test"
            sources += words[:-1]  # the last word is the destination
        elif word == "RUN":
            for mount in re.findall(r"--mount=(\S+)", rest):
                fields = dict(item.partition("=")[::2] for item in mount.split(","))
                if fields.get("type") == "bind" and "from" not in fields:
                    sources.append(_substitute(fields["source"]))
    return [source.rstrip("/") or "." for source in sources]


def _context_files(source: str) -> Iterator[str]:
    """The files under ``source`` (a file or folder of the repository), as context-relative paths."""
    path = ROOT / source
    assert path.exists(), f"deploy/Dockerfile copies {source}, which is not in the repository"
    if path.is_file():
        yield source
        return
    for folder, dirs, files in os.walk(path):
        dirs[:] = [name for name in dirs if name != "__pycache__"]
        for name in files:
            if not name.endswith(".pyc"):
                yield (pathlib.Path(folder) / name).relative_to(ROOT).as_posix()


def _ignore_rules(text: str) -> List[Tuple[bool, re.Pattern[str]]]:
    """``.dockerignore`` lines as ``(is_exception, regex)``, with Docker's rules (moby's patternmatcher).

    Blank lines and ``#`` comments are skipped; a leading ``!`` makes an exception; the pattern is
    cleaned like a path (leading and trailing ``/`` dropped). ``**`` matches any number of folders,
    ``*`` any run of characters but ``/``, ``?`` one such character.
    """
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = pathlib.PurePosixPath(line[1:].strip() if exception else line).as_posix().strip("/")
        regex, index = "", 0
        while index < len(pattern):
            if pattern.startswith("**/", index):
                regex, index = regex + "(?:.*/)?", index + 3
            elif pattern.startswith("**", index):
                regex, index = regex + ".*", index + 2
            elif pattern[index] == "*":
                regex, index = regex + "[^/]*", index + 1
            elif pattern[index] == "?":
                regex, index = regex + "[^/]", index + 1
            else:
                regex, index = regex + re.escape(pattern[index]), index + 1
        rules.append((exception, re.compile(f"^{regex}$")))
    return rules


def _sent_to_docker(path: str, rules: List[Tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the build context holds ``path``: the last rule that matches it or a parent folder wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: count + 1]) for count in range(len(parts))]
    excluded = False
    for exception, regex in rules:
        if any(regex.match(candidate) for candidate in candidates):
            excluded = not exception
    return not excluded


def _left_out(ignore_text: str) -> List[str]:
    """Files the Dockerfile reads from the context that the ignore file leaves out."""
    rules = _ignore_rules(ignore_text)
    return [
        path for source in _context_sources() for path in _context_files(source) if not _sent_to_docker(path, rules)
    ]


def _image_env_for(container: Dict[str, Any]) -> Dict[str, str]:
    """The environment the server sees: the image's ``ENV``, overridden by the container's ``env``."""
    return {**_dockerfile_env(), **_plain_env(container)}


def _container(resource: Dict[str, Any]) -> Dict[str, Any]:
    if resource["kind"] == "ServingRuntime":
        containers = resource["spec"]["containers"]
    else:
        containers = resource["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, "the examples have one container"
    return containers[0]


def _plain_env(container: Dict[str, Any]) -> Dict[str, str]:
    """The container's environment variables that have literal values."""
    return {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}


def _port_number(container: Dict[str, Any], port: Any) -> int:
    """A probe's or Service's port (a number or a container port name) as a number."""
    if isinstance(port, int):
        return port
    matches = [entry["containerPort"] for entry in container["ports"] if entry.get("name") == port]
    assert matches, f"no container port named {port!r}"
    return int(matches[0])


def _prestop_sleep_s(container: Dict[str, Any]) -> int:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and len(command) == 2, f"preStop should be ['sleep', N], got {command}"
    return int(command[1])


def _quantity_bytes(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def _validate(resource: Dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(resource, version, strict=True)


# --- (0) the image gets the model ----------------------------------------------------------------


def _model_dir() -> pathlib.Path:
    return ROOT / _build_args()["MODEL_DIR"]


def test_dockerignore_matcher_follows_dockers_rules():
    """Guards the matcher the next tests rely on, with cases whose outcome Docker documents."""
    rules = _ignore_rules("# comment\n*\n!keep/\n!/top.txt\n**/__pycache__\nkeep/**/*.tmp\n!keep/x/?.tmp\n")
    assert not _sent_to_docker("other.py", rules)  # `*`: everything at the top
    assert not _sent_to_docker("other/deep/file.py", rules)  # ... and so everything below it
    assert _sent_to_docker("keep/a/b.bin", rules)  # `!keep/`: the folder and its contents come back
    assert _sent_to_docker("top.txt", rules)  # leading slash cleaned away
    assert not _sent_to_docker("keep/a/__pycache__/m.pyc", rules)  # `**/` at any depth
    assert not _sent_to_docker("keep/a/b/c.tmp", rules)  # `**` in the middle
    assert _sent_to_docker("keep/x/c.tmp", rules)  # a later rule wins; `?` is one character
    assert not _sent_to_docker("keep/x/cd.tmp", rules)


def test_the_model_folder_holds_a_server_requirements_and_weights():
    model = _model_dir()
    assert (model / "server.py").is_file()
    assert (model / "requirements.txt").is_file()
    data = [path for path in model.iterdir() if path.suffix not in (".py", ".txt", ".md") and path.is_file()]
    assert data, f"{model}: no model file (weights) next to the code"
    copied = _context_sources()
    assert _build_args()["MODEL_DIR"] in copied, "the Dockerfile does not copy the model folder"


def test_every_file_the_dockerfile_reads_gets_into_the_build_context():
    """An excluded file in a copied folder is silently missing from the image: none may be."""
    left_out = _left_out((DEPLOY / "Dockerfile.dockerignore").read_text())
    assert not left_out, f"deploy/Dockerfile.dockerignore leaves out files the image needs: {left_out[:10]}"
    model_files = {path for path in _context_files(_build_args()["MODEL_DIR"])}
    assert {f"{_build_args()['MODEL_DIR']}/requirements.txt", f"{_build_args()['MODEL_DIR']}/server.py"} <= model_files


def test_an_ignore_file_without_the_model_folder_is_caught():
    """The check above fails the way the old ignore file did (it let in only the server script)."""
    text = (DEPLOY / "Dockerfile.dockerignore").read_text()
    line = f"!{_build_args()['MODEL_DIR']}/"
    assert line in text.splitlines()
    left_out = _left_out(text.replace(line, "!" + _build_args()["MODEL_DIR"] + "/server.py"))
    assert any(path.endswith("requirements.txt") for path in left_out)
    assert any(path.endswith(".npz") for path in left_out), left_out


def test_the_models_requirements_are_installed_before_its_files_are_copied():
    instructions = [(word, _substitute(rest)) for word, rest in _dockerfile()]
    model_dir = _build_args()["MODEL_DIR"]
    copy_requirements = next(
        index
        for index, (word, rest) in enumerate(instructions)
        if word == "COPY" and f"{model_dir}/requirements.txt" in rest
    )
    requirements_in_image = shlex.split(instructions[copy_requirements][1])[-1]
    install = next(
        index
        for index, (word, rest) in enumerate(instructions)
        if word == "RUN" and re.search(rf"pip install (?:[^;]* )?-r {re.escape(requirements_in_image)}\b", rest)
    )
    copy_model = next(
        index
        for index, (word, rest) in enumerate(instructions)
        if word == "COPY" and shlex.split(rest)[0].rstrip("/") == model_dir
    )
    assert copy_requirements < install < copy_model, (
        "install the requirements first: a weights edit then reuses that layer"
    )
    users = [rest for word, rest in instructions[:install] if word == "USER"]
    assert users and users[-1].partition(":")[0] in ("0", "root"), "the packages go into the image's Python, as root"
    assert instructions[-1] == ("CMD", '["pytriton", "serve", "server:create_app", "--app-dir", "/app"]')
    assert shlex.split(instructions[copy_model][1])[-1].rstrip("/") == "/app"


# --- (a) the Kubernetes API schemas -----------------------------------------------------------


@pytest.mark.parametrize("version", [OLDEST_VERSION, NEWEST_VERSION])
@pytest.mark.parametrize("path", _kubernetes_files(), ids=lambda path: str(path.relative_to(KUBERNETES)))
def test_kubernetes_resources_match_the_api_schema(path, version):
    for resource in _load(path):
        try:
            _validate(resource, version)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(item) for item in exc.path)
            pytest.fail(
                f"{path.relative_to(ROOT)}: {resource['kind']} is invalid for Kubernetes {version} at {where}: {exc.message}"
            )
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(f"{path.relative_to(ROOT)}: {exc.message}")


def test_the_folder_holds_every_expected_kind(kube):
    """``kubectl apply -f deploy/kubernetes/`` applies these; the adapter rule and the opt-in autoscaler are apart."""
    assert set(kube) == {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
    assert [doc["kind"] for doc in _load(QUEUE_TIME_HPA)] == ["HorizontalPodAutoscaler"]
    assert [doc["kind"] for doc in _load(ADAPTER_RULES)] == ["ConfigMap"]


@pytest.mark.parametrize(
    "break_it",
    [
        lambda d: d["spec"]["template"]["spec"]["containers"][0].update(containerPorts=[]),  # unknown field
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(containerPort="http"),
        lambda d: d["spec"]["template"]["spec"].pop("containers"),  # required field
        lambda d: d["spec"]["template"]["spec"]["volumes"][0]["emptyDir"].update(medium=1),
    ],
    ids=["unknown-field", "wrong-type", "missing-required", "wrong-type-nested"],
)
def test_the_validator_rejects_a_broken_deployment(kube, break_it):
    """Guards the check above: a broken manifest must fail (strict schemas, offline)."""
    broken = copy.deepcopy(kube["Deployment"])
    break_it(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(broken, NEWEST_VERSION)


# --- (b) the KServe resources -----------------------------------------------------------------


def test_serving_runtime_has_what_kserve_needs(kserve):
    runtime = kserve["ServingRuntime"]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert runtime["metadata"]["name"]
    spec = runtime["spec"]
    formats = spec["supportedModelFormats"]
    assert formats and all(item.get("name") for item in formats)
    assert "v2" in spec["protocolVersions"]
    container = _container(runtime)
    assert container["name"] == "kserve-container"  # the name KServe merges the predictor into
    assert container["image"]
    assert len(container["ports"]) == 1, "Knative routes exactly one port"
    assert container["ports"][0]["name"] in ("http1", "h2c")
    assert isinstance(container["ports"][0]["containerPort"], int)


def test_inference_service_uses_the_runtime(kserve):
    service, runtime = kserve["InferenceService"], kserve["ServingRuntime"]
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    assert service["metadata"]["name"]
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] == "v2"
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    supported = {(item["name"], item.get("version")) for item in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in supported


# --- (c) consistency ----------------------------------------------------------------------------


def test_container_ports_are_the_servers_and_the_images(kube, server):
    container = _container(kube["Deployment"])
    config = server.server_config(_image_env_for(container))
    ports = {entry["name"]: entry["containerPort"] for entry in container["ports"]}
    assert ports == {"http": config.http_port, "grpc": config.grpc_port, "metrics": config.metrics_port}
    # Every interface (None: TritonConfig's default, 0.0.0.0): the kubelet and the Service reach the pod's IP.
    assert {config.http_address, config.grpc_address, config.metrics_address} <= {None, "0.0.0.0"}
    exposed = {int(port) for word, rest in _dockerfile() if word == "EXPOSE" for port in rest.split()}
    assert exposed == set(ports.values())


def test_probes_check_triton_health_on_the_http_port_without_a_token(kube, server):
    container = _container(kube["Deployment"])
    env = _image_env_for(container)
    http_port = server.server_config(env).http_port
    expected = {
        "startupProbe": "/v2/health/ready",
        "readinessProbe": "/v2/health/ready",
        "livenessProbe": "/v2/health/live",
    }
    for probe, path in expected.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert _port_number(container, get["port"]) == http_port, probe
    # The kubelet sends no token: the health endpoints must stay open under the server's policy.
    policy = AccessPolicy(server.server_config(env), server.security_config(env))
    assert policy.http_headers("health") == {}
    assert "statistics" in policy.restricted("http")  # while management endpoints do need it


def test_service_ports_reach_the_container_ports(kube):
    service, deployment = kube["Service"], kube["Deployment"]
    container = _container(deployment)
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    by_name = {entry["name"]: entry for entry in service["spec"]["ports"]}
    assert set(by_name) == {entry["name"] for entry in container["ports"]}
    for name, entry in by_name.items():
        assert _port_number(container, entry["targetPort"]) == entry["port"] == _port_number(container, name)
        # The schemas leave enums unchecked: Triton's endpoints are all TCP.
        assert entry.get("protocol", "TCP") == "TCP", entry
    assert all(entry.get("protocol", "TCP") == "TCP" for entry in container["ports"])
    assert by_name["grpc"].get("appProtocol"), "gRPC needs an appProtocol so that proxies speak HTTP/2"


@pytest.mark.parametrize("source", ["kubernetes", "kserve"])
def test_grace_period_covers_prestop_and_drain(kube, kserve, server, source):
    if source == "kubernetes":
        pod = kube["Deployment"]["spec"]["template"]["spec"]
        container = _container(kube["Deployment"])
    else:
        pod = kserve["InferenceService"]["spec"]["predictor"]
        container = _container(kserve["ServingRuntime"])
    config = server.server_config(_image_env_for(container))
    drain_bound = EXIT_TIMEOUT_S if config.exit_timeout_secs is None else config.exit_timeout_secs
    # A delay between readiness off and refusing new requests (TritonConfig.drain_delay_secs, part of
    # the graceful drain) comes on top of the bound; getattr: absent from TritonConfig before that.
    drain_bound += getattr(config, "drain_delay_secs", None) or 0
    prestop = _prestop_sleep_s(container)
    assert prestop >= 1, "the preStop sleep lets endpoints update before SIGTERM"
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= prestop + drain_bound + CLEANUP_MARGIN_S, (
        f"terminationGracePeriodSeconds={grace} must cover preStop {prestop} s + drain bound {drain_bound} s "
        f"+ {CLEANUP_MARGIN_S} s of cleanup"
    )


def test_image_runs_as_the_non_root_user_of_the_security_context(kube):
    users = [rest for word, rest in _dockerfile() if word == "USER"]
    assert users, "deploy/Dockerfile sets no USER: the server would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: numeric and not root, so runAsNonRoot can verify it"
    pod = kube["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert pod["securityContext"]["runAsGroup"] == int(gid or uid)
    container = _container(kube["Deployment"])
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("kind", ["Deployment", "ServingRuntime"])
def test_shared_memory_and_writable_paths(kube, kserve, kind):
    resource = kube[kind] if kind == "Deployment" else kserve[kind]
    container = _container(resource)
    volumes_spec = (
        resource["spec"]["volumes"] if kind == "ServingRuntime" else resource["spec"]["template"]["spec"]["volumes"]
    )
    volumes = {volume["name"]: volume for volume in volumes_spec}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory" and shm["sizeLimit"]
    # The tmpfs is charged to the container's memory: it must fit under the limit, with room to spare.
    memory_limit = _quantity_bytes(container["resources"]["limits"]["memory"])
    assert _quantity_bytes(shm["sizeLimit"]) <= memory_limit // 2
    # With a read-only root, exactly what pytriton writes must be writable: /tmp (sockets, the
    # Python backend's scratch directory), /dev/shm and the workspace; $PYTRITON_HOME (the server
    # install made at build time) must not be hidden under a volume.
    image_env = _dockerfile_env()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    workspace = _plain_env(container)["SERVER_WORKSPACE"]
    assert workspace == image_env["SERVER_WORKSPACE"]
    assert {"/tmp", "/dev/shm", workspace} <= set(mounts)
    for path in mounts:
        assert not pathlib.PurePosixPath(image_env["PYTRITON_HOME"]).is_relative_to(path), path
    for name in mounts.values():
        assert "emptyDir" in volumes[name]


def _is_cache_variable(name: str) -> bool:
    """Variables naming where libraries write caches and settings (pytriton's own home is read-only by design)."""
    if name == "PYTRITON_HOME":
        return False
    return name == "HOME" or name.startswith("XDG_") or name.endswith(("_HOME", "_CACHE", "CACHE_DIR", "CONFIGDIR"))


@pytest.mark.parametrize("kind", ["Deployment", "ServingRuntime"])
def test_cache_directories_are_writable_under_the_read_only_root(kube, kserve, kind):
    """torch, Hugging Face, matplotlib, ... write under ``~/.cache`` and friends: those must be a volume."""
    resource = kube[kind] if kind == "Deployment" else kserve[kind]
    container = _container(resource)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    pod = resource["spec"] if kind == "ServingRuntime" else resource["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    # Disk-backed emptyDirs: /dev/shm is memory, charged to the container and sized for tensors.
    writable = [
        mount["mountPath"]
        for mount in container["volumeMounts"]
        if "emptyDir" in volumes[mount["name"]] and volumes[mount["name"]]["emptyDir"].get("medium") != "Memory"
    ]
    caches = {
        name: value
        for name, value in _image_env_for(container).items()
        if _is_cache_variable(name) and value.startswith("/")  # paths, not switches like PIP_NO_CACHE_DIR=1
    }
    assert {"HOME", "XDG_CACHE_HOME", "TORCH_HOME", "HF_HOME"} <= set(caches), sorted(caches)
    for name, value in caches.items():
        inside = [path for path in writable if pathlib.PurePosixPath(value).is_relative_to(path)]
        assert inside, f"{name}={value} is on the read-only root filesystem; writable: {writable}"


def test_kserve_runtime_matches_the_deployment(kube, kserve):
    deployment, runtime = _container(kube["Deployment"]), _container(kserve["ServingRuntime"])
    assert runtime["image"] == deployment["image"]
    assert runtime["ports"][0]["containerPort"] == _port_number(deployment, "http")
    for probe in ("readinessProbe", "livenessProbe"):
        assert runtime[probe]["httpGet"]["path"] == deployment[probe]["httpGet"]["path"]
        assert _port_number(runtime, runtime[probe]["httpGet"]["port"]) == runtime["ports"][0]["containerPort"]
    assert _plain_env(runtime) == _plain_env(deployment)
    metrics = _port_number(deployment, "metrics")
    assert kserve["ServingRuntime"]["spec"]["annotations"]["prometheus.kserve.io/port"] == str(metrics)


def test_autoscaler_and_disruption_budget_target_the_deployment(kube):
    deployment, hpa, pdb = kube["Deployment"], kube["HorizontalPodAutoscaler"], kube["PodDisruptionBudget"]
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"],
        deployment["kind"],
        deployment["metadata"]["name"],
    )
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert hpa["spec"]["minReplicas"] >= 2, "one pod alone cannot drain without dropping capacity to zero"


def test_default_autoscaler_needs_no_metrics_adapter(kube):
    """CPU comes from metrics-server; a custom metric that cannot be read blocks scale-in (kubernetes#99514)."""
    metrics = kube["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert metrics and all(item["type"] == "Resource" for item in metrics), metrics
    assert {item["resource"]["name"] for item in metrics} <= {"cpu", "memory"}


def test_opt_in_autoscaler_replaces_the_default_and_reads_the_adapters_queue_time(kube):
    default, queue_time = kube["HorizontalPodAutoscaler"], _load(QUEUE_TIME_HPA)[0]
    # Same name: applying it replaces the default instead of adding a second autoscaler that would
    # fight the first over the replica count.
    assert queue_time["metadata"]["name"] == default["metadata"]["name"]
    assert {key: value for key, value in queue_time["spec"].items() if key != "metrics"} == {
        key: value for key, value in default["spec"].items() if key != "metrics"
    }
    pods_metrics = [item["pods"] for item in queue_time["spec"]["metrics"] if item["type"] == "Pods"]
    assert len(pods_metrics) == 1
    rules = yaml.safe_load(_load(ADAPTER_RULES)[0]["data"]["config.yaml"])["rules"]
    by_name = {rule["name"]["as"]: rule for rule in rules}
    rule = by_name[pods_metrics[0]["metric"]["name"]]
    assert "nv_inference_queue_duration_us" in rule["seriesQuery"]
    assert "nv_inference_queue_duration_us" in rule["metricsQuery"]
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    annotations = kube["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(_port_number(_container(kube["Deployment"]), "metrics"))


def test_the_dockerfile_works_on_a_distribution_python_base():
    """PYTHON_IMAGE may be a Debian/Ubuntu/NGC image: its Python has no ``python`` command and its pip
    refuses to install into a PEP 668 "externally managed" Python unless told the image is the
    environment. ``make deploy-check`` builds on such a base (Debian bookworm's python3)."""
    assert _dockerfile_env().get("PIP_BREAK_SYSTEM_PACKAGES") == "1"
    commands = [rest for word, rest in _dockerfile() if word == "RUN"]
    assert commands, "deploy/Dockerfile has no RUN"
    for rest in commands:
        words = re.split(r"[\s;&|()]+", rest.replace("-m pip", "-m_pip"))
        assert "python" not in words, f"RUN uses `python`, absent from distribution Pythons: {rest}"
        assert "pip" not in words, f"RUN uses `pip`, not `python3 -m pip`: {rest}"


def _kube_subset() -> Any:
    spec = importlib.util.spec_from_file_location("pytriton_kube_subset", DEPLOY / "check" / "kube_subset.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_played_subset_changes_only_what_podman_cannot_emulate(kube):
    """deploy-check plays a copy of the Deployment: what it keeps must be the manifest's own."""
    deployment = copy.deepcopy(kube["Deployment"])
    changes = _kube_subset().render(
        deployment, "played", "localhost/x:1", {"http": 18000, "grpc": 18001, "metrics": 18002}, "run"
    )
    original, played = _container(kube["Deployment"]), _container(deployment)
    assert played["image"] == "localhost/x:1" and deployment["spec"]["replicas"] == 1
    # Kept as written: security context, environment, resources, ports.
    assert played["securityContext"] == original["securityContext"]
    assert (
        deployment["spec"]["template"]["spec"]["securityContext"]
        == kube["Deployment"]["spec"]["template"]["spec"]["securityContext"]
    )
    assert played["env"] == original["env"] and played["resources"] == original["resources"]
    assert [(p["name"], p["containerPort"]) for p in played["ports"]] == [
        (p["name"], p["containerPort"]) for p in original["ports"]
    ]
    assert {p["hostIP"] for p in played["ports"]} == {"127.0.0.1"}
    # Probes: the same path and port, as a command; the same timing.
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = original[kind]["httpGet"]
        command = played[kind]["exec"]["command"]
        assert command[0] == "python3"
        assert f"127.0.0.1:{_port_number(original, get['port'])}{get['path']}" in command[-1]
        # podman runs the words joined by spaces through /bin/sh -c: they must survive that shell.
        assert shlex.split(" ".join(command))[:2] == ["python3", "-c"]
        assert "urlopen(" in shlex.split(" ".join(command))[2]
        assert {k: v for k, v in played[kind].items() if k != "exec"} == {
            k: v for k, v in original[kind].items() if k != "httpGet"
        }
    # Volumes: only the /dev/shm one is dropped; every other mount stays with its emptyDir.
    assert "lifecycle" not in played
    # Each named after the pod: podman shares volumes by name between pods.
    original_mounts = {m["mountPath"]: m["name"] for m in original["volumeMounts"]}
    played_mounts = {m["mountPath"]: m["name"] for m in played["volumeMounts"]}
    assert played_mounts == {path: f"played-{name}" for path, name in original_mounts.items() if path != "/dev/shm"}
    assert {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]} == set(played_mounts.values())
    assert len(changes) >= 6 and all(isinstance(change, str) for change in changes)
