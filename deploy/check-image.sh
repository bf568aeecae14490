#!/usr/bin/env bash
# Build the Dockerfile's image and check it serves, without Docker Hub or a Docker daemon
# (`make image-check`, docs/deploy.md). Run as root on Debian (or a derivative with apt-get).
#
#   1. installs buildah, podman, runc and debootstrap with apt-get if any is missing;
#   2. builds a base image from Debian (debootstrap --variant=minbase, with python3, python3-venv,
#      python3-pip) and imports it as $BASE_IMAGE (kept: REBUILD_BASE=1 makes it again);
#   3. builds the Dockerfile with buildah, that image as its BASE_IMAGE (docker format, so the
#      image keeps its HEALTHCHECK), from a copy of what .dockerignore lets in;
#   4. runs it with podman, a fresh volume on /data and the port published on loopback, and waits
#      until the image's own HEALTHCHECK passes;
#   5. checks the server runs as uid 10001, creates a memory and finds it again with
#      tiermem.client (from the host through the published port when the host has tiermem
#      installed, else inside the container);
#   6. stops the container (SIGTERM), starts a new one on the same volume and checks the memory is
#      still there;
#   7. removes its containers and volume. The images stay ($IMAGE, its build stage $IMAGE-build
#      and the base), so a second run only rebuilds what changed; remove them with
#      podman rmi localhost/tiermem:check localhost/tiermem:check-build localhost/tiermem-base:bookworm
#
# Settings (environment): IMAGE, BASE_IMAGE, SUITE, MIRROR, WORK_DIR, REBUILD_BASE=1,
# STORAGE_DRIVER (e.g. vfs where overlay does not work), RUNTIME (default runc: crun refuses hosts
# with cgroups v1 and v2 mixed), PYTHON (the host's interpreter with tiermem installed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${IMAGE:-localhost/tiermem:check}
BASE_IMAGE=${BASE_IMAGE:-localhost/tiermem-base:bookworm}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
WORK_DIR=${WORK_DIR:-/var/tmp/tiermem-image-check}
RUNTIME=${RUNTIME:-runc}
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
NAME=tiermem-check-$$
VOLUME=tiermem-check-$$
UID_EXPECTED=10001
LOG=$WORK_DIR/check-image.log

STORAGE=()
if [[ -n ${STORAGE_DRIVER:-} ]]; then STORAGE=(--storage-driver "$STORAGE_DRIVER"); fi

START=$SECONDS
STEP_START=$SECONDS
step() { STEP_START=$SECONDS; printf '==> %s\n' "$*"; }
ok() { printf '    ok (%ss) %s\n' "$((SECONDS - STEP_START))" "$*"; }
fail() {
    printf '    FAILED: %s\n' "$*" >&2
    if [[ -s $LOG ]]; then printf '    last lines of %s:\n' "$LOG" >&2; tail -n 30 "$LOG" | sed 's/^/    | /' >&2; fi
    exit 1
}

if [[ $(id -u) -ne 0 ]]; then
    echo "check-image.sh: run as root (debootstrap and rootful podman need it)" >&2
    exit 2
fi
mkdir -p "$WORK_DIR"
: >"$LOG"

cleanup() {
    podman "${STORAGE[@]}" rm -f -t 5 "$NAME" "$NAME-2" >/dev/null 2>&1 || true
    podman "${STORAGE[@]}" volume rm -f "$VOLUME" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# Limits the container may have: podman's defaults (over a million open files) are above what a
# process without CAP_SYS_RESOURCE may set, so ask for the host's own (capped).
NOFILE=$(ulimit -Hn)
if [[ $NOFILE == unlimited || $NOFILE -gt 65536 ]]; then NOFILE=65536; fi
NPROC=$(ulimit -Hu)
if [[ $NPROC == unlimited || $NPROC -gt 32768 ]]; then NPROC=32768; fi
RUN_OPTS=(--runtime "$RUNTIME" --ulimit "nofile=$NOFILE:$NOFILE" --ulimit "nproc=$NPROC:$NPROC")

# 1. Tools.
step "tools: buildah, podman, $RUNTIME, debootstrap"
missing=()
for tool in buildah podman "$RUNTIME" debootstrap; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get -o DPkg::Lock::Timeout=600 update -q \
        && apt-get -o DPkg::Lock::Timeout=600 install -y -q "${missing[@]}"; } >>"$LOG" 2>&1 \
        || fail "apt-get install ${missing[*]}"
