#!/usr/bin/env bash
# A container's limits without a container: a control group of its own (root, cgroup v1 or v2) with a
# CPU quota and a memory limit, then `doctor` and a CPU fine-tune of gpt2-large inside it.
#   sudo bash docs/journal/probes/containers/limits.sh [CPUS] [MEMORY_GIB] [CLI]
set -euo pipefail
cpus=${1:-1.5}; gib=${2:-6}; cli=${3:-.venv/bin/gpt2-deploy}
quota=$(python3 -c "print(int($cpus * 100000))"); bytes=$((gib * 1024 * 1024 * 1024))
name=gpt2deploy-limits-$$
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # v2: one hierarchy
  parent=/sys/fs/cgroup; echo "+cpu +memory" > $parent/cgroup.subtree_control 2>/dev/null || true
  groups=($parent/$name); mkdir ${groups[0]}
  echo "$quota 100000" > ${groups[0]}/cpu.max; echo $bytes > ${groups[0]}/memory.max
else  # v1: a hierarchy a controller, the memory group under this process's own
  groups=(/sys/fs/cgroup/cpu/$name "/sys/fs/cgroup/memory$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)/$name")
  mkdir "${groups[@]}"
  echo $quota > ${groups[0]}/cpu.cfs_quota_us; echo 100000 > ${groups[0]}/cpu.cfs_period_us
  echo $bytes > ${groups[1]}/memory.limit_in_bytes
fi
work=$(mktemp -d)
trap 'for g in "${groups[@]}"; do rmdir "$g" 2>/dev/null || true; done; rm -rf "$work"' EXIT
# run a command inside the groups: the shell joins them, then becomes the command
printf '%s\n' '#!/usr/bin/env bash' "for g in ${groups[*]}; do echo \$\$ > \$g/cgroup.procs; done" 'exec "$@"' > $work/inside
echo "== $cpus CPUs, $gib GiB"
bash $work/inside $cli doctor 2>&1 | grep -E "│ (cpu|memory) " || true
/usr/bin/time -f "%e s, peak %M KB" bash $work/inside $cli finetune --preset gpt2-large --artifacts $work --run large \
  --set train.device=cpu --set train.steps=1 --set train.warmup_steps=0 --set train.batch_size=1 2>&1 | grep -v "%|" | tail -3 || true
