# Sourced by deploy/smoke-container.sh and deploy/smoke-compose.sh: podman settings that work on these hosts
# (as root, no container registry), and the base image both builds start from.
# Sets: cache, base_image, ca_bundle, python, CONTAINERS_CONF.
cache=${ATTNSERVE_CACHE:-$HOME/.cache/attnserve}/container
base_tar=$cache/base-bookworm.tar
base_image=localhost/attnserve-base:bookworm
ca_bundle=/etc/ssl/certs/ca-certificates.crt
python=${PYTHON:-.venv/bin/python}
mkdir -p "$cache"

# crun fails on this host's hybrid cgroups; the default ulimits are refused without CAP_SYS_RESOURCE.
# A private containers.conf (CONTAINERS_CONF) leaves the machine's podman settings alone.
export CONTAINERS_CONF=$cache/containers.conf
cat > "$CONTAINERS_CONF" <<CONF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF

# The base: a minimal Debian with Python, from the mirror this machine's apt uses (cached as a tarball).
if [[ ! -s $base_tar ]]; then
  sources=$(ls /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 || true)
  mirror=${sources:-/etc/apt/sources.list}
  # --format: the ".part" name would otherwise make mmdebstrap write a directory, not a tarball.
  mmdebstrap --variant=minbase --format=tar --include=python3,python3-venv,ca-certificates bookworm "$base_tar.part" "$mirror"
  mv "$base_tar.part" "$base_tar"
fi
podman image exists "$base_image" || podman import "$base_tar" "$base_image" >/dev/null