fi
ok "$(buildah --version | cut -d' ' -f1-3), $(podman --version)${missing:+ (installed: ${missing[*]})}"

# 2. Base image: Debian with its Python, instead of python:*-slim from Docker Hub.
step "base image $BASE_IMAGE (debootstrap $SUITE)"
if [[ ${REBUILD_BASE:-0} != 1 ]] && podman "${STORAGE[@]}" image exists "$BASE_IMAGE"; then
    ok "already there (REBUILD_BASE=1 makes it again)"
else
    old_base=$(podman "${STORAGE[@]}" image inspect "$BASE_IMAGE" --format '{{.Id}}' 2>/dev/null || true)
    rootfs=$WORK_DIR/rootfs
    rm -rf "$rootfs"
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
        "$SUITE" "$rootfs" "$MIRROR" >>"$LOG" 2>&1 || fail "debootstrap $SUITE"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman "${STORAGE[@]}" import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >>"$LOG" 2>&1 \
        || fail "podman import $BASE_IMAGE"
    rm -rf "$rootfs"
    # The base it replaces goes now, or with the images built on it (step 3).
    if [[ -n $old_base ]]; then podman "${STORAGE[@]}" rmi "$old_base" >>"$LOG" 2>&1 || true; fi
    ok "$(podman "${STORAGE[@]}" image inspect "$BASE_IMAGE" --format '{{.Size}}') bytes"
fi

# 3. The image, from the Dockerfile. The host's CA bundle is mounted (read-only, RUN steps only, not
# kept in the image) so pip and apt work behind a proxy that re-signs TLS; --format docker keeps the
# HEALTHCHECK (the OCI format has none).
step "build $IMAGE from Dockerfile (BASE_IMAGE=$BASE_IMAGE)"
CA_MOUNT=()
if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
    CA_MOUNT=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
fi
# The build stage is tagged too ($IMAGE-build): its layers stay cached for the next run, and the
# images this build replaces are removed (with their untagged layers) instead of piling up.
image_id() { podman "${STORAGE[@]}" image inspect "$1" --format '{{.Id}}' 2>/dev/null || true; }
old_ids=("$(image_id "$IMAGE")" "$(image_id "$IMAGE-build")")
# Both builds read one copy of the context (what .dockerignore lets in), taken now: the checkout may
# change while they run.
context=$WORK_DIR/context
rm -rf "$context" && mkdir -p "$context"
cp "$ROOT/Dockerfile" "$ROOT/.dockerignore" "$context/"
sed -n 's|^!\([^*?]*\)$|\1|p' "$ROOT/.dockerignore" | while read -r entry; do
    if [[ -e $ROOT/$entry ]]; then cp -a "$ROOT/${entry%/}" "$context/"; fi
done
build() { # tag [buildah build options]
    buildah "${STORAGE[@]}" build --layers --format docker --isolation chroot \
        --ulimit "nofile=$NOFILE:$NOFILE" "${CA_MOUNT[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        -t "$1" "${@:2}" -f "$context/Dockerfile" "$context" >>"$LOG" 2>&1
}
build "$IMAGE-build" --target build || fail "buildah build --target build"
build "$IMAGE" || fail "buildah build"
for id in "${old_ids[@]}"; do
    if [[ -n $id && $id != "$(image_id "$IMAGE")" && $id != "$(image_id "$IMAGE-build")" ]]; then
        podman "${STORAGE[@]}" rmi "$id" >>"$LOG" 2>&1 || true
    fi
done
user=$(podman "${STORAGE[@]}" image inspect "$IMAGE" --format '{{.User}}')
health=$(podman "${STORAGE[@]}" image inspect "$IMAGE" --format '{{.HealthCheck.Test}}')
[[ $health == *"tiermem health"* ]] || fail "the image has no HEALTHCHECK running tiermem health ($health)"
ok "user $user, healthcheck $health, $(podman "${STORAGE[@]}" image inspect "$IMAGE" --format '{{.Size}}') bytes"

