#!/usr/bin/env bash
# Build the local Debian base image of the agiledart images with debootstrap and
# `docker import`, for machines that cannot pull from a registry (air-gapped edge sites,
# CI without registry access). It needs root, debootstrap and a Debian mirror (a local
# mirror or apt-cacher works: --mirror), nothing else.
#
#   docker/build-base.sh                      # -> image agiledart/base:bookworm
#   docker build --build-arg BASE_IMAGE=agiledart/base:bookworm -t agiledart/peer:local docker/
#
# The image is a minimal Debian (minbase) with python3 and venv support, plus
# Mosquitto for the image's `broker` target. The root file system is cached as a tarball
# under $AGILEDART_CACHE (default ~/.cache/agiledart): when the image is gone (a pruned or
# fresh docker) it is imported again in seconds; --rebuild makes it anew.
set -euo pipefail

SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
ARCH=$(dpkg --print-architecture 2>/dev/null || uname -m)
TAG=""
REBUILD=0
PACKAGES=python3,python3-venv,mosquitto,ca-certificates

usage() {
    cat <<EOF
usage: $0 [--tag IMAGE] [--suite SUITE] [--mirror URL] [--arch ARCH] [--rebuild]

  --tag IMAGE    image to create (default agiledart/base:SUITE)
  --suite SUITE  Debian release (default $SUITE; \$DEBIAN_SUITE)
  --mirror URL   Debian mirror (default $MIRROR; \$DEBIAN_MIRROR)
  --arch ARCH    architecture (default $ARCH; another one needs qemu-user-static)
  --rebuild      run debootstrap again even if the image or a cached tarball exists
EOF
}

while (($#)); do
    case $1 in
        --tag) TAG=$2; shift 2 ;;
        --suite) SUITE=$2; shift 2 ;;
        --mirror) MIRROR=$2; shift 2 ;;
        --arch) ARCH=$2; shift 2 ;;
        --rebuild) REBUILD=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
TAG=${TAG:-agiledart/base:$SUITE}
CACHE=${AGILEDART_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agiledart}/docker
TARBALL=$CACHE/base-$SUITE-$ARCH-$(echo "$PACKAGES" | md5sum | cut -c1-8).tar

if ((!REBUILD)) && docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "base image $TAG exists (--rebuild to make it anew)"
    exit 0
fi

if ((REBUILD)) || [ ! -s "$TARBALL" ]; then
    command -v debootstrap >/dev/null || { echo "needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }
    mkdir -p "$CACHE"
    ROOT=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$ROOT"' EXIT
    echo "debootstrap $SUITE ($ARCH) from $MIRROR with $PACKAGES ..."
    debootstrap --variant=minbase --arch="$ARCH" --include="$PACKAGES" \
        "$SUITE" "$ROOT" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
        tail -20 "$CACHE/debootstrap.log" >&2
        exit 1
    }
    # what a container never needs: package lists and caches, docs, man pages, locales
    rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb \
        "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* \
        "$ROOT"/var/log/*.log "$ROOT"/var/cache/debconf/*-old
    find "$ROOT"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'C.*' -exec rm -rf {} +
    echo "deb $MIRROR $SUITE main" >"$ROOT"/etc/apt/sources.list
    tar --numeric-owner -C "$ROOT" -cf "$TARBALL.part" .
    mv "$TARBALL.part" "$TARBALL"
    rm -rf "$ROOT"
    trap - EXIT
fi

docker import \
    --change 'LABEL org.agiledart.image=base' \
    --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    "$TARBALL" "$TAG" >/dev/null
echo "base image $TAG ($(du -h "$TARBALL" | cut -f1) root file system, cached in $TARBALL)"
