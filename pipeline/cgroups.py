"""What the process's control groups (Linux cgroup v1 or v2) allow it: a CPU quota and a memory limit.

A container's `--cpus` and `--memory` (Kubernetes' resource limits) are set there, not in the
affinity or /proc/meminfo the host reports, so counts and checks taken from those alone overshoot:
one ONNX Runtime thread per host core under a 2-CPU quota is throttled, and a fine-tune the host's
memory would hold is killed at the container's limit. A limit set on an enclosing group (a
Kubernetes pod's) binds as well, so each reader takes the tightest from the process's group up to
the hierarchy's mount. Everything reads as "no limit" (None) where the files are not there."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

NO_LIMIT_V1 = 2**62  # cgroup v1 writes "no memory limit" as the largest page-aligned 63-bit value


def _unescape(field: str) -> str:
    """/proc/self/mountinfo writes a space, tab, newline or backslash in a path as an octal escape."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def group_dirs(controller: str, root: Path = Path("/")) -> list[Path]:
    """The directories of the process's `controller` group ("cpu", "memory"), its own first, then
    each enclosing one up to the hierarchy's mount; [] where it is not mounted or not readable. root:
    the filesystem root the /proc and cgroup files are read under (tests give a tree laid out as Linux does)."""
    try:
        membership = (root / "proc/self/cgroup").read_text(encoding="utf-8").splitlines()
        mounts = (root / "proc/self/mountinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    paths: dict[str, str] = {}  # controller -> the process's group path; "" for v2's one hierarchy
    for line in membership:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(",") if parts[1] else [""]:
                paths[name] = parts[2]
    for line in mounts:
        fields, _, tail = line.partition(" - ")
        fields, tail = fields.split(), tail.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        # v1 mounts a hierarchy per controller; v2 has one, where a controller v1 does not hold lives
        if fstype == "cgroup" and controller in options:
            path = paths.get(controller)
        elif fstype == "cgroup2" and controller not in paths:
            path = paths.get("")
        else:
            continue
        if path is None:
            continue
        mount_root, mount_point = PurePosixPath(_unescape(fields[3])), _unescape(fields[4])
        try:  # without a cgroup namespace the mount's own root is the container's group (Docker on v1)
            below = PurePosixPath(path).relative_to(mount_root)
        except ValueError:
            return []
        top = root / mount_point.lstrip("/")
        dirs = [top / below]
        while dirs[-1] != top:
            dirs.append(dirs[-1].parent)
        return dirs
    return []


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _stat(path: Path, key: str) -> int:
    """One counter of a memory.stat file (0 where it is absent)."""
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.isdigit():
            return int(value)
    return 0


def cpu_quota(root: Path = Path("/")) -> float | None:
    """CPUs' worth of time the process's groups allow it a period (1.5 for `--cpus 1.5`), the
    tightest of them; None where none sets a quota."""
    quotas = []
    for d in group_dirs("cpu", root):
        v2 = _read(d / "cpu.max")  # "max 100000" or "150000 100000"
        try:
            quota, period = v2.split() if v2 else (_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us"))
            if quota and period and quota not in ("max", "-1") and int(period) > 0:
                quotas.append(int(quota) / int(period))
        except ValueError:  # a file this reader does not know: no limit it can read there
            continue
    return min(quotas, default=None)


def memory_headroom(root: Path = Path("/")) -> int | None:
    """Bytes the process's groups let it take beyond what they use now, the tightest of them; None
    where none sets a limit. What a group uses counts its page cache, of which the inactive part is
    given back before the limit bites (Kubernetes' working set), so that part counts as free."""
    headrooms = []
    for d in group_dirs("memory", root):
        v2 = _read(d / "memory.max")
        if v2 is not None:
            limit, used, idle = v2, _read(d / "memory.current"), _stat(d / "memory.stat", "inactive_file")
        else:
            limit, used = _read(d / "memory.limit_in_bytes"), _read(d / "memory.usage_in_bytes")
            idle = _stat(d / "memory.stat", "total_inactive_file")
        try:
            if limit and used and limit != "max" and int(limit) < NO_LIMIT_V1:
                headrooms.append(max(0, int(limit) - int(used) + idle))
        except ValueError:
            continue
    return min(headrooms, default=None)
