#!/bin/sh
# PID 1 of the test guest (tests/vm/build.sh packs it as /init): mount the pseudo file systems and the
# unified cgroup v2 hierarchy, load the 9p modules, mount the host's shares, run the job, power off.
#
# Kernel command line, written by tests/vm/guest.py:
#   topolet.share=<tag>:<guest path>:<ro|rw>   one per 9p share (paths hold no spaces or colons)
#   topolet.job=<guest path>                   a shared folder holding run.sh; the init writes there
#                                               started/finished (guest uptime), rc and output.log
#   topolet.net=user                           bring up qemu's user network (slirp): eth0 10.0.2.15/24,
#                                               default route via 10.0.2.2 (the host's loopback)
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /run /tmp
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
# Only v2: the whole point of this guest.  nsdelegate as systemd mounts it.
mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup
ip link set lo up

while read -r ko; do
    insmod "$ko" || echo "init: insmod $ko failed" >/dev/console
done </etc/topolet-vm/modules

job=
net=
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        topolet.share=*)
            spec=${arg#topolet.share=}
            tag=${spec%%:*}
            rest=${spec#*:}
            where=${rest%:*}
            mode=${rest##*:}
            # The read-only shares (repo, interpreter) never change under the guest: cache them.
            opts=trans=virtio,version=9p2000.L,msize=512000
            if [ "$mode" = ro ]; then opts=$opts,ro,cache=loose; else opts=$opts,cache=none; fi
            mkdir -p "$where"
            mount -t 9p -o "$opts" "$tag" "$where" || echo "init: cannot mount $tag on $where" >/dev/console
            ;;
        topolet.job=*)
            job=${arg#topolet.job=}
            ;;
        topolet.net=user)
            net=user
            ;;
    esac
done

if [ "$net" = user ]; then
    # slirp's fixed addresses; a default route too, where the kubelet finds the node's address.
    dev=$(ls /sys/class/net | grep -v '^lo$' | head -n 1)
    if [ -n "$dev" ]; then
        ip link set "$dev" up
        ip addr add 10.0.2.15/24 dev "$dev"
        ip route add default via 10.0.2.2
    else
        echo "init: topolet.net=user but no network card" >/dev/console
    fi
fi

if [ -n "$job" ] && [ -f "$job/run.sh" ]; then
    cut -d' ' -f1 /proc/uptime >"$job/started"
    sh "$job/run.sh" >"$job/output.log" 2>&1
    echo $? >"$job/rc"
    cut -d' ' -f1 /proc/uptime >"$job/finished"
else
    echo "init: no job (topolet.job=$job)" >/dev/console
fi
sync
# Power off at once (qemu exits); the rootfs is RAM, nothing to unmount.
echo o >/proc/sysrq-trigger
sleep 10