# 4. Run it and wait for the image's HEALTHCHECK (podman's timer needs systemd: run it by hand).
start_container() { # name
    podman "${STORAGE[@]}" run -d --name "$1" "${RUN_OPTS[@]}" -p 127.0.0.1::50051 \
        -v "$VOLUME:/data" "$IMAGE" >>"$LOG" 2>&1 || fail "podman run $1"
    local i
    for ((i = 0; i < 180; i++)); do
        if podman "${STORAGE[@]}" healthcheck run "$1" >/dev/null 2>&1; then return 0; fi
        [[ $(podman "${STORAGE[@]}" inspect "$1" --format '{{.State.Running}}') == true ]] || break
        sleep 1
    done
    podman "${STORAGE[@]}" logs "$1" >>"$LOG" 2>&1 || true
    fail "$1 did not pass its HEALTHCHECK"
}
step "run $NAME (volume $VOLUME on /data) until its HEALTHCHECK passes"
podman "${STORAGE[@]}" volume create "$VOLUME" >/dev/null
start_container "$NAME"
ok "healthy"

step "tiermem health --target 127.0.0.1:50051 --timeout 5 (the HEALTHCHECK's command) in $NAME"
out=$(podman "${STORAGE[@]}" exec "$NAME" tiermem health --target 127.0.0.1:50051 --timeout 5 2>&1) \
    || fail "tiermem health: $out"
ok "$out"

# 5. uid, and a memory written and found.
step "the server runs as uid $UID_EXPECTED"
pid1_uid=$(podman "${STORAGE[@]}" top "$NAME" huser | awk 'NR == 2 {print $1}')
exec_uid=$(podman "${STORAGE[@]}" exec "$NAME" id -u)
[[ $pid1_uid == "$UID_EXPECTED" && $exec_uid == "$UID_EXPECTED" ]] \
    || fail "uid of the server $pid1_uid, of exec $exec_uid"
ok "$(podman "${STORAGE[@]}" top "$NAME" huser user args | sed -n 2p | tr -s ' ')"

# The client: from the host through the published port when the host has tiermem, else inside.
CLIENT_PY=$(
    cat <<'EOF'
import sys
from tiermem.client import MemoryClient

target, phase = sys.argv[1], sys.argv[2]
query = "where does the container keep its memories"
with MemoryClient(target, timeout=10) as c:
    c.wait_ready(60)
    if phase == "write":
        m = c.create("image-check", "the container keeps its memories in the /data volume")
        memory_id = m.id
    else:
        memory_id = sys.argv[3]
        assert c.get("image-check", memory_id).content.endswith("/data volume")
    found = [r.memory.id for r in c.search("image-check", query, limit=5)]
    assert memory_id in found, (memory_id, found)
    print(memory_id)
EOF
)
client() { # container phase [id]
    if "$PYTHON" -c 'import tiermem.client' >/dev/null 2>&1; then
        local port
        port=$(podman "${STORAGE[@]}" port "$1" 50051/tcp | sed -n '1s/.*://p')
        "$PYTHON" -c "$CLIENT_PY" "127.0.0.1:$port" "${@:2}"
    else
        podman "${STORAGE[@]}" exec "$1" python -c "$CLIENT_PY" 127.0.0.1:50051 "${@:2}"
    fi
}
where="inside the container"
if "$PYTHON" -c 'import tiermem.client' >/dev/null 2>&1; then where="from the host ($PYTHON)"; fi
step "create a memory and search for it with tiermem.client, $where"
memory_id=$(client "$NAME" write 2>>"$LOG") || fail "create + search"
ok "created and found $memory_id"

# 6. Stop (SIGTERM, the server snapshots), a new container on the same volume.
step "stop $NAME, run $NAME-2 on the same volume, find the memory again"
podman "${STORAGE[@]}" stop -t 120 "$NAME" >>"$LOG" 2>&1 || fail "podman stop"
code=$(podman "${STORAGE[@]}" inspect "$NAME" --format '{{.State.ExitCode}}')
[[ $code == 0 ]] || fail "$NAME exited with $code on SIGTERM"
podman "${STORAGE[@]}" rm "$NAME" >>"$LOG" 2>&1 || fail "podman rm $NAME"
start_container "$NAME-2"
client "$NAME-2" read "$memory_id" >/dev/null 2>>"$LOG" || fail "the memory did not survive the restart"
loaded=$(podman "${STORAGE[@]}" logs "$NAME-2" 2>&1 | grep -o 'loaded [0-9]* memories.*' | head -1)
ok "stopped with exit 0; $loaded"

podman "${STORAGE[@]}" stop -t 120 "$NAME-2" >>"$LOG" 2>&1 || true
printf 'image check passed in %ss: %s\n' "$((SECONDS - START))" "$IMAGE"
