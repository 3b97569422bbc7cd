"""The control groups' CPU quota and memory limit, read from trees laid out as Linux lays out /proc and
/sys/fs/cgroup for the usual containers (Docker on cgroup v1 and v2, a Kubernetes pod), and from this host."""

from pipeline.cgroups import cpu_quota, group_dirs, memory_headroom

MIB, GIB = 2**20, 2**30
V2_MOUNT = "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"


def lay_out(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_docker_on_cgroup_v2_its_cpus_and_memory_limit(tmp_path):
    root = lay_out(tmp_path, {  # docker run --cpus 1.5 --memory 4g: a namespace of its own, its group at the mount
        "proc/self/cgroup": "0::/\n", "proc/self/mountinfo": V2_MOUNT,
        "sys/fs/cgroup/cpu.max": "150000 100000\n", "sys/fs/cgroup/memory.max": f"{4 * GIB}\n",
        "sys/fs/cgroup/memory.current": f"{GIB}\n",
        "sys/fs/cgroup/memory.stat": f"anon {512 * MIB}\nfile {512 * MIB}\ninactive_file {256 * MIB}\n"})
    assert group_dirs("memory", root) == [root / "sys/fs/cgroup"]
    assert cpu_quota(root) == 1.5
    assert memory_headroom(root) == 3 * GIB + 256 * MIB  # the inactive page cache is given back first


def test_a_kubernetes_pods_limits_bind_its_containers_that_set_none(tmp_path):
    pod = "sys/fs/cgroup/kubepods/pod1"
    root = lay_out(tmp_path, {
        "proc/self/cgroup": "0::/kubepods/pod1/ctr\n", "proc/self/mountinfo": V2_MOUNT,
        f"{pod}/ctr/cpu.max": "max 100000\n", f"{pod}/ctr/memory.max": "max\n", f"{pod}/ctr/memory.current": f"{GIB}\n",
        f"{pod}/cpu.max": "200000 100000\n", f"{pod}/memory.max": f"{2 * GIB}\n", f"{pod}/memory.current": f"{GIB}\n",
        "sys/fs/cgroup/cpu.max": "400000 100000\n"})  # a looser one higher up
    assert group_dirs("cpu", root) == [root / pod / "ctr", root / pod, root / "sys/fs/cgroup/kubepods", root / "sys/fs/cgroup"]
    assert cpu_quota(root) == 2.0
    assert memory_headroom(root) == GIB


def test_docker_on_cgroup_v1_without_a_namespace_reads_its_group_at_each_controllers_mount(tmp_path):
    group = "/docker/0123abcd"
    root = lay_out(tmp_path, {
        "proc/self/cgroup": f"12:memory:{group}\n3:cpu,cpuacct:{group}\n1:name=systemd:{group}\n0::/\n",
        "proc/self/mountinfo":  # the mounts' own root is the container's group; a v2 hierarchy beside holds no controller
            f"33 25 0:28 {group} /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
            f"35 25 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
            f"37 25 0:32 {group} /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{GIB}\n",
        "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{900 * MIB}\n",  # v1 counts the page cache in usage
        "sys/fs/cgroup/memory/memory.stat": f"cache {400 * MIB}\ninactive_file 1\ntotal_inactive_file {100 * MIB}\n"})
    assert group_dirs("memory", root) == [root / "sys/fs/cgroup/memory"]
    assert cpu_quota(root) == 0.5
    assert memory_headroom(root) == 224 * MIB


def test_no_limit_set_or_no_cgroup_files_reads_as_none(tmp_path):
    unlimited = lay_out(tmp_path / "host", {
        "proc/self/cgroup": "4:memory:/user.slice\n2:cpu,cpuacct:/\n",
        "proc/self/mountinfo": "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
                               "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/memory/user.slice/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/user.slice/memory.usage_in_bytes": f"{GIB}\n"})
    assert (cpu_quota(unlimited), memory_headroom(unlimited)) == (None, None)
    assert group_dirs("memory", tmp_path / "bare") == [] and cpu_quota(tmp_path / "bare") is None
    outside = lay_out(tmp_path / "outside", {  # a group outside the mount's root cannot be reached from here
        "proc/self/cgroup": "0::/elsewhere\n",
        "proc/self/mountinfo": "30 24 0:26 /mine /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"})
    assert group_dirs("cpu", outside) == []


def test_this_hosts_groups_read_without_error():
    quota, headroom = cpu_quota(), memory_headroom()
    assert quota is None or quota > 0
    assert headroom is None or headroom >= 0


def test_files_this_reader_does_not_know_read_as_no_limit_rather_than_an_error(tmp_path):
    root = lay_out(tmp_path, {
        "proc/self/cgroup": "0::/\n", "proc/self/mountinfo": V2_MOUNT,
        "sys/fs/cgroup/cpu.max": "150000\n", "sys/fs/cgroup/memory.max": "lots\n",
        "sys/fs/cgroup/memory.current": "1\n", "sys/fs/cgroup/memory.stat": "inactive_file ?\n"})
    assert (cpu_quota(root), memory_headroom(root)) == (None, None)
