#!/usr/bin/env bash
# make deploy-check: build deploy/Dockerfile on a local Debian base, run the image as the manifests
# say, drain it with SIGTERM under load, play deploy/kubernetes/ with `podman kube play` and replace
# its pod under load. Fails (exit 1) on the first step that does not hold; prints each step's time.
#
# Needs: root (or a rootful podman), podman with runc, debootstrap (first run only), the repository's
# virtualenv (PY, default .venv/bin/python, with tritonclient and PyYAML: `make server` makes it).
# Network: Debian's mirror for debootstrap and PyPI for `pip download`, both on the first run only;
# the base rootfs and the wheels are cached in $PYTRITON_HOME/deploy-check/. The image build runs
# with --network=none: `pytriton install-server` and every pip install work offline from the wheels.
# All traffic is on 127.0.0.1.
#
# Everything podman makes lives in a storage root of its own (a temporary directory), and carries
# the label pytriton-deploy-check=<run id>, on a network of its own; the exit trap removes the pods,
# containers, images, that network and directory, and the wheels it copied into deploy/wheels/, on
# success, failure and interruption alike. Environment: PY, PYTRITON_HOME, CONTAINERS_CONF,
# DEPLOY_CHECK_SUITE (bookworm), DEPLOY_CHECK_MIRROR, DEPLOY_CHECK_DRAIN_DELAY (2).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PY=${PY:-$REPO/.venv/bin/python}
PYTRITON_HOME=${PYTRITON_HOME:-$HOME/.cache/pytriton}
CACHE=$PYTRITON_HOME/deploy-check
SUITE=${DEPLOY_CHECK_SUITE:-bookworm}
# What the base holds besides minbase: Debian's Python as the Dockerfile needs it, and jemalloc (so the
# offline build skips its apt-get step). The tarball's name follows the list, so a change remakes it.
BASE_PACKAGES=python3,python3-pip,python3-venv,libpython3.11,ca-certificates,libjemalloc2
BASE_TAR=$CACHE/debian-$SUITE-$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-8)-rootfs.tar
WHEELS=$CACHE/wheels
MIRROR=${DEPLOY_CHECK_MIRROR:-http://deb.debian.org/debian}
RUN_ID=$(date +%s)-$$
LABEL=pytriton-deploy-check
BASE_IMAGE=localhost/pytriton-deploy-check-base:$SUITE
IMAGE=localhost/pytriton-example:0.1.0 # the name deploy/kubernetes/deployment.yaml runs
NET=pytriton-deploy-check-$RUN_ID # a network of our own, so that kube play makes none
mkdir -p "$CACHE"
# One run at a time: runs share the cache and the wheels copied into deploy/wheels/.
exec 9>"$CACHE/.lock"
flock -n 9 || { echo "deploy-check: another run holds $CACHE/.lock" >&2; exit 1; }
WORK=$(mktemp -d /var/tmp/pytriton-deploy-check.XXXXXX)
COPIED_WHEELS=()
LOAD_PID=""

# podman's own config for this run: runc and cgroupfs (crun fails on hybrid cgroups here) and ulimits
# within the VM's hard limits. A CONTAINERS_CONF of the caller's wins.
if [ -z "${CONTAINERS_CONF:-}" ]; then
	export CONTAINERS_CONF=$WORK/containers.conf
	cat >"$CONTAINERS_CONF" <<-'EOF'
		[containers]
		default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
		[engine]
		runtime = "runc"
		cgroup_manager = "cgroupfs"
	EOF
fi
PODMAN=(podman --root "$WORK/storage" --runroot "$WORK/run")

T_START=$(date +%s)
STEP_NAME=""
STEP_T0=0
step() {
	step_end
	STEP_NAME=$1
	STEP_T0=$(date +%s%3N)
	echo "==> $STEP_NAME"
}
step_end() {
	if [ -n "$STEP_NAME" ]; then
		local ms=$(($(date +%s%3N) - STEP_T0))
		printf '    [%s: %d.%d s]\n' "$STEP_NAME" $((ms / 1000)) $((ms % 1000 / 100))
		STEP_NAME=""
	fi
}
fail() {
	echo "deploy-check FAILED at step '$STEP_NAME': $*" >&2
	exit 1
}

cleanup() {
	local status=$?
	set +e
	step_end
	echo "==> cleanup (everything labelled $LABEL=$RUN_ID, storage $WORK)"
	if [ -n "$LOAD_PID" ]; then kill "$LOAD_PID" 2>/dev/null; wait "$LOAD_PID" 2>/dev/null; fi
	if [ -d "$WORK/storage" ]; then
		for yaml in "$WORK"/kube-*.yaml; do
			[ -f "$yaml" ] && "${PODMAN[@]}" kube down "$yaml" >/dev/null 2>&1
		done
		"${PODMAN[@]}" pod rm -f --filter "label=$LABEL=$RUN_ID" >/dev/null 2>&1
		"${PODMAN[@]}" pod rm -af -t 0 >/dev/null 2>&1
		"${PODMAN[@]}" rm -af -t 0 >/dev/null 2>&1
		"${PODMAN[@]}" rmi -af >/dev/null 2>&1
		# Networks are host-wide (/etc/containers/networks), whatever the storage root: remove ours
		# by name and label only (never `system reset`, which removes every network).
		"${PODMAN[@]}" network rm -f "$NET" >/dev/null 2>&1
		"${PODMAN[@]}" network ls --filter "label=$LABEL=$RUN_ID" -q | xargs -r "${PODMAN[@]}" network rm -f >/dev/null 2>&1
	fi
	# Whatever is still mounted below WORK (overlay layers, a debootstrap's /proc), deepest first, and
	# never cross into another filesystem while removing it.
	for mount in $(findmnt -rn -o TARGET | grep -F "$WORK" | sort -r); do umount -l "$mount"; done
	for wheel in "${COPIED_WHEELS[@]}"; do rm -f "$wheel"; done
	rm -rf --one-file-system "$WORK"
	printf 'deploy-check: %s in %d s\n' "$([ $status = 0 ] && echo passed || echo FAILED)" $(($(date +%s) - T_START))
	exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_running_ready() { # wait_running_ready CONTAINER HTTP_PORT: ready within 180 s, or fail early with its log if it exits
	local i
	for i in $(seq 90); do
		"$PY" deploy/check/traffic.py wait-ready "$2" --timeout 2 2>/dev/null && return 0
		if [ "$("${PODMAN[@]}" inspect "$1" --format '{{.State.Status}}' 2>&1)" != running ]; then break; fi
	done
	"${PODMAN[@]}" logs --tail 40 "$1" 2>&1
	fail "$1 did not become ready on 127.0.0.1:$2 (state: $("${PODMAN[@]}" inspect "$1" --format '{{.State.Status}}' 2>&1))"
}
# pip download, without the warnings of a pip.conf that names find-links folders absent here.
pip_download() { "$PY" -m pip download "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ---------------------------------------------------------------------------------------------
step "prerequisites"
for tool in podman runc curl findmnt flock; do command -v "$tool" >/dev/null || fail "$tool not found (apt-get install -y podman runc buildah slirp4netns debootstrap)"; done
[ "$(id -u)" = 0 ] || fail "run as root: the check uses rootful podman (kube play hostPort, --root storage)"
"$PY" -c 'import tritonclient.grpc, tritonclient.http, yaml, numpy' || fail "$PY lacks tritonclient/PyYAML: run make server"
"${PODMAN[@]}" version --format 'podman {{.Client.Version}}'
echo "storage root $WORK/storage, CONTAINERS_CONF=$CONTAINERS_CONF"

# ---------------------------------------------------------------------------------------------
step "base image (Debian $SUITE with its python3, from a cached rootfs tarball)"
if [ ! -f "$BASE_TAR" ]; then
	command -v debootstrap >/dev/null || fail "debootstrap not found (apt-get install -y debootstrap)"
	mkdir -p "$CACHE"
	echo "no $BASE_TAR yet: debootstrap $SUITE from $MIRROR (once; a few minutes)"
	debootstrap --variant=minbase --include="$BASE_PACKAGES" \
		"$SUITE" "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
		tail -20 "$WORK/debootstrap.log"
		fail "debootstrap failed"
	}
	# debootstrap can leave /proc (and /sys) of the new root mounted: never archive the host's.
	for mount in $(findmnt -rn -o TARGET | grep -F "$WORK/rootfs" | sort -r); do umount -l "$mount"; done
	# Left as Debian made it (no `python` command, pip marked externally managed by PEP 668), like
	# Ubuntu-based images such as NVIDIA's: the Dockerfile must work on that as on python:3.x-slim.
	rm -rf "$WORK"/rootfs/var/lib/apt/lists/* "$WORK"/rootfs/var/cache/apt/*.bin "$WORK"/rootfs/var/cache/apt/archives/*.deb
	tar --numeric-owner --one-file-system -C "$WORK/rootfs" -cf "$BASE_TAR.partial" .
	mv "$BASE_TAR.partial" "$BASE_TAR"
	find "$CACHE" -maxdepth 1 -name "debian-*-rootfs.tar" ! -path "$BASE_TAR" -delete # older package lists
	rm -rf "$WORK/rootfs"
fi
ls -l "$BASE_TAR"
"${PODMAN[@]}" import --quiet --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin' \
	"$BASE_TAR" "$BASE_IMAGE" >/dev/null
"${PODMAN[@]}" run --rm --label "$LABEL=$RUN_ID" --network=none "$BASE_IMAGE" python3 -c 'import sys, sysconfig; print("base:", sys.version.split()[0], "shared libpython:", sysconfig.get_config_var("INSTSONAME"))'

# ---------------------------------------------------------------------------------------------
step "wheels for the offline build (cached in $WHEELS)"
stamp=$(cat pyproject.toml examples/production/requirements.txt | sha256sum | cut -c1-16)
if [ ! -f "$WHEELS/.complete-$stamp" ]; then
	mkdir -p "$WHEELS"
	plat=(--platform manylinux_2_35_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --python-version 3.11 --only-binary=:all:)
	pip=(pip_download --quiet --disable-pip-version-check -d "$WHEELS")
	"${pip[@]}" "${plat[@]}" --no-deps nvidia-pytriton==0.7.0
	"${pip[@]}" "${plat[@]}" "numpy>=1.21,<2"
	deps=$("$PY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
	mapfile -t deps <<<"$deps"
	"${pip[@]}" "${plat[@]}" "${deps[@]}" dumb-init==1.2.5.post1
	"${pip[@]}" --only-binary=:all: "setuptools>=68" wheel
	"${pip[@]}" "${plat[@]}" -r examples/production/requirements.txt
	touch "$WHEELS/.complete-$stamp"
fi
for wheel in "$WHEELS"/*.whl; do
	target=deploy/wheels/$(basename "$wheel")
	if [ ! -e "$target" ]; then
		cp "$wheel" "$target"
		COPIED_WHEELS+=("$REPO/$target")
	fi
done
echo "$(ls "$WHEELS"/*.whl | wc -l) wheels; ${#COPIED_WHEELS[@]} copied into deploy/wheels/ for this build (removed at the end)"

# ---------------------------------------------------------------------------------------------
step "image build (deploy/Dockerfile, PYTHON_IMAGE=$BASE_IMAGE, PIP_OFFLINE=1, --network=none)"
"${PODMAN[@]}" build --pull=never --network=none --layers \
	--ignorefile deploy/Dockerfile.dockerignore -f deploy/Dockerfile \
	--build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg PIP_OFFLINE=1 \
	--label "$LABEL=$RUN_ID" -t "$IMAGE" . >"$WORK/build.log" 2>&1 || {
	tail -40 "$WORK/build.log"
	fail "image build failed (log above)"
}
# What install-server and the build's `pytriton check` said (the full log is in the build's output).
grep -E '^STEP [0-9]+/' "$WORK/build.log" | tail -1 | cut -c1-60
grep -viE '^(STEP|COMMIT|-->|Getting image|Writing manifest|Storing signatures|Copying (blob|config)|[0-9a-f]{64}$)' "$WORK/build.log" |
	grep -iE 'server|wheel|sha256|numpy|stub|check' | cut -c1-200 | tail -15 || true
"${PODMAN[@]}" image inspect "$IMAGE" --format 'image {{.Id}} user={{.Config.User}} cmd={{.Config.Cmd}} size={{.Size}}' | cut -c1-200

# ---------------------------------------------------------------------------------------------
step "container: read-only root, non-root user, HTTP and gRPC from the host"
"${PODMAN[@]}" network create --disable-dns --label "$LABEL=$RUN_ID" "$NET" >/dev/null
HTTP=$(free_port) GRPC=$(free_port) METRICS=$(free_port)
# As deployment.yaml: read-only root; writable tmpfs on /tmp, /dev/shm (512m), /workspace and the home
# directory, owned by the image's user; no capabilities, no privilege escalation. A drain delay of
# 2 s (DEPLOY_CHECK_DRAIN_DELAY): without a load balancer and a preStop hook, clients see readiness
# go off before new requests are refused (docs/deployment.md).
"${PODMAN[@]}" run -d --name "deploy-check-$RUN_ID" --label "$LABEL=$RUN_ID" \
	--read-only --tmpfs /tmp:rw,size=64m,mode=1777 --shm-size=512m \
	--tmpfs /workspace:rw,size=64m,mode=0700,U \
	--tmpfs /home/triton:rw,size=256m,mode=0700,U \
	--cap-drop=ALL --security-opt=no-new-privileges --network "$NET" \
	-e "PYTRITON_TRITON_CONFIG_DRAIN_DELAY_SECS=${DEPLOY_CHECK_DRAIN_DELAY:-2}" -e PYTRITON_TRITON_CONFIG_EXIT_TIMEOUT_SECS=30 \
	-p "127.0.0.1:$HTTP:8000" -p "127.0.0.1:$GRPC:8001" -p "127.0.0.1:$METRICS:8002" \
	"$IMAGE" >/dev/null
CTR=deploy-check-$RUN_ID
wait_running_ready "$CTR" "$HTTP"
uid=$("${PODMAN[@]}" exec "$CTR" id -u)
[ "$uid" = 1000 ] || fail "the server runs as uid $uid, not 1000"
if "${PODMAN[@]}" exec "$CTR" sh -c 'touch /app/x || touch /usr/x || touch /opt/pytriton/x' 2>/dev/null; then fail "the root filesystem is writable"; fi
"${PODMAN[@]}" exec "$CTR" sh -c 'ps -o user=,args= -p 1 2>/dev/null || cat /proc/1/cmdline | tr "\0" " "'
echo
echo "server process uid $uid, root filesystem read-only (touch in /app, /usr, /opt/pytriton refused)"
# The server runs with jemalloc (the Dockerfile's JEMALLOC step; the base has it): mapped in tritonserver.
jemalloc=$("${PODMAN[@]}" exec "$CTR" sh -c 'for p in /proc/[0-9]*; do if tr "\0" " " <$p/cmdline 2>/dev/null | grep -q "^[^ ]*bin/tritonserver"; then grep -c libjemalloc $p/maps; fi; done' | head -1)
[ "${jemalloc:-0}" -gt 0 ] || fail "tritonserver in the container does not use jemalloc"
echo "tritonserver maps libjemalloc ($jemalloc mappings)"
"$PY" deploy/check/traffic.py probes "$HTTP"
"$PY" deploy/check/traffic.py smoke --http "$HTTP" --grpc "$GRPC"
metrics=$(curl -fsS "http://127.0.0.1:$METRICS/metrics") || fail "no metrics on 127.0.0.1:$METRICS"
grep '^nv_inference_request_success' <<<"$metrics" || fail "no nv_inference_request_success in the metrics"

# ---------------------------------------------------------------------------------------------
step "SIGTERM under load: in-flight requests drain, none fails"
echo "$HTTP" >"$WORK/endpoints-container"
"$PY" deploy/check/traffic.py load --endpoints "$WORK/endpoints-container" --threads 8 --max-seconds 60 \
	--until-unready --started-file "$WORK/load-started" --signal-file "$WORK/signal-at" --out "$WORK/drain.json" &
LOAD_PID=$!
for _ in $(seq 100); do [ -f "$WORK/load-started" ] && break; sleep 0.1; done
sleep 3
"$PY" -c 'import time; print(time.time())' >"$WORK/signal-at"
"${PODMAN[@]}" kill --signal TERM "$CTR" >/dev/null
wait "$LOAD_PID" || { LOAD_PID=""; fail "requests failed during the drain: $(cat "$WORK/drain.json" 2>/dev/null)"; }
LOAD_PID=""
code=$(timeout 60 "${PODMAN[@]}" wait "$CTR") || fail "the container did not stop within 60 s of SIGTERM"
[ "$code" = 0 ] || { "${PODMAN[@]}" logs --tail 30 "$CTR"; fail "the container exited with $code after SIGTERM, not 0"; }
echo "drain: $(cat "$WORK/drain.json"); container exit status $code"
"$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d["in_flight_at_signal"] > 0 else 1)' "$WORK/drain.json" ||
	fail "no request was in flight when SIGTERM was sent: the drain was not tested"
"${PODMAN[@]}" rm "$CTR" >/dev/null

# ---------------------------------------------------------------------------------------------
play() { # play NAME HTTP GRPC METRICS: the Deployment's playable subset as one pod
	local name=$1
	"$PY" deploy/check/kube_subset.py deploy/kubernetes/deployment.yaml --name "$name" --image "$IMAGE" \
		--label "$RUN_ID" --http "$2" --grpc "$3" --metrics "$4" --out "$WORK/kube-$name.yaml"
	"${PODMAN[@]}" kube play --start --network "$NET" "$WORK/kube-$name.yaml" >"$WORK/play-$name.log" 2>&1 || {
		cat "$WORK/play-$name.log"
		fail "podman kube play $name failed"
	}
	wait_running_ready "$name-pod-0-server" "$2"
}
# podman schedules periodic health checks with systemd timers; on a host without systemd (this
# kind of machine) it cannot, so the check runs podman's health check (the liveness probe) itself.
probes_pass() { # probes_pass NAME: podman's health checks (the probes) and the same GETs from the host
	local ctr=$1-pod-0-server # podman names a Deployment's pod NAME-pod-0
	for _ in $(seq 30); do
		"${PODMAN[@]}" healthcheck run "$ctr" >/dev/null 2>&1 && break
		sleep 1
	done
	"${PODMAN[@]}" healthcheck run "$ctr" || {
		"${PODMAN[@]}" logs --tail 30 "$ctr" 2>&1 | cut -c1-300
		"${PODMAN[@]}" inspect "$ctr" --format 'state {{.State.Status}} exit {{.State.ExitCode}} restarts {{.RestartCount}} health {{json .State.Health}}' 2>&1 | cut -c1-1500
		fail "podman's health check (the liveness probe) of $ctr fails"
	}
	echo "podman healthcheck of $ctr: $("${PODMAN[@]}" inspect "$ctr" --format '{{.State.Health.Status}}' 2>/dev/null)"
	"$PY" deploy/check/traffic.py probes "$2"
}

step "kube play deploy/kubernetes/deployment.yaml (subset below); probes pass; the model answers"
A_HTTP=$(free_port) A_GRPC=$(free_port) A_METRICS=$(free_port)
play pytriton-example-a "$A_HTTP" "$A_GRPC" "$A_METRICS"
probes_pass pytriton-example-a "$A_HTTP"
ctr=pytriton-example-a-pod-0-server
echo "container $ctr: user $("${PODMAN[@]}" inspect "$ctr" --format '{{.Config.User}} readonly={{.HostConfig.ReadonlyRootfs}}')"
"$PY" deploy/check/traffic.py smoke --http "$A_HTTP" --grpc "$A_GRPC"

# ---------------------------------------------------------------------------------------------
step "pod replacement under load (second pod ready, first out of the endpoints, preStop 5 s, SIGTERM)"
# service.yaml's part: the load generator sends to the ports in this file, re-read per request,
# as kube-proxy sends to the Service's ready endpoints.
echo "$A_HTTP" >"$WORK/endpoints"
"$PY" deploy/check/traffic.py load --endpoints "$WORK/endpoints" --threads 8 --max-seconds 240 \
	--stop-file "$WORK/stop-load" --started-file "$WORK/load2-started" --out "$WORK/replace.json" &
LOAD_PID=$!
for _ in $(seq 100); do [ -f "$WORK/load2-started" ] && break; sleep 0.1; done
B_HTTP=$(free_port) B_GRPC=$(free_port) B_METRICS=$(free_port)
play pytriton-example-b "$B_HTTP" "$B_GRPC" "$B_METRICS"
probes_pass pytriton-example-b "$B_HTTP"
echo "$A_HTTP $B_HTTP" >"$WORK/endpoints.new" && mv "$WORK/endpoints.new" "$WORK/endpoints"
sleep 2
echo "$B_HTTP" >"$WORK/endpoints.new" && mv "$WORK/endpoints.new" "$WORK/endpoints"
sleep 5 # the preStop sleep: the old pod leaves the endpoints, then gets SIGTERM
"${PODMAN[@]}" pod stop -t 45 pytriton-example-a-pod-0 >>"$WORK/down.log" 2>&1 || {
	cat "$WORK/down.log"
	fail "podman pod stop of the old pod failed"
}
code=$("${PODMAN[@]}" inspect pytriton-example-a-pod-0-server --format '{{.State.ExitCode}}')
[ "$code" = 0 ] || fail "the old pod's server exited with $code after SIGTERM, not 0"
"${PODMAN[@]}" kube down "$WORK/kube-pytriton-example-a.yaml" >>"$WORK/down.log" 2>&1
rm "$WORK/kube-pytriton-example-a.yaml"
sleep 2
touch "$WORK/stop-load"
wait "$LOAD_PID" || { LOAD_PID=""; fail "requests failed during the replacement: $(cat "$WORK/replace.json" 2>/dev/null)"; }
LOAD_PID=""
echo "replacement: $(cat "$WORK/replace.json"); old pod's server exit status $code"
"$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if all(d["per_port"].get(p, 0) > 0 for p in sys.argv[2:]) else 1)' \
	"$WORK/replace.json" "$A_HTTP" "$B_HTTP" || fail "the load did not reach both pods"
"${PODMAN[@]}" kube down "$WORK/kube-pytriton-example-b.yaml" >>"$WORK/down.log" 2>&1
rm "$WORK/kube-pytriton-example-b.yaml"
step_end
