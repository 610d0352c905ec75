"""`tools/launch cluster.yaml --emit slurm`: the batch script that runs a job
under Slurm instead of the launcher (docs/clusters.md, "Slurm").

One job of P + W tasks and one `srun` step over all of them, each task
running `pstrain --cluster <resolved file>` with no --role: pstrain learns
its role from SLURM_PROCID, the first P tasks being the servers. Where the
workers use GPUs the job is heterogeneous: component 0 holds the P CPU-only
server tasks, component 1 the W worker tasks with --gpus-per-task=1, and
`srun --het-group=0,1` runs one step over both, numbering the tasks across
them (SLURM_PROCID 0..P+W-1), which a single homogeneous step cannot do with
GPUs for some tasks only (--multi-prog picks programs per task, not
resources).

The launcher's failure behaviour, as far as Slurm allows: a task that fails
ends the step (--kill-on-bad-exit=1), and the script reruns the step up to
--max-restarts times after the launcher's backoff (base, 2 base, ... capped
at 30 s), the servers with `--restore latest` so they continue from their
newest checkpoint, the workers with their own command again. A step's
failure after the last restart fails the job with srun's exit code.
Unlike the launcher, one failed task restarts the whole step, and
train.on_worker_loss: continue does not keep a step alive past a worker's
failure (Slurm ends the step on any task's failure).

Every task of one job shares a run id, the job id in hex, so the servers
refuse a stale process of another job of the same file.
"""

import shlex

from .cluster_config import EmitError, scheduled_device


def role_count(section, role):
    """The number of processes of a resolved `ps` or `workers` section: a
    list of processes, or {count: N} where the scheduler gives the hosts."""
    if isinstance(section, list):
        return len(section)
    if isinstance(section, dict) and "count" in section:
        return int(section["count"])
    raise EmitError(f"{role}: Slurm needs a number of processes (a list or {{count: N}}), "
                    f"got {section!r}")


def script(cfg, binary, cluster_file, run_dir, workdir, delays):
    """The batch script's text for the resolved config `cfg`, whose file
    (with run_dir set) is at `cluster_file`; all paths absolute. `delays`:
    the seconds before each restart of the step (tools/launch's backoff),
    as many as --max-restarts."""
    if cfg.get("security", {}).get("curve") == "true":
        raise EmitError("security.curve: --emit slurm does not hand out CURVE keys yet; "
                        "run without it or with tools/launch")
    gpus = scheduled_device(cfg["workers"], "Slurm") == "cuda"
    ps = role_count(cfg["ps"], "ps")
    workers = role_count(cfg["workers"], "workers")
    tasks = ps + workers
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# pstrain job {cfg['job']} under Slurm: {ps} ps + {workers} workers "
        f"({'GPU' if gpus else 'CPU'} workers), emitted by tools/launch --emit slurm.",
        f"#SBATCH --job-name={cfg['job']}",
        f"#SBATCH --chdir={workdir}",
        f"#SBATCH --output={run_dir}/slurm-%j.out",
    ]
    if gpus:
        lines += [
            "# Component 0: the servers, CPU only; component 1: one GPU per worker.",
            f"#SBATCH --ntasks={ps}",
            "#SBATCH hetjob",
            f"#SBATCH --ntasks={workers} --gpus-per-task=1",
        ]
        step = ["srun", "--het-group=0,1"]
    else:
        lines.append(f"#SBATCH --ntasks={tasks}")
        step = ["srun", f"--ntasks={tasks}"]
    # --label prefixes each line with its task number; --kill-on-bad-exit
    # ends the step as soon as one task fails, so a failure is not waited out.
    step += ["--kill-on-bad-exit=1", "--label"]
    command = [binary, "--cluster", cluster_file]
    lines += [
        "",
        "set -u",
        f"delays=({' '.join(f'{d:g}' for d in delays)})  # before each restart of the step",
        "run_id=$(printf '%x' \"$SLURM_JOB_ID\")",
        f"step=({' '.join(q(a) for a in step)})",
        f"pstrain=({' '.join(q(a) for a in command)} --run-id \"$run_id\")",
        "",
        "\"${step[@]}\" \"${pstrain[@]}\"",
        "code=$?",
        "restart=0",
        "while [ \"$code\" -ne 0 ] && [ \"$restart\" -lt \"${#delays[@]}\" ]; do",
        "  delay=${delays[$restart]}",
        "  restart=$((restart + 1))",
        "  echo \"pstrain: step exited with $code; restart $restart of ${#delays[@]} "
        "in $delay s, the servers with --restore latest\" >&2",
        "  sleep \"$delay\"",
        f"  # Tasks 0..{ps - 1} are the servers: they continue from their newest checkpoint.",
        "  \"${step[@]}\" /bin/sh -c "
        f"'if [ \"$SLURM_PROCID\" -lt {ps} ]; then exec \"$@\" --restore latest; "
        "else exec \"$@\"; fi' sh \"${pstrain[@]}\"",
        "  code=$?",
        "done",
        "exit \"$code\"",
        "",
    ]
    return "\n".join(lines)
