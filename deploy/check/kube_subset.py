"""The part of ``deploy/kubernetes/deployment.yaml`` that ``podman kube play`` can run, for ``deploy/deploy_check.sh``.

Reads the Deployment as users apply it and writes a copy for one pod on this machine; every change
is printed (``subset: ...``) so that the check's output says exactly what podman did not emulate:

* ``replicas: 1`` and a name of our own (the check plays two Deployments to replace a pod);
* the image: the one the check built;
* ``hostPort``/``hostIP 127.0.0.1`` on the three ports: podman publishes ``hostPort`` (there is no
  Service proxy, ``service.yaml`` is played by the check's load generator instead, see
  deploy_check.sh);
* the ``httpGet`` probes become ``exec`` probes doing the same GET with the image's Python: podman
  runs a probe as a command inside the container and writes ``httpGet`` as ``curl``, which the image
  (like python:3.x-slim) does not have. The check also GETs the same paths from the host;
* ``lifecycle.preStop`` is dropped (podman 4.3 does not run it); the check waits the same 5 s
  between taking the pod out of the endpoints and stopping it;
* the ``/dev/shm`` emptyDir is dropped: podman makes emptyDirs volumes on disk owned by the pod's
  user, except on ``/dev/shm``, where it stays root-owned and the non-root server could not write;
  the pod's own ``/dev/shm`` (tmpfs, 64 MiB) serves instead. The other emptyDirs are played on disk
  (``medium`` and ``sizeLimit`` are not emulated), renamed ``<pod>-<volume>``: podman 4.3 makes an
  emptyDir a volume named as in the manifest, which two pods played side by side would share;
* a label ``pytriton-deploy-check`` on the pod, by which the check finds and removes what it made.

Everything else (security context: non-root user, read-only root, no privilege escalation, dropped
capabilities; environment; resources) is played as written.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys
from typing import Any, Dict, List

import yaml

PROBE_SCRIPT = (
    "import sys, urllib.request; "
    'sys.exit(0 if urllib.request.urlopen("http://127.0.0.1:{port}{path}", timeout={timeout}).status == 200 else 1)'
)


def render(deployment: Dict[str, Any], name: str, image: str, host_ports: Dict[str, int], label: str) -> List[str]:
    """Edit ``deployment`` in place into the playable subset; returns one line per change."""
    changes: List[str] = []
    deployment["metadata"]["name"] = name
    deployment["metadata"].setdefault("labels", {})["pytriton-deploy-check"] = label
    spec = deployment["spec"]
    spec["replicas"] = 1
    changes.append(f"replicas: 1, name {name} (the HorizontalPodAutoscaler owns the count in a cluster)")
    pod = spec["template"]
    pod["metadata"].setdefault("labels", {})["pytriton-deploy-check"] = label
    (container,) = pod["spec"]["containers"]
    container["image"] = image
    ports = {port["name"]: port for port in container["ports"]}
    for port_name, host_port in host_ports.items():
        ports[port_name]["hostPort"] = host_port
        ports[port_name]["hostIP"] = "127.0.0.1"
    changes.append(
        "hostPort on 127.0.0.1: " + ", ".join(f"{n} {ports[n]['containerPort']} -> {p}" for n, p in host_ports.items())
    )
    numbers = {port["name"]: port["containerPort"] for port in container["ports"]}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if probe is None or "httpGet" not in probe:
            continue
        get = probe.pop("httpGet")
        port = numbers.get(get["port"], get["port"])
        script = PROBE_SCRIPT.format(port=port, path=get["path"], timeout=probe.get("timeoutSeconds", 1))
        # podman joins an exec probe's words with spaces and runs them with `/bin/sh -c`: quote the
        # script for that shell (in a cluster the kubelet would exec the words as they are).
        probe["exec"] = {"command": ["python3", "-c", shlex.quote(script)]}
        changes.append(
            f"{kind}: httpGet {get['path']} on {get['port']} -> exec python3 GET 127.0.0.1:{port}{get['path']}"
        )
    if container.pop("lifecycle", None) is not None:
        changes.append("lifecycle.preStop dropped (podman does not run it); the check waits 5 s itself")
    # podman makes each emptyDir a volume on disk owned by runAsUser (medium and sizeLimit are not
    # emulated), which works for /tmp, /workspace and the home directory. On /dev/shm podman leaves
    # that volume root-owned 0755, so the non-root server could not create its shared memory there:
    # the pod keeps podman's own /dev/shm (tmpfs, mode 1777, 64 MiB), enough for the check's
    # requests. In Kubernetes the Memory emptyDir is a tmpfs writable by the pod's user.
    volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes", [])}
    for mount in list(container.get("volumeMounts", [])):
        if mount["mountPath"] == "/dev/shm":
            container["volumeMounts"].remove(mount)
            volumes.pop(mount["name"], None)
            changes.append(
                f"volume {mount['name']} on /dev/shm dropped: podman's pod /dev/shm (tmpfs, 64 MiB) serves instead"
            )
    # podman 4.3 makes an emptyDir a *named* volume, named as in the manifest: two pods played from
    # the same manifest would share /tmp and /workspace. Each pod's volumes get its name as prefix.
    for volume in volumes.values():
        volume["name"] = f"{name}-{volume['name']}"
    for mount in container.get("volumeMounts", []):
        mount["name"] = f"{name}-{mount['name']}"
    pod["spec"]["volumes"] = list(volumes.values())
    kept = [f"{m['name']} on {m['mountPath']}" for m in container.get("volumeMounts", [])]
    changes.append(
        "emptyDir volumes played as podman volumes on disk, named after the pod (podman shares volumes by name;"
        " medium and sizeLimit not emulated): " + ", ".join(kept)
    )
    return changes


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("deployment", type=pathlib.Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--label", required=True)
    parser.add_argument("--http", type=int, required=True)
    parser.add_argument("--grpc", type=int, required=True)
    parser.add_argument("--metrics", type=int, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args(argv)
    deployment = yaml.safe_load(args.deployment.read_text())
    changes = render(
        deployment, args.name, args.image, {"http": args.http, "grpc": args.grpc, "metrics": args.metrics}, args.label
    )
    args.out.write_text(yaml.safe_dump(deployment, sort_keys=False))
    for change in changes:
        print(f"subset: {change}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
