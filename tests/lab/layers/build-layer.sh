# Sourced by tests/lab/build-*-layer: builds one cached overlay layer over the base tree.
# The caller sets:
#   name       the layer's directory under the cache (podman-bookworm, runtimes-bookworm)
#   packages   Debian packages to apt-get install into it (no recommends)
#   version    bumped when configure_layer changes what it writes
#   configure_layer   a shell function run with $merged (the layer over the base) mounted,
#                     after the install: the layer's own settings
# and calls build_layer "$@". A no-op while the layer's stamp matches base + packages +
# version; slow once (apt in a chroot, network needed), then cached for every lab.
set -euo pipefail

build_layer() {
    local cache=${LAB_CACHE:-/var/cache/gpuops-lab}
    local base=$cache/base-bookworm
    layer=$cache/$name
    local force=0
    case "${1:-}" in
        "") ;;
        --force) force=1 ;;
        *) echo "build-$name: unknown argument '$1' (only --force)" >&2; exit 2 ;;
    esac
    [[ -f $base/.gpuops-lab-stamp ]] || { echo "build-$name: no base tree at $base: run build-base first" >&2; exit 1; }
    # The layer is only valid over the base it was built on.
    stamp="$(cat "$base/.gpuops-lab-stamp") + $packages $version"
    if ((force == 0)) && _layer_current; then
        return 0
    fi
    exec 9>"$cache/.build-${name%-bookworm}.lock"   # podman: the lock name build-podman-layer always took
    flock 9
    if ((force == 0)) && _layer_current; then
        return 0
    fi
    tmp=$cache/$name.building
    merged=$tmp/merged
    if [[ -d $tmp ]]; then
        _layer_unmount_all
        rm -rf --one-file-system "$tmp"
    fi
    trap _layer_unmount_all EXIT
    mkdir -p "$tmp/upper" "$tmp/work" "$merged"
    # The base may be a link to its current tree (build-base swaps trees): build on the tree.
    mount -t overlay overlay -o "lowerdir=$(readlink -f "$base"),upperdir=$tmp/upper,workdir=$tmp/work" "$merged"
    mount -t proc proc "$merged/proc"
    mount --bind /dev "$merged/dev"
    echo "build-$name: apt-get install $packages into $tmp (once; about a minute)" >&2
    local start=$SECONDS log=$cache/${name%-bookworm}-layer.log
    # The controller's resolver, for apt inside the chroot only (the node gets its own at boot).
    cp /etc/resolv.conf "$merged/etc/resolv.conf"
    # policy-rc.d: no package starts a daemon in the chroot (the node's systemd starts them).
    printf '#!/bin/sh\nexit 101\n' >"$merged/usr/sbin/policy-rc.d"
    chmod 755 "$merged/usr/sbin/policy-rc.d"
    chroot "$merged" sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $packages" \
        >"$log" 2>&1 || {
        echo "build-$name: apt-get failed, last lines of $log:" >&2
        tail -20 "$log" >&2
        exit 1
    }
    rm -f "$merged/usr/sbin/policy-rc.d"
    cp "$base/etc/resolv.conf" "$merged/etc/resolv.conf"
    rm -rf "$merged"/var/cache/apt/archives/*.deb "$merged"/var/lib/apt/lists/*
    configure_layer
    umount "$merged/dev" "$merged/proc" "$merged"
    trap - EXIT
    echo "$stamp" >"$tmp/upper/.gpuops-lab-layer-stamp"
    rm -rf "$layer"
    mv "$tmp/upper" "$layer"
    rm -rf "$tmp"
    echo "build-$name: done in $((SECONDS - start)) s: $layer ($(du -sh "$layer" | cut -f1))" >&2
}

_layer_current() {
    [[ -f $layer/.gpuops-lab-layer-stamp && "$(cat "$layer/.gpuops-lab-layer-stamp")" == "$stamp" ]]
}

_layer_unmount_all() {
    awk -v t="$tmp" '$5 == t || index($5, t "/") == 1 {print $5}' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l
}
