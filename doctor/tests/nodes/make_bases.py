#!/usr/bin/env python3
"""Writes the two healthy recorded nodes the problem nodes build on (docs/doctor.md,
"Recorded nodes"):

* healthy-h100-ib   — an HGX H100 node as sysfs shows it: 2 sockets, 8 H100 SXM GPUs and 8
                      ConnectX-7 (MT4129) InfiniBand NICs, each GPU with its NIC under one PCIe
                      switch (PIX), Gen5 x16 links, nvidia_peermem loaded, PeerMappingOverride=1,
                      IOMMU off, memlock unlimited, libmlx5 up to MLX5_1.25;
* healthy-h100-roce — the same node with RoCE ports: GID table (link-local v1/v2, IPv4 v1/v2 at
                      index 3), one /24 per rail and a routed 10.0.0.0/16 on every rail.

The layout follows a typical HGX H100 board; bus numbers are invented. Re-run after changing
it:  python3 doctor/tests/nodes/make_bases.py
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def q(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_dump(vendor, device, port_type, devcap2, devctl2):
    """lspci -x style config space: header, capability pointer 0x40, PCIe capability there."""
    b = [0] * 0x70
    b[0:4] = [vendor & 0xFF, vendor >> 8, device & 0xFF, device >> 8]
    b[0x34] = 0x40
    b[0x40] = 0x10  # PCIe capability, last in the list
    b[0x42] = 0x02 | (port_type << 4)
    for i in range(4):
        b[0x40 + 0x24 + i] = (devcap2 >> (8 * i)) & 0xFF
    b[0x40 + 0x28] = devctl2 & 0xFF
    b[0x40 + 0x29] = devctl2 >> 8
    lines = []
    for off in range(0, len(b), 16):
        lines.append("%02x: %s" % (off, " ".join("%02x" % x for x in b[off : off + 16])))
    return "\n".join(lines) + "\n"


ROUTING = 1 << 6
COMP64 = 1 << 8
REQUESTER = 1 << 6


def pairs():
    """(k, host bridge, numa, root port, upstream, gpu port, nic port, gpu, nic)."""
    for k in range(8):
        socket = k // 4
        hb = "pci0000:%02x" % (0x00 if socket == 0 else 0x80)
        base = (0x10 if socket == 0 else 0x90) + 0x10 * (k % 4)
        rp = "0000:%02x:%02x.0" % (0x00 if socket == 0 else 0x80, k % 4 + 1)
        up = "0000:%02x:00.0" % base
        dpg = "0000:%02x:00.0" % (base + 1)
        dpn = "0000:%02x:01.0" % (base + 1)
        gpu = "0000:%02x:00.0" % (base + 2)
        nic = "0000:%02x:00.0" % (base + 3)
        yield k, hb, socket, rp, up, dpg, dpn, gpu, nic


def ib_node():
    sysfs, links, devices = {}, {}, {}
    gpus = []
    for k, hb, numa, rp, up, dpg, dpn, gpu, nic in pairs():
        gpu_path = "/sys/devices/%s/%s/%s/%s/%s" % (hb, rp, up, dpg, gpu)
        nic_path = "/sys/devices/%s/%s/%s/%s/%s" % (hb, rp, up, dpn, nic)
        for bdf, path in [
            (rp, "/sys/devices/%s/%s" % (hb, rp)),
            (up, "/sys/devices/%s/%s/%s" % (hb, rp, up)),
            (dpg, "/sys/devices/%s/%s/%s/%s" % (hb, rp, up, dpg)),
            (dpn, "/sys/devices/%s/%s/%s/%s" % (hb, rp, up, dpn)),
            (gpu, gpu_path),
            (nic, nic_path),
        ]:
            links["/sys/bus/pci/devices/" + bdf] = path
        for bdf, vendor, dev, ptype, cap2, ctl2 in [
            (rp, 0x8086, 0x352A, 4, ROUTING, 0),
            (up, 0x1000, 0xC030, 5, ROUTING, 0),
            (dpg, 0x1000, 0xC030, 6, ROUTING, 0),
            (dpn, 0x1000, 0xC030, 6, ROUTING, 0),
            (gpu, 0x10DE, 0x2330, 0, COMP64, 0),
            (nic, 0x15B3, 0x1021, 0, COMP64, REQUESTER),
        ]:
            sysfs["/sys/bus/pci/devices/%s/config" % bdf] = config_dump(vendor, dev, ptype, cap2, ctl2)
        for bdf in (gpu, nic):
            d = "/sys/bus/pci/devices/" + bdf
            sysfs[d + "/numa_node"] = str(numa)
            sysfs[d + "/current_link_speed"] = "32.0 GT/s PCIe"
            sysfs[d + "/max_link_speed"] = "32.0 GT/s PCIe"
            sysfs[d + "/current_link_width"] = "16"
            sysfs[d + "/max_link_width"] = "16"
        ib = "/sys/class/infiniband/mlx5_%d" % k
        links[ib + "/device"] = nic_path
        links[nic_path + "/driver"] = "/sys/bus/pci/drivers/mlx5_core"
        sysfs[ib + "/hca_type"] = "MT4129"
        sysfs[ib + "/fw_ver"] = "28.39.1002"
        sysfs[ib + "/node_type"] = "1: CA"
        port = ib + "/ports/1"
        sysfs[port + "/state"] = "4: ACTIVE"
        sysfs[port + "/phys_state"] = "5: LinkUp"
        sysfs[port + "/link_layer"] = "InfiniBand"
        sysfs[port + "/rate"] = "400 Gb/sec (4X NDR)"
        sysfs[port + "/gids/0"] = "fe80:0000:0000:0000:a088:c203:00%02x:%04x" % (k, 0x1000 + k)
        sysfs["/sys/class/infiniband_verbs/uverbs%d/ibdev" % k] = "mlx5_%d" % k
        devices["/dev/infiniband/uverbs%d" % k] = {"mode": 0o666, "uid": 0, "gid": 0, "read_write": True}
        gpus.append((k, gpu))
    return sysfs, links, devices, gpus


def write_toml_table(f, name, table):
    f.write("\n[%s]\n" % name)
    for key in sorted(table):
        value = table[key]
        if "\n" in value:
            f.write('%s = """\n%s"""\n' % (q(key), value))
        else:
            f.write("%s = %s\n" % (q(key), q(value)))


def write_node(dir_name, description, sysfs, links, devices, extra=""):
    d = os.path.join(HERE, dir_name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "node.toml"), "w") as f:
        f.write("# Generated by make_bases.py: edit the script, not this file.\n")
        f.write("description = %s\n" % q(description))
        f.write(extra)
        write_toml_table(f, "sysfs", sysfs)
        write_toml_table(f, "links", links)
        if devices:
            f.write("\n[devices]\n")
            for key in sorted(devices):
                v = devices[key]
                f.write("%s = { mode = 0o%o, uid = %d, gid = %d, read_write = %s }\n" % (
                    q(key), v["mode"], v["uid"], v["gid"], "true" if v["read_write"] else "false"))
    return d


def write_file(d, rel, text):
    p = os.path.join(d, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(text)


def devinfo(link_layer, roce):
    out = []
    for k in range(8):
        out.append("hca_id:\tmlx5_%d\n" % k)
        out.append("\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t28.39.1002\n")
        out.append("\tvendor_id:\t\t\t0x02c9\n\tvendor_part_id:\t\t\t4129\n\tphys_port_cnt:\t\t\t1\n")
        out.append("\tmax_qp:\t\t\t\t131072\n\tmax_qp_wr:\t\t\t32768\n\tmax_cq:\t\t\t\t16777216\n")
        out.append("\tmax_cqe:\t\t\t4194303\n\tmax_mr:\t\t\t\t16777216\n")
        out.append("\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\t\tmax_mtu:\t\t4096 (5)\n")
        out.append("\t\t\tactive_mtu:\t\t4096 (5)\n\t\t\tlink_layer:\t\t%s\n" % link_layer)
        out.append("\t\t\tphys_state:\t\tLINK_UP (5)\n\n")
    return "".join(out)


def main():
    sysfs, links, devices, gpus = ib_node()
    extra = (
        '\n[host]\nhostname = "hgx-h100-ib"\nroot = false\n'
        '\n[libs."libmlx5.so.1"]\npath = "/usr/lib/x86_64-linux-gnu/libmlx5.so.1.25.50.0"\n'
        "versions = [%s]\n" % ", ".join(q("MLX5_1.%d" % i) for i in range(26))
    )
    d = write_node("healthy-h100-ib", "HGX H100: 8 GPUs, 8 ConnectX-7 NDR InfiniBand NICs, one per GPU on its PCIe switch", sysfs, links, devices, extra)
    with open(os.path.join(d, "nvml.toml"), "w") as f:
        f.write("# Generated by make_bases.py.\nsource = \"NVML, driver 550.54.15; CUDA driver, 8 devices\"\n")
        for k, bdf in gpus:
            f.write('\n[[gpu]]\nindex = %d\nname = "NVIDIA H100 80GB HBM3"\nuuid = "GPU-4f1c2a%02d-0b5e-11ee-9a3c-%012x"\nbus_id = "%s"\ndma_buf = true\n' % (k, k, 0xA0 + k, bdf))
    write_file(d, "ibv_devinfo.txt", devinfo("InfiniBand", False))
    write_file(d, "root/proc/modules", "".join("%s 16384 0 - Live 0x0000000000000000\n" % m for m in [
        "nvidia_peermem", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia", "mlx5_ib", "ib_uverbs", "ib_core", "mlx5_core"]))
    write_file(d, "root/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc version 12.3.0\n")
    write_file(d, "root/proc/driver/nvidia/params", "ResmanDebugLevel: 4294967295\nEnableMSI: 1\nRegistryDwords: \"PeerMappingOverride=1;\"\nRegistryDwordsPerDevice: \"\"\n")
    write_file(d, "root/etc/modprobe.d/nvidia-peermapping.conf", "options nvidia NVreg_RegistryDwords=\"PeerMappingOverride=1;\"\n")
    write_file(d, "root/proc/sys/kernel/osrelease", "5.15.0-105-generic\n")
    write_file(d, "root/proc/cmdline", "BOOT_IMAGE=/vmlinuz-5.15.0-105-generic root=/dev/md0 ro\n")
    write_file(d, "root/proc/self/status", "Name:\teptwin\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000000000\n")
    write_file(d, "root/proc/self/limits", "Limit                     Soft Limit           Hard Limit           Units\nMax locked memory         unlimited            unlimited            bytes\n")
    write_file(d, "root/proc/1/cgroup", "0::/init.scope\n")
    write_file(d, "root/proc/cpuinfo", "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\nflags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep\n")

    # RoCE: the same node, Ethernet ports with a GID table, one routed subnet per rail.
    roce = {}
    for k in range(8):
        port = "/sys/class/infiniband/mlx5_%d/ports/1" % k
        roce[port + "/link_layer"] = "Ethernet"
        roce[port + "/rate"] = "400 Gb/sec (4X)"
        mac = "a288:c2ff:fe%02x:%04x" % (k, 0x1000 + k)
        ip = "0a00:%02x0b" % k  # 10.0.k.11
        for idx, (gid, kind) in enumerate([
            ("fe80:0000:0000:0000:" + mac, "IB/RoCE v1"),
            ("fe80:0000:0000:0000:" + mac, "RoCE v2"),
            ("0000:0000:0000:0000:0000:ffff:" + ip[:4] + ":" + ip[5:], "IB/RoCE v1"),
            ("0000:0000:0000:0000:0000:ffff:" + ip[:4] + ":" + ip[5:], "RoCE v2"),
        ]):
            roce[port + "/gids/%d" % idx] = gid
            roce[port + "/gid_attrs/types/%d" % idx] = kind
            roce[port + "/gid_attrs/ndevs/%d" % idx] = "rdma%d" % k
    d = write_node("healthy-h100-roce", "HGX H100 with 8 ConnectX-7 RoCE NICs: one /24 per rail, 10.0.0.0/16 routed on every rail", roce, {}, {},
                   '\nbase = "../healthy-h100-ib"\n\n[host]\nhostname = "hgx-h100-roce"\n')
    write_file(d, "ibv_devinfo.txt", devinfo("Ethernet", True))
    route = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
    route.append("eno1\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0")
    route.append("eno1\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0")
    for k in range(8):
        net = "00%02X000A" % k  # 10.0.k.0, little-endian hex
        gw = "01%02X000A" % k  # 10.0.k.1
        route.append("rdma%d\t%s\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0" % (k, net))
        route.append("rdma%d\t0000000A\t%s\t0003\t0\t0\t%d\t0000FFFF\t0\t0\t0" % (k, gw, 100 + k))
    write_file(d, "root/proc/net/route", "\n".join(route) + "\n")


if __name__ == "__main__":
    main()
