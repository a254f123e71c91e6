"""Step time and its breakdown of one config on each launcher: `make run` (local), and `make up` submitted to a real
three-node Slurm cluster on this machine (deploy/slurm/testcluster.py) with every service on one node, then spread
over three (trainer ranks on node2 and node3, the rest on node1). Variants alternate over --rounds, so a slow spell of
the machine falls on all; each is the median of its steps after the first, and each over local's.

    .venv/bin/python bench/multinode.py --config deploy/configs/local.toml --steps 8 --rounds 2 \\
        --args model.create=true --out /tmp/multinode_toy.json

The nodes are namespaces of one machine sharing its cores: what spreading costs here is the network path between
nodes (a veth bridge instead of loopback, hostnames instead of 127.0.0.1), not a gain of hardware.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provenance import write_result  # noqa: E402 - bench/ is this script's own folder
from step_ab import medians, run  # noqa: E402 - bench/ is this script's own folder

from deploy.slurm import testcluster  # noqa: E402

SLURM = {
    "slurm_1_node": ["placement.num_nodes=1"],
    "slurm_3_nodes": ["placement.num_nodes=3", "placement.trainer_nodes=[1,2]"],
}


def slurm_run(c: testcluster.TestCluster, config: Path, overrides: list[str], work: Path, name: str) -> list[dict]:
    args = [*overrides, f"run.output_dir={work}", f"run.run_id={name}"]
    up = c.run("ctl", "make", "-s", "-C", str(REPO), "up", f"CONFIG={config}", f"ARGS={' '.join(args)}",
               timeout_s=600)  # fmt: skip
    if up.returncode != 0:
        raise RuntimeError(f"{name}: make up failed:\n{up.stdout[-2000:]}\n{up.stderr[-2000:]}")
    job = re.search(r"submitted batch job (\d+)", up.stdout).group(1)
    while c.run("ctl", "squeue", "--noheader", f"--jobs={job}").stdout.strip():
        time.sleep(2)
    out = (work / name / f"slurm-{job}.out").read_text(errors="replace")
    if "ended: RUN_STATE_DONE" not in out:
        raise RuntimeError(f"{name}: the job did not finish its run:\n{out[-3000:]}")
    rows = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "timing/total_s" in r]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--args", nargs="*", default=[], help="overrides for every variant")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    base = [f"run.num_steps={args.steps}", "run.train_minutes=0", "run.eval_every=0", "run.save_every=0"]
    base += ["trainer.num_ranks=2", *args.args]
    work = Path(tempfile.mkdtemp(prefix="multinode-"))
    cluster = testcluster.up(work / "cluster", num_nodes=3)
    steps: dict[str, list[dict]] = {"local": [], **{name: [] for name in SLURM}}
    try:
        for i in range(args.rounds):
            steps["local"] += run(Path(args.config), base, work, f"local{i}")
            for name, overrides in SLURM.items():
                steps[name] += slurm_run(cluster, Path(args.config).resolve(), [*base, *overrides], work, f"{name}{i}")
            print(i, {name: medians(rows) for name, rows in steps.items()}, flush=True)
    finally:
        testcluster.down(work / "cluster")
    median = {name: medians(rows) for name, rows in steps.items()}
    local = median["local"]
    result = {
        "config": args.config,
        "variants": {
            name: {"overrides": (base if name == "local" else [*base, *SLURM[name]]), "median": m}
            for name, m in median.items()
        },
        "over_local": {
            name: {k: round(m[k] / local[k], 3) for k in local if k in m and local[k]} for name, m in median.items()
        },  # fmt: skip
        "steps_per_variant": args.steps * args.rounds,
        "not_run": {
            "docker_compose": "no image built here yet (issue #38, item 2)",
            "ray": "no Ray backend yet (issue #38, item 3)",
        },
        "note": "three Slurm nodes = three network namespaces of this one machine, sharing its 2 cores",
    }
    write_result(args.out, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
